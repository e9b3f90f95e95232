package relay

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"time"
)

// State is what the replicas of a service share so that an upstream's rate
// limits, its health and a budget are one number for the whole fleet, not
// one per process: with 8 replicas each holding an upstream's RPM, the
// upstream would otherwise receive 8× its limit.
//
// With Config.State nil (the default), all of it lives in the process.
// Package redisstate keeps it on Redis. The router calls a State on the
// request path, each call bounded by Config.StateTimeout; when a call
// fails or times out, the router decides that call from its in-process
// state instead (rate limits divided by Config.Replicas), says so in
// Report.StateFallback and Router.StateFallbacks, and tries the shared
// state again on the next call: a State that is down never fails a
// request. Implementations are safe for concurrent use.
type State interface {
	// Ledger keeps the fleet's budget spend (see Budget).
	Ledger

	// Admit is an attempt's admission on the fleet's view of upstream
	// u.Name, in one step (one round trip): when its circuit is open (and
	// force is false), or the upstream is held (a 429's Retry-After, an
	// exhausted x-ratelimit-remaining-*), nothing is taken and the verdict
	// says until when; else one request and tpm tokens are taken from its
	// RPM and TPM limits, or, when they are not there, nothing is taken and
	// the verdict says how long until they would be. force admits past an
	// open circuit (the never-empty rule), not past limits or holds.
	Admit(ctx context.Context, u Limits, tpm int, force bool, now time.Time) (Verdict, error)
	// Refund gives back requests and tokens taken from u's limits: for a
	// call that never went out, or the part of a TPM charge a request did
	// not use.
	Refund(ctx context.Context, u Limits, requests, tokens int, now time.Time) error
	// Hold keeps upstream out of the fleet's traffic until until.
	Hold(ctx context.Context, upstream string, until time.Time) error

	// Failure counts a failed attempt on upstream; when more than
	// b.Failures fail in a row, across the fleet, its circuit opens for
	// b.Cooldown. It returns the end of the open period, zero while closed.
	Failure(ctx context.Context, upstream string, b CircuitPolicy, now time.Time) (openUntil time.Time, err error)
	// Success counts a successful attempt: the failure run ends. probe is
	// the token Probe returned when the attempt was the fleet's half-open
	// probe, "" for any other attempt. A probe's success closes the
	// circuit for the fleet if its claim belongs to the current open
	// period: the circuit did not open again since it was claimed (a new
	// open period ends every claim of the one before). A probe that
	// outlived its lock and succeeded while a newer probe is in flight
	// still closes it (a healthy answer, and the circuit has not opened
	// again since); one whose
	// period ended, like any other attempt, only ends the failure run. The
	// router calls Success only after a probe, or when the attempt's
	// Verdict said Failing.
	Success(ctx context.Context, upstream string, probe string) error
	// Open opens upstream's circuit for the fleet until until (a replica's
	// own reason, such as its p99 latency, or a failed probe). A new open
	// period ends the claims on the probe of the one before: none of them
	// can close the circuit afterwards.
	Open(ctx context.Context, upstream string, until time.Time) error
	// Probe claims the half-open probe of upstream's circuit for ttl: it
	// returns a token unique to the claim to the one replica of the fleet
	// that gets it, and "" to the others. The claim keeps the other
	// replicas off the upstream for ttl at most; once ttl has passed,
	// another replica may claim the probe. Every claim of an open period
	// may close it (see Success) until the circuit opens again.
	Probe(ctx context.Context, upstream string, ttl time.Duration) (token string, err error)
}

// Limits are one upstream's shared rate limits.
type Limits struct {
	Name     string // the upstream's
	RPM, TPM int    // per minute; 0: none
}

// CircuitPolicy is the breaker's failure rule, for a shared State.
type CircuitPolicy struct {
	Failures int           // failures in a row tolerated; one more opens (the router calls Failure only when it is positive)
	Cooldown time.Duration // how long it then stays open
}

// Verdict is the answer of State.Admit.
type Verdict struct {
	// Taken: the request and its tokens were taken.
	Taken bool
	// Wait, when nothing was taken for the limits or a hold, is how long
	// until the request could be taken.
	Wait time.Duration
	// Open: the fleet's circuit for the upstream is open until Until; an
	// Until that has passed means its open period ended and no replica's
	// probe is in flight: half-open, a replica may claim the probe (Probe).
	Open  bool
	Until time.Time // the end of the hold or of the open period
	// Failing, with Taken: a run of failures is in progress, which the
	// attempt's success should end (State.Success).
	Failing bool
}

// stateCounters counts the calls a shared State failed.
type stateCounters struct {
	fallbacks atomic.Uint64
}

// StateFallbacks returns how many calls to Config.State failed or timed
// out, each decided from in-process state instead.
func (r *Router) StateFallbacks() uint64 { return r.stateCount.fallbacks.Load() }

