package relay

import (
	"context"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// limiter holds the rate limits of one upstream (LimitConfig describes
// them): RPM and TPM token buckets, an in-flight cap, a hold learned from
// the upstream's own headers, and the queues of requests waiting for them
// (queue.go). The rate.Limiters have their own locks; the hold is
// lock-free.
type limiter struct {
	rpm, tpm *rate.Limiter // nil: no limit
	tpmBurst int           // tpm's burst, which never changes (Burst takes its lock)
	slots    *slots        // nil: no in-flight cap
	hold     atomic.Int64  // unix nanoseconds until which the upstream asked to be left alone
	rq       queue         // requests waiting for the buckets
	turns    turns         // requests waiting for the fleet's buckets (shared State)
	latest   atomic.Int64  // unix nanoseconds of the latest change to the buckets (see at)
}

// at is the time the buckets are changed at: now, or the latest time they
// were changed at if that is later. x/time/rate given an earlier time than
// its last moves its last back and counts the refill since then again,
// making tokens; a time read before a slow call (a shared ledger's round
// trip, a hedge's losing body) would be such a time.
func (l *limiter) at(now time.Time) time.Time {
	n := now.UnixNano()
	for {
		last := l.latest.Load()
		if n <= last {
			if n == last {
				return now
			}
			return time.Unix(0, last)
		}
		if l.latest.CompareAndSwap(last, n) {
			return now
		}
	}
}

func (l *limiter) init(rpm, tpm, maxInFlight int) {
	if rpm > 0 {
		l.rpm = rate.NewLimiter(rate.Limit(float64(rpm)/60), rpm)
	}
	if tpm > 0 {
		l.tpm = rate.NewLimiter(rate.Limit(float64(tpm)/60), tpm)
		l.tpmBurst = tpm
	}
	if maxInFlight > 0 {
		l.slots = &slots{cap: maxInFlight}
	}
}

// charge returns a request's TPM charge, clamped to the bucket size.
func (l *limiter) charge(tokens int) int {
	if l.tpm == nil {
		return 0
	}
	return min(max(tokens, 1), l.tpmBurst)
}

// delay returns how long the upstream needs before it can take a request
// charging tpm tokens: the longest of its hold, its RPM wait and its TPM wait.
func (l *limiter) delay(now time.Time, tpm int) time.Duration {
	var d time.Duration
	if h := l.hold.Load(); h > now.UnixNano() {
		d = time.Duration(h - now.UnixNano())
	}
	return max(d, bucketDelay(l.rpm, now, 1), bucketDelay(l.tpm, now, tpm))
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
	now = l.at(now)
	if l.rpm != nil {
		l.rpm.AllowN(now, 1)
	}
	if l.tpm != nil {
		l.tpm.AllowN(now, tpm)
	}
}

// refund gives back what take took, for a call that never went out.
// (x/time/rate takes a negative count as a return of tokens, capped at the
// bucket size on its next use; TestLimiterRefund holds it to that.)
func (l *limiter) refund(now time.Time, tpm int) {
	now = l.at(now)
	if l.rpm != nil {
		l.rpm.AllowN(now, -1)
	}
	if l.tpm != nil {
		l.tpm.AllowN(now, -tpm)
	}
}

// giveBack refunds, and serves the rate queue's head if the tokens given
// back are what it waits for (it would otherwise wait for its timer).
func (l *limiter) giveBack(c Clock, now time.Time, tpm int) {
	l.refund(now, tpm)
	l.wake(c)
}

// giveBackTPM is giveBack for TPM tokens alone (a request's charge it did
// not use).
func (l *limiter) giveBackTPM(c Clock, now time.Time, tpm int) {
	if l.tpm == nil {
		return
	}
	l.tpm.AllowN(l.at(now), -tpm)
	l.wake(c)
}

// wake serves the rate queue's head, if a request waits there.
func (l *limiter) wake(c Clock) {
	if l.rq.n.Load() > 0 {
		l.pump(c)
	}
}

// trySlot takes an in-flight slot without waiting.
func (l *limiter) trySlot(p Priority) bool {
	return l.slots == nil || l.slots.try(p)
}

// waitSlot waits for an in-flight slot, at most d; then it returns tooLong.
func (l *limiter) waitSlot(ctx context.Context, c Clock, p Priority, d time.Duration, tooLong error) error {
	return l.slots.wait(ctx, c, p, d, tooLong)
}

// release gives an in-flight slot back.
func (l *limiter) release() {
	if l.slots != nil {
		l.slots.release()
	}
}

// queued returns how long a request of priority p charging tpm would wait
// behind the requests of at least its priority already queued for the
// buckets (0 when none is): the time the buckets take to give them all,
// and it, their tokens. It makes the upstream a request waits for the one
// that serves it soonest, queues included, not the one whose bucket refills
// first.
func (l *limiter) queued(now time.Time, tpm int, p Priority) time.Duration {
	if l.rq.n.Load() == 0 {
		return 0
	}
	l.rq.mu.Lock()
	defer l.rq.mu.Unlock()
	n, tokens := 1.0, float64(tpm)
	for _, w := range l.rq.h {
		if w.prio >= p {
			n++
			tokens += float64(w.tpm)
		}
	}
	if n == 1 {
		return 0
	}
	var hold time.Duration
	if h := l.hold.Load(); h > now.UnixNano() {
		hold = time.Duration(h - now.UnixNano())
	}
	return max(hold, bucketETA(l.rpm, now, n), bucketETA(l.tpm, now, tokens))
}

// ahead reports whether requests of at least priority p wait for the
// buckets: a request of priority p that finds tokens must queue behind them.
func (l *limiter) ahead(p Priority) bool {
	if l.rq.n.Load() == 0 {
		return false
	}
	l.rq.mu.Lock()
	defer l.rq.mu.Unlock()
	return l.rq.ahead(p)
}

// maxHold429 caps the hold a 429's Retry-After puts on an upstream, so an
// absurd hint does not take it out for a day.
const maxHold429 = time.Minute

// observe applies an upstream's rate-limit headers: a 429 holds it for its
// Retry-After, and a remaining count of 0 holds it until its reset. It
// returns the hold's end, zero when none.
func (l *limiter) observe(resp *http.Response, now time.Time) (until time.Time) {
	if resp == nil {
		return
	}
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
			return until
		}
	}
}

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
		if s >= time.Hour.Seconds() {
			return time.Hour, true // (converted, a huge one would overflow)
		}
		d = time.Duration(s * float64(time.Second))
	}
	if d < 0 {
		return 0, false
	}
	return min(d, time.Hour), true
}
