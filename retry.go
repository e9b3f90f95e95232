package relay

import (
	"context"
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// DefaultShouldRetry retries what can succeed: connection errors (refused,
// reset, EOF before headers, per-attempt timeouts), 408, 409, 429, 500, 502,
// 503, 504, and any response carrying "x-should-retry: true". It never
// retries "x-should-retry: false", other 4xx, a cancelled request, or a
// request that cannot be sent (ErrBodyTooLarge, ErrInvalidHeader). Wrap
// it in RetryConfig.ShouldRetry to change what is retried.
func DefaultShouldRetry(resp *http.Response, err error) bool {
	if err != nil {
		return !errors.Is(err, context.Canceled) && !errors.Is(err, ErrBodyTooLarge) && !errors.Is(err, ErrInvalidHeader)
	}
	if resp == nil {
		return false
	}
	switch headerValue(resp.Header, "X-Should-Retry") {
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

// RetryAfter returns the wait a response asks for: retry-after-ms first,
// then Retry-After in seconds or as an HTTP date (relative to now). ok is
// false when neither header holds a usable value; negative and unparsable
// values are ignored.
func RetryAfter(h http.Header, now time.Time) (d time.Duration, ok bool) {
	if v := headerValue(h, "Retry-After-Ms"); v != "" {
		if ms, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil && ms >= 0 {
			return hintDuration(ms, time.Millisecond), true
		}
	}
	v := strings.TrimSpace(headerValue(h, "Retry-After"))
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		if s < 0 || s != s {
			return 0, false
		}
		return hintDuration(s, time.Second), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}

// hintDuration converts a hint of n units to a Duration; a hint too long
// for one (hundreds of years, or infinite) is the longest Duration, which is
// over any cap.
func hintDuration(n float64, unit time.Duration) time.Duration {
	if n >= float64(math.MaxInt64)/float64(unit) {
		return math.MaxInt64
	}
	return time.Duration(n * float64(unit))
}

// retrier is one request's retry schedule.
type retrier struct {
	s  *retrySettings
	n  int             // retries so far
	bo backoff.BackOff // the default exponential backoff, made on first use
}

// backoff returns the wait before the next retry, or false when the
// schedule says stop.
func (rt *retrier) backoff() (time.Duration, bool) {
	rt.n++
	if rt.s.backoff != nil {
		d := rt.s.backoff(rt.n)
		return d, d >= 0
	}
	if rt.bo == nil {
		rt.bo = exponential(rt.s)
	}
	d := rt.bo.NextBackOff()
	return d, d != backoff.Stop
}

// exponential returns the default backoff of one request: cenkalti's
// exponential backoff with the configured intervals and no elapsed-time
// limit.
func exponential(s *retrySettings) backoff.BackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = s.initial
	b.MaxInterval = s.max
	b.Multiplier = s.multiplier
	b.RandomizationFactor = s.randomization
	b.MaxElapsedTime = 0
	b.Reset()
	return b
}

// retryWait decides what follows attempt a, the i-th (from 0): final is
// true when a is the answer (the last attempt, a cancelled request, an
// outcome not worth retrying, a hint longer than MaxRetryAfter, a backoff
// that stops); otherwise wait is the pause before the next attempt, which
// goes to next.
func (t *trip) retryWait(a *attempt, next candidate, i int, rt *retrier) (wait time.Duration, final bool) {
	s := &t.r.s.retry
	resp, err := a.judged()
	if i == s.maxAttempts-1 || t.stopped(t.ctx) != nil || !s.shouldRetry(resp, err) {
		return 0, true
	}
	// A server's hint is about itself: it sets the wait when the retry goes
	// back to it. Another upstream is tried after the backoff (the limiter
	// holds this one for its hint).
	if resp != nil && next.up == a.cand.up {
		if hint, ok := RetryAfter(resp.Header, t.r.s.clock.Now()); ok {
			return hint, hint > s.maxRetryAfter // the server asks for longer than we wait: answer now
		}
	}
	d, ok := rt.backoff()
	return d, !ok
}

// retryReason says why an attempt did not answer: its status, or the kind
// of its error.
func retryReason(a *attempt) string {
	switch {
	case a.stream != nil && a.stream.failed != nil:
		return a.stream.failed.why
	case a.resp != nil:
		return strconv.Itoa(a.resp.StatusCode)
	case errors.Is(a.err, ErrAttemptTimeout):
		return "timeout"
	case errors.Is(a.err, ErrFirstTokenTimeout):
		return "first-token"
	case errors.Is(a.err, context.Canceled), errors.Is(a.err, context.DeadlineExceeded):
		return "context"
	}
	return "connection"
}