// The router's side of a shared State: every call is bounded by
// StateTimeout and derived from the request's context; a call that fails
// is counted, marks the request's report, and leaves the decision to the
// in-process state (limits divided by Replicas).

// stateCtx returns the context of one State call.
func (r *Router) stateCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.s.stateTimeout)
}

// stateFailed counts a failed State call (op, see StateFallbackEvent) for
// the request, if a request made it, and tells Hooks.OnStateFallback.
func (r *Router) stateFailed(t *trip, op string, err error) {
	r.stateCount.fallbacks.Add(1)
	var ctx context.Context
	if t != nil {
		t.stateFallback.Store(true)
		ctx = t.ctx
	}
	if h := r.s.hooks.OnStateFallback; h != nil {
		ev := StateFallbackEvent{Context: ctx, Op: op, Err: err}
		if t != nil {
			t.onStateFallback(h, ev)
		} else {
			h(ev)
		}
	}
}

// onStateFallback calls Hooks.OnStateFallback; a panic is kept (see
// trip.catch).
func (t *trip) onStateFallback(h func(StateFallbackEvent), ev StateFallbackEvent) {
	defer t.catch()
	h(ev)
}

// limitsOf returns an upstream's fleet-wide limits.
func limitsOf(u *upstream) Limits {
	return Limits{Name: u.cfg.Name, RPM: u.cfg.RPM, TPM: u.cfg.TPM}
}

// rate is the rate-limit step of admission for c: how long until its
// tokens are there (0: now), whether they were taken already (a shared
// State takes them in the same round trip), and whether the fleet's circuit
// keeps c out.
func (r *Router) rate(ctx context.Context, a admission, c *candidate, tpm int, now time.Time) (wait time.Duration, taken, open bool) {
	if r.s.state != nil {
		if wait, ahead := c.up.lim.turns.ahead(a.prio, now); ahead {
			return wait, false, false // it queues behind them, without asking (see turns)
		}
		if wait, taken, open, ok := r.admitShared(ctx, a, c, now); ok {
			return wait, taken, open
		}
	}
	lim := &c.up.lim
	wait = max(lim.delay(now, tpm), lim.queued(now, tpm, a.prio))
	if wait == 0 && lim.ahead(a.prio) {
		wait = 1 // tokens are there, but requests of higher or equal priority wait for them
	}
	return wait, false, false
}

// admitShared asks the State for c's admission; ok is false when it could
// not answer. In half-open, the one replica that claims the fleet's probe
// sends it.
func (r *Router) admitShared(ctx context.Context, a admission, c *candidate, now time.Time) (wait time.Duration, taken, open, ok bool) {
	c.fleetProbe = nil // a claim is this admission's, never one an earlier attempt on c made
	tpm := fleetCharge(a.tokens, c.up)
	v, err := r.stateAdmit(ctx, a, c, tpm, c.forced, now)
	if err != nil {
		return 0, false, false, false
	}
	if v.Open && !c.forced {
		if v.Until.After(now) {
			c.fleetOpen = v.Until
			return 0, false, true, true
		}
		sctx, cancel := r.stateCtx(ctx)
		token, err := r.s.state.Probe(sctx, c.up.cfg.Name, r.probeTTL(c))
		cancel()
		if err != nil {
			r.stateFailed(a.trip, "probe", err)
			return 0, false, false, false
		}
		if token == "" {
			c.fleetOpen = now.Add(r.probeTTL(c)) // another replica probes
			return 0, false, true, true
		}
		c.fleetProbe = &token
		if v, err = r.stateAdmit(ctx, a, c, tpm, true, now); err != nil {
			return 0, false, false, false
		}
	}
	if v.Taken {
		c.fleetFailing = v.Failing
		return 0, true, false, true
	}
	return max(v.Wait, 1), false, false, true
}

func (r *Router) stateAdmit(ctx context.Context, a admission, c *candidate, tpm int, force bool, now time.Time) (Verdict, error) {
	sctx, cancel := r.stateCtx(ctx)
	defer cancel()
	v, err := r.s.state.Admit(sctx, limitsOf(c.up), tpm, force, now)
	if err != nil {
		r.stateFailed(a.trip, "admit", err)
	}
	return v, err
}

// untake gives back rate tokens rate took for a candidate that does not go.
func (r *Router) untake(ctx context.Context, a admission, c *candidate, now time.Time, taken bool) {
	if taken {
		r.refundShared(ctx, a.trip, c.up, 1, fleetCharge(a.tokens, c.up), now)
	}
}

// fleetCharge is a request's TPM charge on the fleet's bucket: clamped to
// the fleet's limit, not to a replica's share.
func fleetCharge(tokens int, u *upstream) int {
	if u.cfg.TPM <= 0 {
		return 0
	}
	return min(max(tokens, 1), u.cfg.TPM)
}

