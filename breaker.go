package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tokenrelay/relay/store"
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

// circuit is the router's view of one upstream's circuit, made of the
// store's answers (the store decides): it drops an upstream the store
// said is open from the candidate order (region.go) without asking the
// store again, names the state in Stats and in BreakerEvents, and counts
// the changes that make an attempt's latency stale. Lock-free.
type circuit struct {
	// view is 0 while closed; the end of the open period (Unix ns) while
	// open; minus the end of the probe's claim while half-open with a
	// probe of this replica in flight.
	view    atomic.Int64
	changes atomic.Uint64
}

// stored returns the state a view stands for, and the time it names.
func stored(v int64) (BreakerState, int64) {
	switch {
	case v > 0:
		return StateOpen, v
	case v < 0:
		return StateHalfOpen, -v
	}
	return StateClosed, 0
}

// openUntil reports whether the view keeps the upstream out at now, and
// until when: open before its end (with an active probe, until the probe
// closes it), half-open while the probe is in flight.
func (c *circuit) openUntil(now time.Time, active bool) (time.Time, bool) {
	st, at := stored(c.view.Load())
	if st == StateClosed || (now.UnixNano() >= at && (st == StateHalfOpen || !active)) {
		return time.Time{}, false
	}
	return time.Unix(0, at), true
}

// stateAt returns the state as of now: an open circuit whose period has
// passed is half-open (with an active probe, open until the probe).
func (c *circuit) stateAt(now time.Time, active bool) BreakerState {
	st, at := stored(c.view.Load())
	if st == StateOpen && now.UnixNano() >= at && !active {
		return StateHalfOpen
	}
	return st
}

// see sets u's view to state to (until its end at, for open and
// half-open) and tells Hooks.OnBreaker of a change, with reason. t, when
// not nil, is the request that saw it: a panic in the hook is its (see
// trip.catch).
func (r *Router) see(t *trip, u *upstream, to BreakerState, at time.Time, reason string) {
	v := int64(0)
	switch to {
	case StateOpen:
		v = max(at.UnixNano(), 1)
	case StateHalfOpen:
		v = -max(at.UnixNano(), 1)
	}
	old := u.circ.view.Swap(v)
	from, _ := stored(old)
	if from == to {
		return
	}
	u.circ.changes.Add(1)
	if to == StateOpen {
		u.lat.reset() // latencies from before the opening would open it again after recovery
	}
	h := r.s.breaker.onChange
	if h == nil {
		return
	}
	ev := BreakerEvent{Upstream: u.cfg.Name, From: from, To: to, Reason: reason}
	if to == StateOpen {
		ev.Until = at
	}
	if t != nil {
		defer t.catch()
	}
	h(ev)
}

// saw updates c's view from the verdict of its admission.
func (r *Router) saw(t *trip, c *candidate, v store.Verdict, now time.Time) {
	switch {
	case v.Open:
		r.see(t, c.up, StateOpen, v.Until, "open for the fleet")
	case v.Probe != "":
		r.see(t, c.up, StateHalfOpen, now.Add(r.probeTTL(c)), "cooldown ended")
	case v.Taken && !c.forced && c.up.circ.view.Load() != 0:
		r.see(t, c.up, StateClosed, time.Time{}, "closed for the fleet")
	}
}

// probeTTL bounds the claim on a half-open circuit's probe: a replica
// that dies while probing keeps the others off at most this long. c is
// the candidate the probe would be sent to: its attempt timeout bounds it.
func (r *Router) probeTTL(c *candidate) time.Duration {
	ttl := 10 * time.Second
	if d := c.timeouts().Attempt; d > 0 {
		ttl = d
	}
	return min(ttl, r.s.breaker.cooldown)
}

// probeFor is how long an admission claims a half-open circuit's probe
// for: 0 with an active probe (ProbePath), which alone probes.
func (r *Router) probeFor(c *candidate) time.Duration {
	if r.s.breaker.probePath != "" {
		return 0
	}
	return r.probeTTL(c)
}

