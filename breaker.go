package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// BreakerConfig configures the circuit breaker of every upstream.
//
// A breaker is closed (traffic flows), open (the upstream is dropped from
// the candidate order) or half-open (one real request probes it). It opens
// after more than Failures consecutive failures, or when the p99 latency of
// the upstream's last 200 requests passes P99. After Cooldown (stretched by a
// Retry-After the upstream sent) it is half-open: the next request that
// would use it is the probe. Success closes it; failure opens it again with
// the cooldown doubled, up to MaxCooldown.
//
// Failures are 5xx, 429 and connection errors (per-attempt timeouts
// included). Other 4xx, caused by the request, and cancelled requests count
// neither way. There is no background goroutine: every transition is
// computed from timestamps of Config.Clock when the breaker is consulted.
type BreakerConfig struct {
	// Failures is the number of consecutive failures the breaker tolerates;
	// one more opens it. If 0, 5; negative disables failure counting.
	Failures int
	// P99 opens the breaker when the p99 latency (to response headers) of
	// the last 200 requests exceeds it, once MinSamples are in. If 0,
	// 1.5 s; negative disables.
	P99 time.Duration
	// MinSamples is the number of latencies needed before P99 can trip. If
	// 0, 20.
	MinSamples int
	// Cooldown is the first open period. If 0, 30 s.
	Cooldown time.Duration
	// MaxCooldown caps the doubled cooldown. If 0, 5 min.
	MaxCooldown time.Duration
	// BusyP99 is the recent p99 latency over which an upstream counts as
	// busy for Load.Busy. If 0, 1 s.
	BusyP99 time.Duration
	// ProbePath, when set, turns on the active health probe: an open
	// upstream whose cooldown ended is not handed a user request as its
	// probe; it waits until Router.Probe (called from the user's own ticker)
	// gets a 2xx for GET BaseURL+ProbePath (e.g. "/models").
	ProbePath string
	// OnChange is called on every state change, synchronously, with no lock
	// held. It must not block.
	OnChange func(BreakerEvent)
}

// BreakerState is the state of a circuit breaker.
type BreakerState uint8

// Breaker states.
const (
	StateClosed BreakerState = iota
	StateOpen
	StateHalfOpen
)

func (s BreakerState) String() string {
	switch s {
	case StateClosed:
		return "closed"
	case StateOpen:
		return "open"
	case StateHalfOpen:
		return "half-open"
	}
	return fmt.Sprintf("BreakerState(%d)", uint8(s))
}

// BreakerEvent describes a breaker state change.
type BreakerEvent struct {
	Upstream string
	From, To BreakerState
	Reason   string    // e.g. "6 consecutive failures", "p99 1.8s over 1.5s", "probe succeeded"
	Until    time.Time // end of the open period, when To is StateOpen
}

// outcome is how an attempt counts for the breaker.
type outcome uint8

const (
	outcomeNeutral outcome = iota
	outcomeSuccess
	outcomeFailure
)

// outcomeOf sorts an attempt's result for the breaker.
func outcomeOf(resp *http.Response, err error) outcome {
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return outcomeNeutral
		}
		return outcomeFailure
	}
	if resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
		return outcomeFailure
	}
	if resp.StatusCode >= 400 {
		return outcomeNeutral
	}
	return outcomeSuccess
}

type breakerSettings struct {
	failures    int
	p99         time.Duration
	minSamples  int
	cooldown    time.Duration
	maxCooldown time.Duration
	probe       bool
	onChange    func(BreakerEvent)
}

func newBreakerSettings(c BreakerConfig) (*breakerSettings, error) {
	if c.MinSamples < 0 || c.Cooldown < 0 || c.MaxCooldown < 0 || c.BusyP99 < 0 {
		return nil, errors.New("relay: invalid BreakerConfig: MinSamples, Cooldown, MaxCooldown and BusyP99 must not be negative")
	}
	s := &breakerSettings{failures: c.Failures, p99: c.P99, minSamples: c.MinSamples, cooldown: c.Cooldown,
		maxCooldown: c.MaxCooldown, probe: c.ProbePath != "", onChange: c.OnChange}
	if s.failures == 0 {
		s.failures = 5
	}
	if s.p99 == 0 {
		s.p99 = 1500 * time.Millisecond
	}
	if s.minSamples == 0 {
		s.minSamples = 20
	}
	if s.cooldown == 0 {
		s.cooldown = 30 * time.Second
	}
	if s.maxCooldown == 0 {
		s.maxCooldown = 5 * time.Minute
	}
	s.maxCooldown = max(s.maxCooldown, s.cooldown)
	return s, nil
}

// breaker is the circuit breaker of one upstream. Its mutex guards only this
// upstream's state; callbacks run after it is released.
type breaker struct {
	u       *upstream
	s       *breakerSettings
	busyP99 time.Duration

	// out is 0 while the breaker is closed, so the common case reads one
	// atomic and takes no lock; otherwise the state is read under mu.
	out atomic.Bool

	mu       sync.Mutex
	state    BreakerState
	gen      uint64 // bumped on every state change; stale outcomes are dropped
	fails    int
	until    time.Time     // end of the open period
	cooldown time.Duration // the current open period
	probing  bool          // a half-open probe is in flight
}

// ticket is a breaker's permission for one attempt.
type ticket struct {
	gen   uint64
	probe bool
}

func (b *breaker) init(u *upstream, r *Router) {
	b.u = u
	b.s = r.breakers
	b.busyP99 = r.cfg.Breaker.BusyP99
	if b.busyP99 == 0 {
		b.busyP99 = time.Second
	}
	b.cooldown = b.s.cooldown
}

