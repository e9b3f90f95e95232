package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

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
	Upstream string       // the upstream's name
	From, To BreakerState // the transition
	Reason   string       // e.g. "6 consecutive failures", "p99 1.8s over 1.5s", "probe succeeded"
	Until    time.Time    // end of the open period, when To is StateOpen
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

// breaker is the circuit breaker of one upstream (BreakerConfig describes
// its states). Its mutex guards only this upstream's state; OnChange runs
// after it is released.
type breaker struct {
	name string
	s    *breakerSettings

	// out is false while the breaker is closed, so the common case reads one
	// atomic and takes no lock; otherwise the state is read under mu.
	out atomic.Bool
	// quiet is true while the breaker is closed with no failure counted:
	// an attempt's success then changes nothing (unless the p99 is over
	// its bound), and is recorded without the lock.
	quiet atomic.Bool

	// changes counts state changes: it is the generation of a ticket, and
	// an outcome of an attempt let through before the last change is
	// stale and dropped. It is written under mu and read without it (an
	// attempt's latency is kept only if no change came during it).
	changes atomic.Uint64

	mu       sync.Mutex
	state    BreakerState
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

func (b *breaker) init(name string, s *breakerSettings) {
	b.name, b.s, b.cooldown = name, s, s.cooldown
	b.quiet.Store(true)
}

// settleLocked updates quiet after a change of state or failure count.
func (b *breaker) settleLocked() { b.quiet.Store(b.state == StateClosed && b.fails == 0) }

// openUntil reports whether the breaker keeps the upstream out of the
// candidate order at now, and until when. A half-open breaker whose probe is
// in flight is out too (until now).
func (b *breaker) openUntil(now time.Time) (time.Time, bool) {
	if !b.out.Load() {
		return time.Time{}, false
	}
	active := b.s.probePath != ""
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case StateOpen:
		if now.Before(b.until) || active {
			return b.until, true
		}
	case StateHalfOpen:
		if b.probing || active {
			return now, true
		}
	}
	return time.Time{}, false
}

// allow asks for one attempt. forced attempts (the soonest-to-recover
// upstream of an all-open pool) are let through whatever the state. t, when
// not nil, is the request asking: a panic in the OnBreaker hook is its
// (see emit).
func (b *breaker) allow(now time.Time, forced bool, tr *trip) (ticket, bool) {
	// Closed: let the attempt through without the lock. The generation is
	// read first, so a change that comes before out is read makes its
	// outcome stale (done drops it) rather than counted against the next
	// state.
	if g := b.changes.Load(); !b.out.Load() {
		return ticket{gen: g}, true
	}
	b.mu.Lock()
	var ev *BreakerEvent
	tk := ticket{gen: b.changes.Load()}
	ok := true
	switch b.state {
	case StateOpen:
		if now.Before(b.until) || b.s.probePath != "" {
			ok = forced
			break
		}
		ev = b.setLocked(StateHalfOpen, "cooldown ended")
		fallthrough
	case StateHalfOpen:
		if b.probing && !forced {
			ok = false
			break
		}
		b.probing = true
		tk = ticket{gen: b.changes.Load(), probe: true}
	}
	b.settleLocked()
	b.mu.Unlock()
	b.emit(ev, tr)
	return tk, ok
}

// done records an attempt's outcome. hint is a Retry-After the upstream
// sent (0 if none). lat is the upstream's latency window, with this
// attempt's latency already in it: a closed breaker trips when its p99
// passes the bound, and an opening breaker empties it, so that stale
// latencies do not open it again after recovery. It returns the end of the
// open period when this outcome opened the breaker, zero otherwise. tr, when
// not nil, is the request whose attempt it was (see emit).
func (b *breaker) done(t ticket, o outcome, hint time.Duration, lat *latencyWindow, now time.Time, tr *trip) (opened time.Time) {
	// The outcomes that change nothing, without the lock: a neutral one
	// while closed, and a success while closed with no failure counted
	// and the p99 within its bound (the locked path checks all of it
	// again when the bound is passed).
	if !t.probe && t.gen == b.changes.Load() && !b.out.Load() {
		switch {
		case o == outcomeNeutral:
			return time.Time{}
		case o == outcomeSuccess && b.quiet.Load() && !b.p99Over(lat):
			return time.Time{}
		}
	}
	hint = min(hint, b.s.maxCooldown) // an absurd hint does not bench an upstream for years
	b.mu.Lock()
	wasOpen := b.state == StateOpen
	gen := b.changes.Load()
	var ev *BreakerEvent
	switch {
	case t.probe && t.gen == gen && b.state == StateHalfOpen:
		b.probing = false
		switch o {
		case outcomeSuccess:
			b.fails, b.cooldown = 0, b.s.cooldown
			ev = b.setLocked(StateClosed, "probe succeeded")
		case outcomeFailure:
			b.cooldown = min(2*b.cooldown, b.s.maxCooldown)
			ev = b.openLocked("probe failed", max(b.cooldown, hint), lat, now)
		}
	case t.gen == gen && b.state == StateClosed:
		switch o {
		case outcomeSuccess:
			b.fails = 0
			if b.p99Over(lat) {
				p := lat.p99()
				ev = b.openLocked(fmt.Sprintf("p99 %s over %s", p.Round(time.Millisecond), b.s.p99), b.cooldown, lat, now)
			}
		case outcomeFailure:
			b.fails++
			if b.s.failures > 0 && b.fails > b.s.failures {
				ev = b.openLocked(fmt.Sprintf("%d consecutive failures", b.fails), max(b.cooldown, hint), lat, now)
			}
		}
	}
	if b.state == StateOpen && !wasOpen {
		opened = b.until
	}
	b.settleLocked()
	b.mu.Unlock()
	b.emit(ev, tr)
	return opened
}