// record tells the store what an attempt on c learned: a hold (a 429, an
// exhausted x-ratelimit-remaining-*), and its outcome for the circuit. A
// success ends a failure run and closes the circuit when it was the
// probe; a success whose latency puts the p99 over its bound opens it; a
// failure counts. hint is a Retry-After the upstream sent (0 if none).
// Outcomes that change nothing (a success with no run and no probe, a
// neutral outcome that was not the probe, a failure with counting off)
// cost the store no call.
func (r *Router) record(ctx context.Context, t *trip, c *candidate, resp *http.Response, o outcome, hint time.Duration, now time.Time) {
	u := c.up
	if hold := holdOf(resp, now); !hold.IsZero() {
		r.holdIn(ctx, t, u, hold, now)
	}
	probe := c.probeToken()
	so := store.Outcome{Probe: probe}
	switch {
	case o == outcomeSuccess && probe == "" && r.p99Over(&u.lat) && u.circ.view.Load() == 0:
		until := now.Add(r.s.breaker.cooldown)
		reason := fmt.Sprintf("p99 %s over %s", u.lat.p99().Round(time.Millisecond), r.s.breaker.p99)
		r.openIn(ctx, t, u, until, now)
		r.see(t, u, StateOpen, until, reason)
		return
	case o == outcomeSuccess && (probe != "" || c.failing):
		so.Result = store.Success
	case o == outcomeFailure && (probe != "" || r.s.breaker.failures > 0):
		so.Result, so.Hint = store.Failure, min(hint, r.s.breaker.maxCooldown)
	case o == outcomeNeutral && probe != "":
		so.Result = store.Neutral
	default:
		return
	}
	ch := r.outcomeIn(ctx, t, u, c.took, so, now)
	switch {
	case ch.Closed:
		r.see(t, u, StateClosed, time.Time{}, "probe succeeded")
	case !ch.Opened.IsZero() && ch.Run > 0:
		r.see(t, u, StateOpen, ch.Opened, fmt.Sprintf("%d consecutive failures", ch.Run))
	case !ch.Opened.IsZero():
		r.see(t, u, StateOpen, ch.Opened, "probe failed")
	case so.Result == store.Neutral && u.circ.view.Load() < 0:
		r.see(t, u, StateHalfOpen, now, "") // the claim ended: the next attempt probes
	}
}

// p99Over reports whether the latency window has enough samples and its
// p99 is over the breaker's bound (never when there is no bound).
func (r *Router) p99Over(lat *latencyWindow) bool {
	b := &r.s.breaker
	return b.p99 > 0 && lat.count() >= b.minSamples && lat.p99() > b.p99
}

// Probe runs the active health probe (BreakerConfig.ProbePath) against every
// upstream whose circuit is open with its cooldown ended, and closes the
// circuits of those that answer 2xx. With a shared State, it claims each
// circuit's probe first, so that one replica probes for the fleet, and
// one that another replica closed is back without a probe. It returns the
// names of the upstreams it re-admitted. Call it from your own ticker;
// the router starts no goroutine. Without ProbePath it does nothing. It
// is safe for concurrent use.
func (r *Router) Probe(ctx context.Context) []string {
	r = r.current()
	if r.s.breaker.probePath == "" {
		return nil
	}
	path, query, _ := strings.Cut(strings.TrimLeft(r.s.breaker.probePath, "/"), "?")
	var back []string
	for _, u := range r.ups {
		now := r.s.clock.Now()
		if st := u.circ.stateAt(now, false); st == StateClosed || st == StateOpen {
			continue // closed, or its cooldown not over
		}
		c := candidate{up: u}
		bare := store.Limits{Name: u.cfg.Name} // the probe takes no rate tokens
		v, took := r.admitIn(ctx, nil, &bare, &bare, nil, store.Ask{Probe: r.probeTTL(&c)}, now)
		c.took = took
		switch {
		case v.Open:
			r.saw(nil, &c, v, now)
			continue
		case !v.Taken:
			continue // held
		case v.Probe == "":
			r.see(nil, u, StateClosed, time.Time{}, "closed for the fleet")
			back = append(back, u.cfg.Name)
			continue
		}
		c.probe = &v.Probe
		o := store.Outcome{Result: store.Neutral, Probe: v.Probe}
		if r.probeOK(ctx, u, path, query) {
			o.Result = store.Success
		}
		if ch := r.outcomeIn(ctx, nil, u, took, o, r.s.clock.Now()); ch.Closed {
			r.see(nil, u, StateClosed, time.Time{}, "health probe succeeded")
			back = append(back, u.cfg.Name)
		}
	}
	return back
}

// probeOK sends the active health probe to u and reports whether it
// answered 2xx.
func (r *Router) probeOK(ctx context.Context, u *upstream, path, query string) bool {
	pu := u.pathURL(path, "", query) // as a request for the path has it (on Azure, under /openai)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, pu.String(), nil)
	if err != nil {
		return false
	}
	// The upstream's headers as a request carries them (an Azure
	// Api-Key, its Authorization).
	req.Header = outHeader(nil, u)
	resp, err := r.s.base.RoundTrip(req)
	if err != nil {
		return false
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return resp.StatusCode < 300
}
