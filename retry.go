package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
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
	// or Retry-After. A hint sets the wait when the retry goes back to the
	// upstream that sent it, and a response asking for longer than the cap
	// is then returned to the caller at once instead of waited for. When the
	// next candidate is another upstream, the backoff applies (the limiter
	// holds the hinting upstream). If 0, 8 s.
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

// HedgeConfig configures hedging: a request with no response headers after
// the hedge delay gets a second attempt on the next candidate; the first
// response wins and the other attempt is cancelled and its body closed.
// Hedging is off unless Delay or P95 is set. A stream is never hedged once a
// byte reached the caller (hedging acts before response headers).
//
// Each hedge runs the two attempts on goroutines; a losing attempt that is
// still in flight is cancelled, and its goroutine ends as soon as the
// cancelled call returns.
type HedgeConfig struct {
	// Delay is the fixed hedge delay, and the floor of the P95 delay.
	Delay time.Duration
	// P95 uses the first upstream's observed p95 time to headers as the
	// delay once 20 samples are in; Delay (required with P95) is the delay
	// before that, and the floor after.
	P95 bool
	// Budget caps hedges to a fraction of requests, so an outage does not
	// double the load: each request adds Budget to a balance (capped at 10
	// hedges) and each hedge spends 1. If 0, 0.05.
	Budget float64
}

// hedgeBudget is a balance of hedges in thousandths.
type hedgeBudget struct {
	bal     atomic.Int64
	deposit int64
}

const hedgeBudgetCap = 10 * 1000

func (b *hedgeBudget) add() {
	for {
		old := b.bal.Load()
		nv := min(old+b.deposit, hedgeBudgetCap)
		if old == nv || b.bal.CompareAndSwap(old, nv) {
			return
		}
	}
}

func (b *hedgeBudget) take() bool {
	for {
		old := b.bal.Load()
		if old < 1000 {
			return false
		}
		if b.bal.CompareAndSwap(old, old-1000) {
			return true
		}
	}
}

// hedgeDelay is the delay after which an attempt on u is hedged.
func (r *Router) hedgeDelay(u *upstream) time.Duration {
	d := r.cfg.Hedge.Delay
	if r.cfg.Hedge.P95 && u.lat.count() >= 20 {
		d = max(d, u.lat.p95())
	}
	return d
}

// sendHedged sends the attempt on cands[idx]; with hedging on and no
// response headers after the hedge delay, it also sends to the next
// candidate that can take the request at once, and returns the first good
// answer. The second return is the index after the hedge's candidate, or -1
// when there was no hedge.
func (t *trip) sendHedged(ctx context.Context, cands []candidate, idx int, tk ticket, tried uint64, body []byte) (attempt, int) {
	r := t.r
	cand := cands[idx]
	if !r.hedging {
		a := t.send(ctx, cand, body)
		a.tk = tk
		return a, -1
	}
	results := make(chan attempt, 2)
	var cancels [2]context.CancelFunc
	launch := func(n int, c candidate, tk ticket, body []byte) {
		actx, cancel := context.WithCancel(ctx)
		cancels[n] = cancel
		go func() {
			a := t.send(actx, c, body)
			a.tk, a.hedge = tk, n
			if inner := a.cancel; inner != nil {
				a.cancel = func() { inner(); cancel() }
			} else {
				a.cancel = cancel
			}
			results <- a
		}()
	}
	launch(0, cand, tk, body)
	fire := make(chan struct{})
	stop := r.clock.AfterFunc(r.hedgeDelay(cand.up), func() { close(fire) })
	select {
	case a := <-results:
		stop()
		return a, -1
	case <-ctx.Done():
		stop()
		return <-results, -1
	case <-fire:
	}
	if !r.hedges.take() {
		return <-results, -1
	}
	t.exclude = cand.up // a hedge goes elsewhere: no tokens taken from the one in flight
	idx2, tk2, err := t.acquire(ctx, cands, idx+1, tried, false)
	t.exclude = nil
	if err != nil {
		r.hedges.bal.Add(1000) // unspent
		return <-results, -1
	}
	t.rep.Hedged = true
	t.rep.Attempts++
	launch(1, cands[idx2], tk2, t.bodyFor(cands[idx2]))
	first := <-results
	if first.err == nil && !r.retry.ShouldRetry(first.resp, nil) {
		select {
		case loser := <-results:
			// Both completed upstream: both are billed.
			t.observe(&loser)
			t.addLoserUsage(&loser)
			loser.close()
		default:
			cancels[1-first.hedge]()
			go func() { // ends as soon as the cancelled attempt returns
				loser := <-results
				t.observe(&loser)
				loser.close()
			}()
		}
		return first, idx2 + 1
	}
	second := <-results
	if second.resp == nil && first.resp != nil {
		// A response, even a retryable one, beats none.
		second, first = first, second
	}
	t.observe(&first) // the one not returned; run observes the other
	first.close()
	return second, idx2 + 1
}

// addLoserUsage reads the usage of a hedge's losing attempt that completed
// upstream too, so the report's cost includes both.
func (t *trip) addLoserUsage(a *attempt) {
	if a.resp == nil || a.resp.StatusCode >= 300 || isEventStream(a.resp.Header) {
		return
	}
	b, err := io.ReadAll(io.LimitReader(a.resp.Body, maxKeptBody))
	if err != nil {
		return
	}
	if u, ok := parseUsage(b); ok {
		t.loser = &loserUsage{u: u, model: a.cand.model, factor: a.cand.up.factor}
	}
}

// loserUsage is what a hedge's losing attempt was billed.
type loserUsage struct {
	u      Usage
	model  string
	factor float64
}
