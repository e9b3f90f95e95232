package relay

import (
	"context"
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// LimitConfig configures backpressure. Per-upstream rates and caps are in
// Upstream (RPM, TPM, MaxInFlight).
//
// Each upstream's RPM and TPM are token buckets (golang.org/x/time/rate)
// that refill continuously and hold at most one minute's quota. A request
// takes one request token and a TPM charge of its prompt tokens plus its max
// output tokens (DefaultMaxTokens when it sets none), clamped to the bucket
// size. The router tries candidates in order and takes the first that can
// serve the request now; when none can, it waits for the one that can serve
// soonest, at most MaxWait and never past the request's context; when that
// is too long for all of them, RoundTrip fails with ErrRateLimited and no
// upstream is called.
//
// The upstream's own word counts too: x-ratelimit-remaining-requests or
// -tokens of 0 hold the upstream until x-ratelimit-reset-requests or
// -tokens (Go durations such as "6m0s", "120ms"; at most an hour); a 429
// holds it for its Retry-After (1 s when it gives none, a minute at most). A
// hold affects that upstream only, never the whole model.
type LimitConfig struct {
	// MaxWait bounds the wait for an upstream's rate-limit tokens or
	// in-flight slot. If 0, 2 s; negative means never wait.
	MaxWait time.Duration
	// DefaultMaxTokens is the output-token estimate in a request's TPM
	// charge when it sets no max tokens. If 0, 1024.
	DefaultMaxTokens int
}

// limiter holds the rate limits of one upstream. The rate.Limiters have
// their own locks; hold and the slot channel are lock-free.
type limiter struct {
	rpm, tpm *rate.Limiter // nil: no limit
	slots    chan struct{} // nil: no in-flight cap
	hold     atomic.Int64  // unix nanoseconds until which the upstream asked to be left alone
}

func (l *limiter) init(u *Upstream, r *Router) {
	if u.RPM > 0 {
		l.rpm = rate.NewLimiter(rate.Limit(float64(u.RPM)/60), u.RPM)
	}
	if u.TPM > 0 {
		l.tpm = rate.NewLimiter(rate.Limit(float64(u.TPM)/60), u.TPM)
	}
	if u.MaxInFlight > 0 {
		l.slots = make(chan struct{}, u.MaxInFlight)
	}
}

// charge returns a request's TPM charge, clamped to the bucket size.
func (l *limiter) charge(tokens int) int {
	if l.tpm == nil {
		return 0
	}
	return min(max(tokens, 1), l.tpm.Burst())
}

// delay returns how long the upstream needs before it can take a request
// charging tpm tokens: the longest of its hold, its RPM wait and its TPM wait.
func (l *limiter) delay(now time.Time, tpm int) time.Duration {
	var d time.Duration
	if h := l.hold.Load(); h > now.UnixNano() {
		d = time.Duration(h - now.UnixNano())
	}
	d = max(d, bucketDelay(l.rpm, now, 1), bucketDelay(l.tpm, now, tpm))
	return d
}

func bucketDelay(lim *rate.Limiter, now time.Time, n int) time.Duration {
	if lim == nil {
		return 0
	}
	have := lim.TokensAt(now)
	if have >= float64(n) {
		return 0
	}
	return time.Duration(math.Ceil((float64(n) - have) / float64(lim.Limit()) * float64(time.Second)))
}

// take removes the request's tokens at now. The caller has checked that they
// are there or has waited for them.
func (l *limiter) take(now time.Time, tpm int) {
	// AllowN, unlike ReserveN, does not allocate. It can only fail if
	// concurrent requests took the tokens since delay looked; those requests
	// then go anyway: an overshoot of at most the number of requests racing
	// for the same bucket at that instant.
	if l.rpm != nil {
		l.rpm.AllowN(now, 1)
	}
	if l.tpm != nil {
		l.tpm.AllowN(now, tpm)
	}
}

// trySlot takes an in-flight slot without waiting.
func (l *limiter) trySlot() bool {
	if l.slots == nil {
		return true
	}
	select {
	case l.slots <- struct{}{}:
		return true
	default:
		return false
	}
}

func (l *limiter) release() {
	if l.slots != nil {
		<-l.slots
	}
}

// observe applies an upstream's rate-limit headers: a 429 holds it for its
// Retry-After, and a remaining count of 0 holds it until its reset.
func (l *limiter) observe(resp *http.Response, now time.Time) {
	if resp == nil {
		return
	}
	var until time.Time
	if resp.StatusCode == http.StatusTooManyRequests {
		d, ok := RetryAfter(resp.Header, now)
		if !ok {
			d = time.Second
		}
		until = now.Add(min(d, maxHold429))
	}
	for _, k := range [...][2]string{
		{"X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests"},
		{"X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens"},
	} {
		if headerValue(resp.Header, k[0]) != "0" {
			continue
		}
		if d, ok := parseReset(headerValue(resp.Header, k[1])); ok && now.Add(d).After(until) {
			until = now.Add(d)
		}
	}
	if until.IsZero() {
		return
	}
	for {
		old := l.hold.Load()
		if old >= until.UnixNano() || l.hold.CompareAndSwap(old, until.UnixNano()) {
			return
		}
	}
}

// maxHold429 caps the hold a 429's Retry-After puts on an upstream, so an
// absurd hint does not take it out for a day.
const maxHold429 = time.Minute

// headerValue is h.Get(key) for a key already in canonical form, without
// canonicalising it again (responses from net/http have canonical keys).
func headerValue(h http.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// parseReset parses an x-ratelimit-reset-* value: a Go duration ("6m0s",
// "120ms", "1s") or a plain number of seconds. Values over an hour are
// distrusted and capped.
func parseReset(v string) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		s, err := strconv.ParseFloat(v, 64)
		if err != nil || s < 0 || math.IsNaN(s) {
			return 0, false
		}
		d = time.Duration(s * float64(time.Second))
	}
	if d < 0 {
		return 0, false
	}
	return min(d, time.Hour), true
}

