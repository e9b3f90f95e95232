package relay

import (
	"context"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tokenrelay/relay/store"
)

// limiter is what the router keeps of one upstream's limits: their
// values, for the store (Upstream.RPM and TPM, and this replica's share of
// them), its in-flight cap (Limits), and the queues of this
// process's requests that wait for them (queue.go). The limits
// themselves are kept by the store.
//
// The values are those of one configuration; the slots and the queues are
// what the router learned, which Router.Update carries to the next one.
type limiter struct {
	fleet   store.Limits // the upstream's, as every replica gives them to the store
	share   store.Limits // this replica's share (Replicas), for the local share
	slots   *slots       // nil: no in-flight cap
	*queues              // the upstream's, whatever its configuration
}

// queues are the requests waiting for an upstream's limits, and what its
// local share owes the shared store.
type queues struct {
	turns turns // the requests waiting for the limits
	owed  owed  // what the local share admitted, not yet told to the shared store
}

// init sets the limiter up with its queues q. was is the slots of the
// configuration before, if it had a cap: a cap that stays keeps them (the
// requests holding and waiting for slots), at its new size.
func (l *limiter) init(name string, rpm, tpm, replicas, maxInFlight int, q *queues, was *slots) {
	l.fleet = store.Limits{Name: name, RPM: rpm, TPM: tpm}
	l.share = store.Limits{Name: name, RPM: shareOf(rpm, replicas), TPM: shareOf(tpm, replicas)}
	l.queues = q
	switch {
	case maxInFlight > 0 && was != nil:
		was.resize(maxInFlight)
		l.slots = was
	case maxInFlight > 0:
		l.slots = &slots{cap: maxInFlight}
	case was != nil:
		was.resize(math.MaxInt) // no cap now: the requests of the configuration before wait for none
	}
}

// limitsOf returns the limits the tokens were taken from (took).
func (l *limiter) limitsOf(took uint8) *store.Limits {
	if took == tookShare {
		return &l.share
	}
	return &l.fleet
}

// charge returns a request's TPM charge on the limits it was taken from,
// clamped to the bucket, as the store clamps it.
func (l *limiter) charge(tokens int, took uint8) int {
	if tpm := l.limitsOf(took).TPM; tpm > 0 {
		return min(max(tokens, 1), tpm)
	}
	return 0
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

// maxHold429 caps the hold a 429's Retry-After puts on an upstream, so an
// absurd hint does not take it out for a day.
const maxHold429 = time.Minute

// holdOf reads an upstream's rate-limit headers: a 429 holds it for its
// Retry-After, and a remaining count of 0 holds it until its reset. It
// returns the hold's end, zero when none.
func holdOf(resp *http.Response, now time.Time) (until time.Time) {
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
	return until
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