// openUntil reports whether the breaker keeps the upstream out of the
// candidate order at now, and until when. A half-open breaker whose probe is
// in flight is out too (until now).
func (b *breaker) openUntil(now time.Time) (time.Time, bool) {
	if !b.out.Load() {
		return time.Time{}, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case StateOpen:
		if now.Before(b.until) || b.s.probe {
			return b.until, true
		}
	case StateHalfOpen:
		if b.probing || b.s.probe {
			return now, true
		}
	}
	return time.Time{}, false
}

// allow asks for one attempt. forced attempts (the soonest-to-recover
// upstream of an all-open pool) are let through whatever the state.
func (b *breaker) allow(now time.Time, forced bool) (ticket, bool) {
	b.mu.Lock()
	var ev *BreakerEvent
	t := ticket{gen: b.gen}
	ok := true
	switch b.state {
	case StateOpen:
		if now.Before(b.until) || b.s.probe {
			ok = forced
			break
		}
		ev = b.setLocked(StateHalfOpen, "cooldown ended", now)
		fallthrough
	case StateHalfOpen:
		if b.probing && !forced {
			ok = false
			break
		}
		b.probing = true
		t = ticket{gen: b.gen, probe: true}
	}
	b.mu.Unlock()
	b.emit(ev)
	return t, ok
}

// done records an attempt's outcome (its latency is already in the
// upstream's window); hint is a Retry-After the upstream sent (0 if none).
func (b *breaker) done(t ticket, o outcome, hint time.Duration, now time.Time) {
	b.mu.Lock()
	var ev *BreakerEvent
	if t.probe && t.gen == b.gen && b.state == StateHalfOpen {
		b.probing = false
		switch o {
		case outcomeSuccess:
			b.fails = 0
			b.cooldown = b.s.cooldown
			ev = b.setLocked(StateClosed, "probe succeeded", now)
		case outcomeFailure:
			b.cooldown = min(2*b.cooldown, b.s.maxCooldown)
			ev = b.openLocked("probe failed", max(b.cooldown, hint), now)
		}
	} else if t.gen == b.gen && b.state == StateClosed {
		switch o {
		case outcomeSuccess:
			b.fails = 0
			if b.s.p99 > 0 && b.u.lat.count() >= b.s.minSamples {
				if p := b.u.lat.p99(); p > b.s.p99 {
					ev = b.openLocked(fmt.Sprintf("p99 %s over %s", p.Round(time.Millisecond), b.s.p99), b.cooldown, now)
				}
			}
		case outcomeFailure:
			b.fails++
			if b.s.failures > 0 && b.fails > b.s.failures {
				ev = b.openLocked(fmt.Sprintf("%d consecutive failures", b.fails), max(b.cooldown, hint), now)
			}
		}
	}
	b.mu.Unlock()
	b.emit(ev)
}

// reset closes the breaker after a successful active probe.
func (b *breaker) reset(now time.Time) {
	b.mu.Lock()
	var ev *BreakerEvent
	if b.state != StateClosed {
		b.fails, b.probing, b.cooldown = 0, false, b.s.cooldown
		ev = b.setLocked(StateClosed, "health probe succeeded", now)
	}
	b.mu.Unlock()
	b.emit(ev)
}

func (b *breaker) openLocked(reason string, d time.Duration, now time.Time) *BreakerEvent {
	b.until = now.Add(d)
	b.fails = 0
	b.u.lat.reset() // stale latencies must not re-open it after recovery
	return b.setLocked(StateOpen, reason, now)
}

func (b *breaker) setLocked(to BreakerState, reason string, now time.Time) *BreakerEvent {
	from := b.state
	b.state = to
	b.out.Store(to != StateClosed)
	b.gen++
	if b.s.onChange == nil {
		return nil
	}
	ev := &BreakerEvent{Upstream: b.u.cfg.Name, From: from, To: to, Reason: reason}
	if to == StateOpen {
		ev.Until = b.until
	}
	return ev
}

func (b *breaker) emit(ev *BreakerEvent) {
	if ev != nil {
		b.s.onChange(*ev)
	}
}

// State returns an upstream's breaker state, as of now.
func (b *breaker) stateAt(now time.Time) BreakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == StateOpen && !now.Before(b.until) && !b.s.probe {
		return StateHalfOpen
	}
	return b.state
}

// Probe runs the active health probe (BreakerConfig.ProbePath) against every
// upstream whose breaker is open with its cooldown ended, and closes the
// breakers of those that answer 2xx. It returns the names of the upstreams
// it re-admitted. Call it from your own ticker; the router starts no
// goroutine. Without ProbePath it does nothing.
func (r *Router) Probe(ctx context.Context) []string {
	path := r.cfg.Breaker.ProbePath
	if path == "" {
		return nil
	}
	var back []string
	for _, u := range r.ups {
		now := r.clock.Now()
		u.br.mu.Lock()
		due := u.br.state != StateClosed && !now.Before(u.br.until)
		u.br.mu.Unlock()
		if !due {
			continue
		}
		pu := *u.base
		pu.Path = u.base.Path + "/" + trimSlash(path)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, pu.String(), nil)
		if err != nil {
			continue
		}
		if u.auth != nil {
			req.Header.Set("Authorization", u.auth())
		}
		resp, err := r.base.RoundTrip(req)
		if err != nil {
			continue
		}
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		if resp.StatusCode < 300 {
			u.br.reset(r.clock.Now())
			back = append(back, u.cfg.Name)
		}
	}
	return back
}

func trimSlash(p string) string {
	for len(p) > 0 && p[0] == '/' {
		p = p[1:]
	}
	return p
}