// waitSlot waits for an in-flight slot of l, at most d.
func waitSlot(ctx context.Context, c Clock, l *limiter, d time.Duration) error {
	timeout := make(chan struct{})
	stop := c.AfterFunc(d, func() { close(timeout) })
	defer stop()
	select {
	case l.slots <- struct{}{}:
		return nil
	case <-timeout:
		return ErrRateLimited
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ErrCircuitOpen: every candidate's circuit opened while the request was
// being routed, and no response was obtained.
var ErrCircuitOpen = errors.New("relay: every candidate's circuit is open")

// acquire picks the candidate of the next attempt, walking cands from start:
// the first whose breaker admits it and whose limits can take the request
// now. When none can, it waits for the one that can soonest, at most MaxWait
// (none when mayWait is false) and never past the context's deadline.
// Forced candidates already tried (bits of tried) are skipped. It returns
// the candidate's index and the breaker's ticket; the candidate's tokens, its
// in-flight count and slot are taken, to be given back by attempt.release.
func (t *trip) acquire(ctx context.Context, cands []candidate, start int, tried uint64, mayWait bool) (int, ticket, error) {
	r := t.r
	now := r.clock.Now()
	tokens := t.c.req.PromptTokens + r.defaultMaxTokens
	if t.c.req.MaxTokens > 0 {
		tokens = t.c.req.PromptTokens + t.c.req.MaxTokens
	}
	n := len(cands)
	best, bestD, slotWait, over, open := -1, time.Duration(math.MaxInt64), -1, -1, 0
	for k := range n {
		i := (start + k) % n
		c := &cands[i]
		if (c.forced && tried&(1<<(i%64)) != 0) || c.up == t.exclude {
			continue
		}
		if !c.forced {
			if _, isOpen := c.up.br.openUntil(now); isOpen {
				open++
				continue
			}
		}
		lim := &c.up.lim
		tpm := lim.charge(tokens)
		if d := lim.delay(now, tpm); d > 0 {
			if d < bestD {
				best, bestD = i, d
			}
			continue
		}
		switch r.claim(cands, c, true) {
		case claimNoSlot:
			if slotWait < 0 {
				slotWait = i
			}
			continue
		case claimOverCap:
			if over < 0 {
				over = i
			}
			continue
		}
		tk, ok := c.up.br.allow(now, c.forced)
		if !ok {
			c.up.unclaim()
			open++
			continue
		}
		lim.take(now, tpm)
		return i, tk, nil
	}
	if over >= 0 && best < 0 && slotWait < 0 {
		// Every candidate that could take the request now is at its
		// bounded-load cap: the first in hash order takes it, as a
		// consistent-hashing ring would.
		c := &cands[over]
		if r.claim(cands, c, false) == claimed {
			if tk, ok := c.up.br.allow(now, c.forced); ok {
				c.up.lim.take(now, c.up.lim.charge(tokens))
				return over, tk, nil
			}
			c.up.unclaim()
		}
	}
	maxWait := r.maxWait
	if !mayWait {
		maxWait = 0
	}
	if dl, ok := ctx.Deadline(); ok {
		maxWait = min(maxWait, dl.Sub(now))
	}
	pick := -1
	switch {
	case best >= 0 && bestD <= maxWait:
		pick = best
	case slotWait >= 0 && maxWait > 0:
		pick = slotWait
	case best < 0 && slotWait < 0 && open > 0:
		return -1, ticket{}, ErrCircuitOpen
	default:
		return -1, ticket{}, ErrRateLimited
	}
	c := &cands[pick]
	lim := &c.up.lim
	tpm := lim.charge(tokens)
	// Reserve now, so requests arriving during the wait queue behind this
	// one; every failure below gives the tokens back.
	var rs [2]*rate.Reservation
	wait := time.Duration(0)
	if pick == best {
		wait = bestD // the hold, if any
		if lim.rpm != nil {
			rs[0] = lim.rpm.ReserveN(now, 1)
			wait = max(wait, rs[0].DelayFrom(now))
		}
		if lim.tpm != nil {
			rs[1] = lim.tpm.ReserveN(now, tpm)
			wait = max(wait, rs[1].DelayFrom(now))
		}
	}
	giveBack := func() {
		at := r.clock.Now()
		for _, res := range rs {
			if res != nil {
				res.CancelAt(at)
			}
		}
	}
	if err := sleep(ctx, r.clock, wait); err != nil {
		giveBack()
		return -1, ticket{}, err
	}
	// A request that waited for this upstream takes it now, even past a
	// bounded-load cap: the wait already queued it there.
	if r.claim(cands, c, false) != claimed {
		if err := waitSlot(ctx, r.clock, lim, maxWait-wait); err != nil {
			giveBack()
			return -1, ticket{}, err
		}
		c.up.inflight.Add(1)
	}
	now = r.clock.Now()
	tk, ok := c.up.br.allow(now, c.forced)
	if !ok { // its circuit opened while we waited
		c.up.unclaim()
		giveBack()
		return -1, ticket{}, ErrCircuitOpen
	}
	if pick != best {
		lim.take(now, tpm)
	}
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
func (r *Router) claim(cands []candidate, c *candidate, capped bool) int {
	u := c.up
	if !u.lim.trySlot() {
		return claimNoSlot
	}
	if capped && r.strategy == StrategyBoundedLoad && !c.forced {
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

// unclaim gives back what claim took.
func (u *upstream) unclaim() {
	u.inflight.Add(-1)
	u.lim.release()
}
