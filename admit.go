package relay

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/tokenrelay/relay/store"
)

// admission is what the admission step knows of one request.
type admission struct {
	trip    *trip         // the request (budget reservations, state fallbacks); nil in benchmarks
	tokens  int           // prompt tokens plus max output tokens, for the TPM charge
	tried   uint64        // forced candidates already tried, by index (bit i%64)
	exclude *upstream     // skipped: a hedge's first upstream, already in flight
	mayWait bool          // false: take only what is free now (a hedge)
	prio    Priority      // its place in the queues of waiting requests
	maxWait time.Duration // what is left of Limits.MaxWait on a scan again; 0: all of it
	// retry: an attempt after the first. Under bounded loads a retry
	// ignores the cap: the cap spreads first attempts, and a retry held to
	// it could only go back to the upstream that just failed (whose
	// in-flight count is low because it fails fast) while the healthy
	// ones are at their cap.
	retry bool
}

// admissionOf returns the admission of a request classified as c.
func (r *Router) admissionOf(c *classified) admission {
	out := r.s.defaultMaxTokens
	if c.req.MaxTokens > 0 {
		out = c.req.MaxTokens
	}
	if c.choices > 1 {
		out *= int(c.choices) // "n" completions, each up to max tokens
	}
	return admission{tokens: c.req.PromptTokens + out, mayWait: true}
}

// scanResult is what one pass over the candidates found.
type scanResult struct {
	pick     int // admitted now; -1 if none
	best     int // the candidate whose limits clear soonest; -1 if none
	bestD    time.Duration
	slotWait int // the first candidate waiting only for an in-flight slot
	overCap  int // the first candidate at its bounded-load cap
	open     int // candidates skipped for an open circuit
	budget   int // candidates skipped for a budget
}

// acquire is the admission step: it picks the candidate of the next
// attempt, walking cands from start: the first whose circuit and limits
// admit it now. When none can, it waits for the one that can soonest, at
// most Limits.MaxWait (none when !a.mayWait) and never past the context's
// deadline. It returns the candidate's index and how long it waited; the
// candidate's tokens, its in-flight count and slot are taken, to be given
// back by attempt.release.
func (r *Router) acquire(ctx context.Context, cands []candidate, start int, a admission) (int, time.Duration, error) {
	if a.trip == nil || len(r.s.budgets) == 0 {
		return r.admit(ctx, cands, start, a)
	}
	n0 := len(a.trip.res.list)
	i, waited, err := r.admit(ctx, cands, start, a)
	var picked *candidate
	if err == nil {
		picked = &cands[i]
	}
	a.trip.dropHolds(ctx, n0, picked)
	return i, waited, err
}

// admit is acquire's work, before the holds of candidates passed over are
// given back.
func (r *Router) admit(ctx context.Context, cands []candidate, start int, a admission) (int, time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return -1, 0, err // a request that cannot go out takes no tokens
	}
	now := r.s.clock.Now()
	sc := r.scan(ctx, cands, start, a, now)
	if sc.pick >= 0 {
		return sc.pick, 0, nil
	}
	if i, ok := r.takeOverCap(ctx, cands, sc, a, now); ok {
		return i, 0, nil
	}
	maxWait := r.s.maxWait
	if a.maxWait > 0 {
		maxWait = a.maxWait // a scan again after a wait (errFleetOpened)
	}
	if !a.mayWait {
		maxWait = 0
	}
	tooLong := ErrRateLimited
	if dl, ok := ctx.Deadline(); ok && dl.Sub(now) < maxWait {
		// A wait MaxWait allows is cut short by the caller's deadline: that
		// is the caller's timeout.
		maxWait, tooLong = dl.Sub(now), errWaitPastDeadline
	}
	pick, delay := -1, time.Duration(0)
	switch {
	case sc.best >= 0 && sc.bestD <= maxWait:
		pick, delay = sc.best, sc.bestD
	case sc.slotWait >= 0 && maxWait > 0:
		pick, delay = sc.slotWait, -1
	}
	if pick >= 0 {
		i, waited, err := r.await(ctx, cands, pick, delay, a, maxWait, tooLong)
		if err == errFleetOpened {
			// Scan again with what is left of the wait; the scan now
			// skips the candidate whose circuit opened. Nothing left: the
			// wait is over (a.maxWait 0 would mean a whole MaxWait).
			if maxWait-waited <= 0 {
				return -1, waited, tooLong
			}
			a.maxWait = maxWait - waited
			i, more, err := r.admit(ctx, cands, start, a)
			return i, waited + more, err
		}
		return i, waited, err
	}
	switch {
	case sc.best < 0 && sc.slotWait < 0 && sc.open > 0:
		if !a.mayWait {
			return -1, 0, ErrCircuitOpen // a hedge is never forced
		}
		i, err := r.forceSoonest(cands, a, now)
		return i, 0, err
	case tooLong != ErrRateLimited && (sc.slotWait >= 0 || (sc.best >= 0 && sc.bestD <= r.s.maxWait)):
		return -1, 0, tooLong
	case sc.best < 0 && sc.slotWait < 0 && sc.budget > 0:
		return -1, 0, ErrBudgetExceeded
	}
	return -1, 0, ErrRateLimited
}

