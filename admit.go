package relay

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
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
	tk       ticket
	best     int // the candidate whose limits clear soonest; -1 if none
	bestD    time.Duration
	slotWait int // the first candidate waiting only for an in-flight slot
	overCap  int // the first candidate at its bounded-load cap
	open     int // candidates skipped for an open circuit
	budget   int // candidates skipped for a budget
}

// acquire is the admission step: it picks the candidate of the next
// attempt, walking cands from start: the first whose breaker admits it and
// whose limits can take the request now. When none can, it waits for the
// one that can soonest, at most Limits.MaxWait (none when !a.mayWait) and
// never past the context's deadline. It returns the candidate's index, the
// breaker's ticket and how long it waited; the candidate's tokens, its
// in-flight count and slot are taken, to be given back by attempt.release.
func (r *Router) acquire(ctx context.Context, cands []candidate, start int, a admission) (int, ticket, time.Duration, error) {
	if a.trip == nil || len(r.s.budgets) == 0 {
		return r.admit(ctx, cands, start, a)
	}
	n0 := len(a.trip.res.list)
	i, tk, waited, err := r.admit(ctx, cands, start, a)
	var picked *candidate
	if err == nil {
		picked = &cands[i]
	}
	a.trip.dropHolds(ctx, n0, picked)
	return i, tk, waited, err
}

// admit is acquire's work, before the holds of candidates passed over are
// given back.
func (r *Router) admit(ctx context.Context, cands []candidate, start int, a admission) (int, ticket, time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return -1, ticket{}, 0, err // a request that cannot go out takes no tokens
	}
	now := r.s.clock.Now()
	sc := r.scan(ctx, cands, start, a, now)
	if sc.pick >= 0 {
		return sc.pick, sc.tk, 0, nil
	}
	if i, tk, ok := r.takeOverCap(ctx, cands, sc, a, now); ok {
		return i, tk, 0, nil
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
		i, tk, waited, err := r.await(ctx, cands, pick, delay, a, maxWait, tooLong)
		if err == errFleetOpened {
			// Scan again with what is left of the wait; the scan now
			// skips the candidate the fleet opened. Nothing left: the
			// wait is over (a.maxWait 0 would mean a whole MaxWait).
			if maxWait-waited <= 0 {
				return -1, ticket{}, waited, tooLong
			}
			a.maxWait = maxWait - waited
			i, tk, more, err := r.admit(ctx, cands, start, a)
			return i, tk, waited + more, err
		}
		return i, tk, waited, err
	}
	switch {
	case sc.best < 0 && sc.slotWait < 0 && sc.open > 0:
		if !a.mayWait {
			return -1, ticket{}, 0, ErrCircuitOpen // a hedge is never forced
		}
		i, tk, err := r.forceSoonest(cands, a, now)
		return i, tk, 0, err
	case tooLong != ErrRateLimited && (sc.slotWait >= 0 || (sc.best >= 0 && sc.bestD <= r.s.maxWait)):
		return -1, ticket{}, 0, tooLong
	case sc.best < 0 && sc.slotWait < 0 && sc.budget > 0:
		return -1, ticket{}, 0, ErrBudgetExceeded
	}
	return -1, ticket{}, 0, ErrRateLimited
}

// takeOverCap admits the first candidate at its bounded-load cap when every
// candidate that could take the request now is at its cap: the first in
// hash order takes it, as a consistent-hashing ring would.
func (r *Router) takeOverCap(ctx context.Context, cands []candidate, sc scanResult, a admission, now time.Time) (int, ticket, bool) {
	if sc.overCap < 0 || sc.best >= 0 || sc.slotWait >= 0 {
		return -1, ticket{}, false
	}
	c := &cands[sc.overCap]
	tpm := c.up.lim.charge(a.tokens)
	d, taken, open := r.rate(ctx, a, c, tpm, now)
	if d > 0 || open {
		return -1, ticket{}, false
	}
	if r.claim(cands, c, false, a.prio) != claimed {
		r.untake(ctx, a, c, now, taken)
		return -1, ticket{}, false
	}
	tk, ok := c.up.br.allow(now, c.forced, a.trip)
	if !ok {
		c.up.unclaim()
		r.untake(ctx, a, c, now, taken)
		return -1, ticket{}, false
	}
	if !taken {
		c.up.lim.take(now, tpm)
	}
	c.fleetTPM = taken
	return sc.overCap, tk, true
}

// errFleetOpened: the candidate waited for was opened for the fleet
// (shared State) during the wait; acquire scans the others again.
var errFleetOpened = errors.New("relay: circuit opened for the fleet during the wait")