// probeTTL bounds the claim on the fleet's half-open probe: a replica that
// dies while probing blocks the others at most this long. c is the
// candidate the probe would be sent to: its attempt timeout bounds it.
func (r *Router) probeTTL(c *candidate) time.Duration {
	ttl := 10 * time.Second
	if d := c.timeouts().Attempt; d > 0 {
		ttl = d
	}
	return min(ttl, r.s.breaker.cooldown)
}

// refundShared gives tokens back to the fleet's limits of u.
//
// A refund is made even when the request's context has ended (a waiter
// whose caller gave up gives back what it took): it is detached from ctx's
// cancellation and bounded by StateTimeout alone.
func (r *Router) refundShared(ctx context.Context, t *trip, u *upstream, requests, tokens int, now time.Time) {
	sctx, cancel := r.stateCtx(context.WithoutCancel(ctx))
	defer cancel()
	if err := r.s.state.Refund(sctx, limitsOf(u), requests, tokens, now); err != nil {
		r.stateFailed(t, "refund", err)
	}
}

// waitShared waits for c's tokens in the fleet's limits, in the
// upstream's turns (see turns): as the head, it sleeps for the last
// verdict's wait and asks again, within maxWait; behind others, it waits
// for its turn, then asks at once. fellBack reports that the State stopped
// answering: the in-process limiter then decides.
func (r *Router) waitShared(ctx context.Context, a admission, c *candidate, tpm int, wait, maxWait time.Duration, tooLong error) (fellBack bool, err error) {
	clock := r.s.clock
	start := clock.Now()
	deadline := start.Add(maxWait)
	due := start.Add(wait) // when the last verdict said the tokens would be there
	q := &c.up.lim.turns
	w := &waiter{prio: a.prio}
	q.join(w)
	defer q.leave(w)
	for {
		waited, err := q.await(ctx, clock, w, deadline, tooLong)
		if err != nil {
			return false, err
		}
		now := clock.Now()
		if waited {
			due = now // its verdict is stale: ask now
		}
		if due.After(deadline) {
			return false, tooLong
		}
		q.eta.Store(due.UnixNano())
		// Until the verdict's time, not for its duration from now: a head
		// that got the CPU late does not sleep longer for it.
		if err := sleep(ctx, clock, due.Sub(now)); err != nil {
			return false, err
		}
		if !q.head(w) {
			continue // a request of higher priority came: it asks first
		}
		asked := clock.Now()
		d, taken, open, ok := r.admitShared(ctx, a, c, asked)
		switch {
		case !ok:
			return true, nil
		case open:
			return false, ErrCircuitOpen
		case taken:
			return false, nil
		}
		due = asked.Add(d)
	}
}

// observeShared tells the fleet what an attempt learned: a hold, a
// failure or a success for the shared circuit, a circuit this replica
// opened.
func (r *Router) observeShared(t *trip, a *attempt, o outcome, hold, opened time.Time, now time.Time) {
	name := a.cand.up.cfg.Name
	ctx, cancel := r.stateCtx(context.WithoutCancel(t.ctx))
	defer cancel()
	var err error
	if !hold.IsZero() {
		err = r.s.state.Hold(ctx, name, hold)
	}
	switch {
	case !opened.IsZero():
		err = errors.Join(err, r.s.state.Open(ctx, name, opened))
	case o == outcomeFailure:
		policy := CircuitPolicy{Failures: r.s.breaker.failures, Cooldown: r.s.breaker.cooldown}
		switch {
		case policy.Failures > 0:
			_, ferr := r.s.state.Failure(ctx, name, policy, now)
			err = errors.Join(err, ferr)
		case a.cand.fleetProbe != nil:
			// Failures are not counted (Breaker.Failures < 0), but a
			// failed probe still opens the circuit again for the
			// cooldown while it is half-open, else the fleet would try
			// the upstream again as soon as the probe's lock ran out.
			// Failure with a run no failure reaches does just that: it
			// reopens a half-open circuit, leaves an open one as it is,
			// and never opens a closed one (a probe slower than its lock
			// that fails after a newer probe closed the circuit).
			policy.Failures = math.MaxInt
			_, ferr := r.s.state.Failure(ctx, name, policy, now)
			err = errors.Join(err, ferr)
		}
	case o == outcomeSuccess && (a.cand.fleetProbe != nil || a.cand.fleetFailing):
		// Only the fleet's probe claim closes the fleet's circuit, and
		// only within its open period (State.Success): not a probe of
		// this replica's own breaker, nor a forced attempt, which claimed
		// none.
		err = errors.Join(err, r.s.state.Success(ctx, name, a.cand.probeToken()))
	}
	if err != nil {
		r.stateFailed(t, "observe", err)
	}
}