// takeOverCap admits the first candidate at its bounded-load cap when every
// candidate that could take the request now is at its cap: the first in
// hash order takes it, as a consistent-hashing ring would.
func (r *Router) takeOverCap(ctx context.Context, cands []candidate, sc scanResult, a admission, now time.Time) (int, bool) {
	if sc.overCap < 0 || sc.best >= 0 || sc.slotWait >= 0 {
		return -1, false
	}
	c := &cands[sc.overCap]
	if r.claim(cands, c, false, a.prio) != claimed {
		return -1, false
	}
	if d, open := r.rate(ctx, a, c, now); d > 0 || open {
		c.up.unclaim()
		return -1, false
	}
	return sc.overCap, true
}

// errFleetOpened: the circuit of the candidate waited for opened during
// the wait; acquire scans the others again.
var errFleetOpened = errors.New("relay: circuit opened during the wait")

// errWaitPastDeadline: the wait for an upstream's limits would end after
// the request's deadline.
var errWaitPastDeadline = fmt.Errorf("%w: %w", ErrRateLimited, context.DeadlineExceeded)

// scan walks the candidates once and admits the first that can go now.
func (r *Router) scan(ctx context.Context, cands []candidate, start int, a admission, now time.Time) scanResult {
	sc := scanResult{pick: -1, best: -1, bestD: time.Duration(math.MaxInt64), slotWait: -1, overCap: -1}
	active := r.s.breaker.probePath != ""
	n := len(cands)
	for k := range n {
		i := (start + k) % n
		c := &cands[i]
		if (c.forced && a.tried&(1<<(i%64)) != 0) || c.up == a.exclude {
			continue
		}
		if _, isOpen := c.up.circ.openUntil(now, active); isOpen && !c.forced {
			sc.open++
			continue
		}
		if a.trip != nil && !a.trip.reserve(ctx, c, now) {
			sc.budget++
			continue
		}
		d, open := r.rate(ctx, a, c, now)
		if open {
			sc.open++
			continue
		}
		if d > 0 {
			if d < sc.bestD {
				sc.best, sc.bestD = i, d
			}
			continue
		}
		switch r.claim(cands, c, !a.retry, a.prio) {
		case claimNoSlot:
			if sc.slotWait < 0 {
				sc.slotWait = i
			}
			r.untake(ctx, a.trip, c, a.tokens, now)
			continue
		case claimOverCap:
			if sc.overCap < 0 {
				sc.overCap = i
			}
			r.untake(ctx, a.trip, c, a.tokens, now)
			continue
		}
		sc.pick = i
		return sc
	}
	return sc
}

// rate is the rate-limit step of c's admission: when requests of at
// least its priority wait for c's limits in this process, it queues
// behind them (how long until its turn would come), without asking the
// store; else take.
func (r *Router) rate(ctx context.Context, a admission, c *candidate, now time.Time) (wait time.Duration, open bool) {
	lim := &c.up.lim
	if d, behind := lim.turns.behind(a.prio, lim.charge(a.tokens, tookStore), now); behind {
		return d, false
	}
	return r.take(ctx, a, c, now)
}