// errWaitPastDeadline: the wait for an upstream's limits would end after
// the request's deadline.
var errWaitPastDeadline = fmt.Errorf("%w: %w", ErrRateLimited, context.DeadlineExceeded)

// scan walks the candidates once and admits the first that can go now.
func (r *Router) scan(ctx context.Context, cands []candidate, start int, a admission, now time.Time) scanResult {
	sc := scanResult{pick: -1, best: -1, bestD: time.Duration(math.MaxInt64), slotWait: -1, overCap: -1}
	n := len(cands)
	for k := range n {
		i := (start + k) % n
		c := &cands[i]
		if (c.forced && a.tried&(1<<(i%64)) != 0) || c.up == a.exclude {
			continue
		}
		if !c.forced {
			if _, isOpen := c.up.br.openUntil(now); isOpen {
				sc.open++
				continue
			}
		}
		if a.trip != nil && !a.trip.reserve(ctx, c, now) {
			sc.budget++
			continue
		}
		tpm := c.up.lim.charge(a.tokens)
		d, taken, open := r.rate(ctx, a, c, tpm, now)
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
			r.untake(ctx, a, c, now, taken)
			continue
		case claimOverCap:
			if sc.overCap < 0 {
				sc.overCap = i
			}
			r.untake(ctx, a, c, now, taken)
			continue
		}
		tk, ok := c.up.br.allow(now, c.forced, a.trip)
		if !ok {
			c.up.unclaim()
			r.untake(ctx, a, c, now, taken)
			sc.open++
			continue
		}
		if !taken {
			c.up.lim.take(now, tpm)
		}
		c.fleetTPM = taken
		sc.pick, sc.tk = i, tk
		return sc
	}
	return sc
}

// await waits for cands[pick]: for its buckets to clear (delay >= 0, the
// tokens reserved now, so that requests arriving during the wait queue
// behind this one) and then for an in-flight slot, within maxWait in all
// (then tooLong). Every failure gives the tokens back. It reports how long
// it waited, to Hooks.OnWait too.
func (r *Router) await(ctx context.Context, cands []candidate, pick int, delay time.Duration, a admission, maxWait time.Duration, tooLong error) (int, ticket, time.Duration, error) {
	clock := r.s.clock
	start := clock.Now()
	c := &cands[pick]
	i, tk, err := r.waitFor(ctx, cands, c, delay, a, maxWait, tooLong)
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
	return i, tk, waited, err
}

// onWait calls Hooks.OnWait; a panic is kept (see trip.catch).
func (t *trip) onWait(h func(WaitEvent), ev WaitEvent) {
	defer t.catch()
	h(ev)
}

// waitFor does await's waiting, in the upstream's queues, by priority (see
// queue.go); i is -1 unless the never-empty rule forced another candidate.
// Tokens are taken when the wait ends, and given back if the request does
// not go. A request that waits for a slot (delay < 0: its tokens were there
// when the scan looked) asks for its tokens again once it has the slot;
// when others took them meanwhile it gives the slot back and waits for
// the tokens, then for a slot again: waiting for a slot never takes a
// request past the rate limits, and no request holds a slot while it
// waits for tokens.
func (r *Router) waitFor(ctx context.Context, cands []candidate, c *candidate, delay time.Duration, a admission, maxWait time.Duration, tooLong error) (int, ticket, error) {
	clock := r.s.clock
	lim := &c.up.lim
	tpm := lim.charge(a.tokens)
	start := clock.Now()
	slotFirst := delay < 0
	if slotFirst {
		if r.claim(cands, c, false, a.prio) != claimed {
			if err := lim.waitSlot(ctx, clock, a.prio, maxWait, tooLong); err != nil {
				return -1, ticket{}, err
			}
			c.up.inflight.Add(1)
		}
		now := clock.Now()
		d, taken, open := r.rate(ctx, a, c, tpm, now)
		switch {
		case open:
			c.up.unclaim()
			return -1, ticket{}, errFleetOpened
		case taken || d == 0:
			if !taken {
				lim.take(now, tpm)
			}
			return r.admitAfterWait(ctx, cands, c, a, tpm, taken, now)
		}
		// Others took the tokens while it waited for the slot (or a
		// request of higher priority queued for them): it gives the slot
		// back and waits for the tokens first, then for a slot, as a
		// request whose tokens were short from the start. Holding the slot
		// while it waited for tokens kept it from the requests queued
		// before it for them, which then waited for the slot: a priority
		// inversion.
		c.up.unclaim()
		delay, maxWait = d, maxWait-now.Sub(start)
		if delay > maxWait {
			return -1, ticket{}, tooLong
		}
		start, slotFirst = now, false
	}
	shared := r.s.state != nil
	if shared {
		fellBack, err := r.waitShared(ctx, a, c, tpm, delay, maxWait, tooLong)
		if err != nil && slotFirst {
			c.up.unclaim()
		}
		if err == ErrCircuitOpen {
			// c's circuit opened for the fleet while we waited: the
			// others may still take the request (acquire scans again).
			return -1, ticket{}, errFleetOpened
		}
		if err != nil {
			return -1, ticket{}, err
		}
		shared = !fellBack
	}
	if !shared {
		w := &waiter{prio: a.prio, tpm: tpm, deadline: start.Add(maxWait), tooLong: tooLong}
		if err := lim.waitRate(ctx, clock, w); err != nil {
			if slotFirst {
				c.up.unclaim()
			}
			return -1, ticket{}, err
		}
	}
	// A request that waited for this upstream takes it now, even past a
	// bounded-load cap: the wait already queued it there.
	if !slotFirst && r.claim(cands, c, false, a.prio) != claimed {
		if err := lim.waitSlot(ctx, clock, a.prio, maxWait-clock.Now().Sub(start), tooLong); err != nil {
			r.giveTokens(ctx, a, c, tpm, shared, clock.Now())
			return -1, ticket{}, err
		}
		c.up.inflight.Add(1)
	}
	return r.admitAfterWait(ctx, cands, c, a, tpm, shared, clock.Now())
}

