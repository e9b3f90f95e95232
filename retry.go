package relay

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// RetryConfig configures retries and fallbacks. Each retry goes to the next
// candidate: another upstream serving the model, then the route's fallback
// models in order.
type RetryConfig struct {
	// MaxAttempts is the number of upstream calls in all, the first one
	// included. If 0, 3; 1 disables retries.
	MaxAttempts int
	// InitialInterval is the first backoff wait. If 0, 100 ms.
	InitialInterval time.Duration
	// MaxInterval caps a backoff wait. If 0, 1.2 s.
	MaxInterval time.Duration
	// Multiplier grows the wait after each retry. If 0, 2.
	Multiplier float64
	// RandomizationFactor spreads each wait over [w·(1−f), w·(1+f)]. If 0,
	// 0.5; negative means no randomisation.
	RandomizationFactor float64
	// MaxRetryAfter caps the wait a server may ask for with retry-after-ms
	// or Retry-After. A response asking for longer is returned to the caller
	// at once instead of waited for. If 0, 8 s.
	MaxRetryAfter time.Duration
	// AttemptTimeout bounds each attempt's time to response headers. If 0,
	// no bound but the request's context.
	AttemptTimeout time.Duration
	// ShouldRetry decides whether an outcome may succeed elsewhere. If nil,
	// DefaultShouldRetry. It is never asked when the request's context
	// ended.
	ShouldRetry func(resp *http.Response, err error) bool
	// NewBackOff returns the backoff of one request. If nil,
	// DefaultBackOff(cfg) with this config's intervals. Server hints win
	// over it.
	NewBackOff func() backoff.BackOff
}

// DefaultShouldRetry retries what can succeed: connection errors (refused,
// reset, EOF before headers, per-attempt timeouts), 408, 409, 429, 500, 502,
// 503, 504, and any response carrying "x-should-retry: true". It never
// retries "x-should-retry: false", other 4xx, or a cancelled request.
func DefaultShouldRetry(resp *http.Response, err error) bool {
	if err != nil {
		return !errors.Is(err, context.Canceled) && !errors.Is(err, ErrBodyTooLarge)
	}
	if resp == nil {
		return false
	}
	switch resp.Header.Get("X-Should-Retry") {
	case "true":
		return true
	case "false":
		return false
	}
	switch resp.StatusCode {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooManyRequests,
		http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable,
		http.StatusGatewayTimeout:
		return true
	}
	return false
}

// DefaultBackOff returns the exponential backoff the router uses when
// RetryConfig.NewBackOff is nil: cfg's intervals (defaults filled in), no
// elapsed-time limit.
func DefaultBackOff(cfg RetryConfig) backoff.BackOff {
	cfg = cfg.withDefaults()
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = cfg.InitialInterval
	b.MaxInterval = cfg.MaxInterval
	b.Multiplier = cfg.Multiplier
	b.RandomizationFactor = max(cfg.RandomizationFactor, 0)
	b.MaxElapsedTime = 0
	b.Reset()
	return b
}

// RetryAfter returns the wait a response asks for: retry-after-ms first,
// then Retry-After in seconds or as an HTTP date (relative to now). ok is
// false when neither header holds a usable value; negative and unparsable
// values are ignored.
func RetryAfter(h http.Header, now time.Time) (d time.Duration, ok bool) {
	if v := headerValue(h, "Retry-After-Ms"); v != "" {
		if ms, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil && ms >= 0 && ms < 1e12 {
			return time.Duration(ms * float64(time.Millisecond)), true
		}
	}
	v := strings.TrimSpace(headerValue(h, "Retry-After"))
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		if s < 0 || s > 1e9 {
			return 0, false
		}
		return time.Duration(s * float64(time.Second)), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}

func (c RetryConfig) withDefaults() RetryConfig {
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 3
	}
	if c.InitialInterval == 0 {
		c.InitialInterval = 100 * time.Millisecond
	}
	if c.MaxInterval == 0 {
		c.MaxInterval = 1200 * time.Millisecond
	}
	if c.Multiplier == 0 {
		c.Multiplier = 2
	}
	if c.RandomizationFactor == 0 {
		c.RandomizationFactor = 0.5
	}
	if c.MaxRetryAfter == 0 {
		c.MaxRetryAfter = 8 * time.Second
	}
	if c.ShouldRetry == nil {
		c.ShouldRetry = DefaultShouldRetry
	}
	return c
}

// retryPolicy is a RetryConfig with its defaults filled in.
type retryPolicy struct {
	RetryConfig
}

func newRetryPolicy(c RetryConfig) (retryPolicy, error) {
	if c.MaxAttempts < 0 || c.InitialInterval < 0 || c.MaxInterval < 0 || c.Multiplier < 0 ||
		c.MaxRetryAfter < 0 || c.AttemptTimeout < 0 || c.RandomizationFactor >= 1 {
		return retryPolicy{}, fmt.Errorf("relay: invalid RetryConfig: counts and durations must not be negative, RandomizationFactor must be below 1")
	}
	return retryPolicy{c.withDefaults()}, nil
}

func (p *retryPolicy) newBackOff() backoff.BackOff {
	if p.NewBackOff != nil {
		return p.NewBackOff()
	}
	return DefaultBackOff(p.RetryConfig)
}