// take asks the store for c's admission at now: its circuit (unless c is
// forced: then past it; in half-open, it claims the probe), its hold and
// its limits. It returns 0 when the tokens were taken (c.took says where,
// c.probe carries the probe's claim), how long until they would be there,
// or open when the circuit keeps c out. The verdict renews c's queue's
// estimate and c's view of the circuit.
func (r *Router) take(ctx context.Context, a admission, c *candidate, now time.Time) (wait time.Duration, open bool) {
	lim := &c.up.lim
	v, took := r.admitIn(ctx, a.trip, &lim.fleet, &lim.share, &lim.owed, store.Ask{Tokens: a.tokens, Force: c.forced, Probe: r.probeFor(c)}, now)
	lim.turns.record(v, lim.limitsOf(took), now)
	r.saw(a.trip, c, v, now)
	switch {
	case v.Open:
		return 0, true
	case !v.Taken:
		return max(v.Wait, 1), false
	}
	c.took, c.failing, c.probe = took, v.Failing, nil
	if v.Probe != "" {
		token := v.Probe // (a copy: the verdict itself stays on the stack)
		c.probe = &token
	}
	return 0, false
}

// untake gives back the tokens c's admission took, for a request that does
// not go to c (no slot, its circuit opened, its caller gave up): to where
// they were taken, and the waiters for them look again. A probe's claim
// taken with them ends.
func (r *Router) untake(ctx context.Context, t *trip, c *candidate, tokens int, now time.Time) {
	if c.took == tookNone {
		return
	}
	lim := &c.up.lim
	r.refundIn(ctx, t, c.up, c.took, 1, lim.charge(tokens, c.took), now)
	if c.probe != nil {
		r.outcomeIn(ctx, t, c.up, c.took, store.Outcome{Result: store.Neutral, Probe: *c.probe}, now)
		r.see(t, c.up, StateHalfOpen, now, "")
		c.probe = nil
	}
	c.took = tookNone
	lim.turns.refunded()
}

// await waits for cands[pick]: for its limits (delay >= 0) and then for an
// in-flight slot, within maxWait in all (then tooLong). Every failure
// gives back what was taken. It reports how long it waited, to
// Hooks.OnWait too.
func (r *Router) await(ctx context.Context, cands []candidate, pick int, delay time.Duration, a admission, maxWait time.Duration, tooLong error) (int, time.Duration, error) {
	clock := r.s.clock
	start := clock.Now()
	c := &cands[pick]
	i, err := r.waitFor(ctx, cands, c, delay, a, maxWait, tooLong)
	if err == nil && i < 0 {
		i = pick
	}
	waited := clock.Now().Sub(start)
	if h := r.s.hooks.OnWait; h != nil {
		reason := "rate"
		if delay < 0 {
			reason = "slot"
		}
		ev := WaitEvent{Context: ctx, Upstream: c.up.cfg.Name, Reason: reason, Wait: waited, Err: err}
		if a.trip != nil {
			a.trip.onWait(h, ev)
		} else {
			h(ev)
		}
	}
	return i, waited, err
}

// onWait calls Hooks.OnWait; a panic is kept (see trip.catch).
func (t *trip) onWait(h func(WaitEvent), ev WaitEvent) {
	defer t.catch()
	h(ev)
}