// admitAfterWait is the end of waitFor: c holds a slot and its tokens
// (from the fleet's limits when fleet is set); the breaker decides.
func (r *Router) admitAfterWait(ctx context.Context, cands []candidate, c *candidate, a admission, tpm int, fleet bool, now time.Time) (int, ticket, error) {
	tk, ok := c.up.br.allow(now, c.forced, a.trip)
	if !ok { // its circuit opened while we waited
		c.up.unclaim()
		r.giveTokens(ctx, a, c, tpm, fleet, now)
		return r.forceSoonest(cands, a, now)
	}
	c.fleetTPM = fleet
	return -1, tk, nil
}

// giveTokens gives back the tokens a request took for c and does not use:
// to the fleet's limits when it took them there, else to the in-process
// ones.
func (r *Router) giveTokens(ctx context.Context, a admission, c *candidate, tpm int, fleet bool, now time.Time) {
	if fleet {
		r.refundShared(ctx, a.trip, c.up, 1, fleetCharge(a.tokens, c.up), now)
		return
	}
	c.up.lim.giveBack(r.s.clock, now, tpm)
}

// forceSoonest is the never-empty rule at admission: when every candidate
// left is held out by an open circuit (circuits that opened while the
// request was routed or waited), the one whose cooldown ends first is tried
// anyway, as the plan does for a model whose upstreams are all open. It is
// marked forced, so the attempt loop tries it once.
func (r *Router) forceSoonest(cands []candidate, a admission, now time.Time) (int, ticket, error) {
	pick := -1
	var soonest time.Time
	for i := range cands {
		c := &cands[i]
		if c.up == a.exclude || (c.forced && a.tried&(1<<(i%64)) != 0) {
			continue
		}
		until, open := c.up.br.openUntil(now)
		if !open && c.fleetOpen.After(now) {
			until, open = c.fleetOpen, true // open for the fleet (shared State)
		}
		if open && (pick < 0 || until.Before(soonest)) {
			pick, soonest = i, until
		}
	}
	if pick < 0 {
		return -1, ticket{}, ErrCircuitOpen
	}
	c := &cands[pick]
	tpm := c.up.lim.charge(a.tokens)
	if a.trip != nil && !a.trip.reserve(context.Background(), c, now) {
		return -1, ticket{}, ErrBudgetExceeded // (the forced try does not fit the budget: a refusal, not a circuit)
	}
	if r.claim(cands, c, false, a.prio) != claimed {
		return -1, ticket{}, ErrCircuitOpen
	}
	c.forced = true
	// A shared State admits the forced candidate past the fleet's circuit
	// (not past its limits); in-process, the local limiter does.
	d, taken := c.up.lim.delay(now, tpm), false
	if r.s.state != nil {
		d, taken, _ = r.rate(context.Background(), a, c, tpm, now)
	}
	if d > 0 {
		c.forced = false
		c.up.unclaim()
		return -1, ticket{}, ErrCircuitOpen
	}
	tk, _ := c.up.br.allow(now, true, a.trip)
	if !taken {
		c.up.lim.take(now, tpm)
	}
	c.fleetTPM = taken
	return pick, tk, nil
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
	if capped && r.s.strategy == StrategyBoundedLoad && !c.forced {
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