// p99Over reports whether the latency window has enough samples and its
// p99 is over the breaker's bound (never when there is no bound).
func (b *breaker) p99Over(lat *latencyWindow) bool {
	return b.s.p99 > 0 && lat.count() >= b.s.minSamples && lat.p99() > b.s.p99
}

// due reports whether the breaker is out of the closed state with its
// cooldown ended: time for an active probe.
func (b *breaker) due(now time.Time) bool {
	if !b.out.Load() {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state != StateClosed && !now.Before(b.until)
}

// reset closes the breaker after a successful active probe.
func (b *breaker) reset() {
	b.mu.Lock()
	var ev *BreakerEvent
	if b.state != StateClosed {
		b.fails, b.probing, b.cooldown = 0, false, b.s.cooldown
		ev = b.setLocked(StateClosed, "health probe succeeded")
	}
	b.settleLocked()
	b.mu.Unlock()
	b.emit(ev, nil) // Probe's caller gets a panic
}

func (b *breaker) openLocked(reason string, d time.Duration, lat *latencyWindow, now time.Time) *BreakerEvent {
	b.until = now.Add(d)
	b.fails = 0
	lat.reset()
	return b.setLocked(StateOpen, reason)
}

func (b *breaker) setLocked(to BreakerState, reason string) *BreakerEvent {
	from := b.state
	b.state = to
	b.out.Store(to != StateClosed)
	b.changes.Add(1)
	if b.s.onChange == nil {
		return nil
	}
	ev := &BreakerEvent{Upstream: b.name, From: from, To: to, Reason: reason}
	if to == StateOpen {
		ev.Until = b.until
	}
	return ev
}

// emit calls the OnBreaker hook with ev, if there is one. A panic in it
// while a request t runs is t's, as for its other hooks (trip.catch): the
// request unwinds, and RoundTrip panics with the value.
func (b *breaker) emit(ev *BreakerEvent, t *trip) {
	if ev == nil {
		return
	}
	if t != nil {
		defer t.catch()
	}
	b.s.onChange(*ev)
}

// stateAt returns the breaker's state as of now.
func (b *breaker) stateAt(now time.Time) BreakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == StateOpen && !now.Before(b.until) && b.s.probePath == "" {
		return StateHalfOpen
	}
	return b.state
}

// Probe runs the active health probe (BreakerConfig.ProbePath) against every
// upstream whose breaker is open with its cooldown ended, and closes the
// breakers of those that answer 2xx. It returns the names of the upstreams
// it re-admitted. Call it from your own ticker; the router starts no
// goroutine. Without ProbePath it does nothing. It is safe for concurrent
// use.
func (r *Router) Probe(ctx context.Context) []string {
	if r.s.breaker.probePath == "" {
		return nil
	}
	path, query, _ := strings.Cut(strings.TrimLeft(r.s.breaker.probePath, "/"), "?")
	var back []string
	for _, u := range r.ups {
		if !u.br.due(r.s.clock.Now()) {
			continue
		}
		pu := u.pathURL(path, "", query) // as a request for the path has it (on Azure, under /openai)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, pu.String(), nil)
		if err != nil {
			continue
		}
		// The upstream's headers as a request carries them (an Azure
		// Api-Key, its Authorization).
		req.Header = outHeader(nil, u)
		resp, err := r.s.base.RoundTrip(req)
		if err != nil {
			continue
		}
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		if resp.StatusCode < 300 {
			u.br.reset()
			back = append(back, u.cfg.Name)
		}
	}
	return back
}