// waitFor does await's waiting, in the upstream's queues, by priority (see
// queue.go); i is -1 unless the never-empty rule forced another candidate.
// A request that waits for a slot (delay < 0: its tokens were there when
// the scan looked) asks for its tokens again once it has the slot; when
// others took them meanwhile it gives the slot back and waits for the
// tokens, then for a slot again: waiting for a slot never takes a request
// past the rate limits, and no request holds a slot while it waits for
// tokens.
func (r *Router) waitFor(ctx context.Context, cands []candidate, c *candidate, delay time.Duration, a admission, maxWait time.Duration, tooLong error) (int, error) {
	clock := r.s.clock
	lim := &c.up.lim
	start := clock.Now()
	slotFirst := delay < 0
	if slotFirst {
		if r.claim(cands, c, false, a.prio) != claimed {
			if err := lim.waitSlot(ctx, clock, a.prio, maxWait, tooLong); err != nil {
				return -1, err
			}
			c.up.inflight.Add(1)
		}
		now := clock.Now()
		d, open := r.rate(ctx, a, c, now)
		switch {
		case open:
			c.up.unclaim()
			return -1, errFleetOpened
		case d == 0:
			return -1, nil
		}
		// Others took the tokens while it waited for the slot (or a
		// request of higher priority queued for them): it gives the slot
		// back and waits for the tokens first, then for a slot, as a
		// request whose tokens were short from the start. Holding the slot
		// while it waited for tokens kept it from the requests queued
		// before it for them, which then waited for the slot: a priority
		// inversion.
		c.up.unclaim()
		maxWait -= now.Sub(start)
		if d > maxWait {
			return -1, tooLong
		}
		start = now
	}
	w := &waiter{prio: a.prio, tpm: lim.charge(a.tokens, tookStore), deadline: start.Add(maxWait).UnixNano(), tooLong: tooLong}
	if err := lim.turns.wait(ctx, clock, w, func(now time.Time) (bool, error) {
		d, open := r.take(ctx, a, c, now)
		if open {
			return false, errFleetOpened
		}
		return d == 0, nil
	}); err != nil {
		return -1, err
	}
	// A request that waited for this upstream takes it now, even past a
	// bounded-load cap: the wait already queued it there.
	if r.claim(cands, c, false, a.prio) != claimed {
		if err := lim.waitSlot(ctx, clock, a.prio, maxWait-clock.Now().Sub(start), tooLong); err != nil {
			r.untake(ctx, a.trip, c, a.tokens, clock.Now())
			return -1, err
		}
		c.up.inflight.Add(1)
	}
	now := clock.Now()
	if _, open := c.up.circ.openUntil(now, r.s.breaker.probePath != ""); open && c.probe == nil && !c.forced {
		// Its circuit opened while it waited for the slot.
		c.up.unclaim()
		r.untake(ctx, a.trip, c, a.tokens, now)
		return -1, errFleetOpened
	}
	return -1, nil
}

// forceSoonest is the never-empty rule at admission: when every candidate
// left is held out by an open circuit (circuits that opened while the
// request was routed or waited), the one whose cooldown ends first is tried
// anyway, as the plan does for a model whose upstreams are all open: past
// its circuit, not past its hold or limits. It is marked forced, so the
// attempt loop tries it once.
func (r *Router) forceSoonest(cands []candidate, a admission, now time.Time) (int, error) {
	pick := -1
	var soonest time.Time
	active := r.s.breaker.probePath != ""
	for i := range cands {
		c := &cands[i]
		if c.up == a.exclude || (c.forced && a.tried&(1<<(i%64)) != 0) {
			continue
		}
		if until, open := c.up.circ.openUntil(now, active); open && (pick < 0 || until.Before(soonest)) {
			pick, soonest = i, until
		}
	}
	if pick < 0 {
		return -1, ErrCircuitOpen
	}
	c := &cands[pick]
	ctx := context.Background()
	if a.trip != nil && !a.trip.reserve(ctx, c, now) {
		return -1, ErrBudgetExceeded // (the forced try does not fit the budget: a refusal, not a circuit)
	}
	if r.claim(cands, c, false, a.prio) != claimed {
		return -1, ErrCircuitOpen
	}
	c.forced = true
	if d, _ := r.take(ctx, a, c, now); d > 0 {
		c.forced = false
		c.up.unclaim()
		return -1, ErrCircuitOpen
	}
	return pick, nil
}

// Outcomes of claim.
const (
	claimed = iota
	claimNoSlot
	claimOverCap
)

// claim takes an in-flight count and slot on c's upstream. Under bounded
// loads with capped set, it refuses when the upstream is at its cap; the
// check and the count are one compare-and-swap, so concurrent requests
// cannot all slip under the cap.
func (r *Router) claim(cands []candidate, c *candidate, capped bool, p Priority) int {
	u := c.up
	if !u.lim.trySlot(p) {
		return claimNoSlot
	}
	if capped && (r.s.strategy == StrategyBoundedLoad || r.s.strategy == StrategyExpectedCost) && !c.forced {
		limit := r.boundedCap(cands, c.model)
		for {
			cur := u.inflight.Load()
			if cur >= limit {
				u.lim.release()
				return claimOverCap
			}
			if u.inflight.CompareAndSwap(cur, cur+1) {
				return claimed
			}
		}
	}
	u.inflight.Add(1)
	return claimed
}
