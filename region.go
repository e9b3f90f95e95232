package relay

import (
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// upstream is an Upstream with its runtime state.
type upstream struct {
	cfg    *Upstream
	base   *url.URL
	auth   func() string   // "Bearer <key>"; nil keeps the caller's Authorization
	models map[string]bool // nil: every model
	tags   []bodyTag
	factor float64 // price factor, 1 for list price
	clock  Clock

	inflight atomic.Int64
	lat      latencyWindow
	br       breaker
	lim      limiter
}

func (u *upstream) initRuntime(r *Router) {
	u.clock = r.clock
	u.lat.init(latencyWindowSize)
	u.br.init(u, r)
	u.lim.init(u.cfg, r)
}

func (u *upstream) serves(model string) bool {
	return u.models == nil || model == "" || u.models[model]
}

// busy reports whether the upstream is saturated (MaxInFlight reached) or
// its recent p99 latency is over the router's busy bound.
func (u *upstream) busy() bool {
	if m := u.cfg.MaxInFlight; m > 0 && u.inflight.Load() >= int64(m) {
		return true
	}
	return u.lat.p99() > u.br.busyP99
}

// candidate is one place to send a request: an upstream and the model to ask
// it for.
type candidate struct {
	up     *upstream
	model  string
	forced bool // its circuit is open, but it is the model's soonest to recover
}

// plan lists the candidates for a route in the order to try them: the
// upstreams serving the route's model, then those of each fallback model.
// Open circuits are skipped, except that a model whose every upstream is open
// still gets the one whose cooldown ends first, so a pool never runs empty.
func (r *Router) plan(buf []candidate, model string, fallbacks []string) []candidate {
	out := buf[:0]
	now := r.clock.Now()
	out = r.appendCandidates(out, model, now)
	for _, fb := range fallbacks {
		if fb == "" || fb == model || slices.ContainsFunc(out, func(c candidate) bool { return c.model == fb }) {
			continue
		}
		out = r.appendCandidates(out, fb, now)
	}
	return out
}

func (r *Router) appendCandidates(out []candidate, model string, now time.Time) []candidate {
	start := len(out)
	var soonest *upstream
	var soonestAt time.Time
	for _, u := range r.ups {
		if !u.serves(model) {
			continue
		}
		if at, open := u.br.openUntil(now); open {
			if soonest == nil || at.Before(soonestAt) {
				soonest, soonestAt = u, at
			}
			continue
		}
		out = append(out, candidate{up: u, model: model})
	}
	if len(out) == start && soonest != nil {
		out = append(out, candidate{up: soonest, model: model, forced: true})
	}
	return out
}

// latencyWindowSize is the number of recent latencies kept per upstream.
const latencyWindowSize = 200

// latencyWindow keeps the last n latencies of an upstream and their p99,
// recomputed lazily.
type latencyWindow struct {
	mu      sync.Mutex
	ring    []time.Duration
	next    int
	full    bool
	dirty   int // samples added since p99 was computed
	cached  time.Duration
	scratch []time.Duration
}

func (w *latencyWindow) init(n int) {
	w.ring = make([]time.Duration, n)
	w.scratch = make([]time.Duration, 0, n)
}

func (w *latencyWindow) add(d time.Duration) {
	w.mu.Lock()
	w.ring[w.next] = d
	w.next++
	if w.next == len(w.ring) {
		w.next, w.full = 0, true
	}
	w.dirty++
	w.mu.Unlock()
}

// reset empties the window.
func (w *latencyWindow) reset() {
	w.mu.Lock()
	w.next, w.full, w.dirty, w.cached = 0, false, 0, 0
	w.mu.Unlock()
}

// count returns how many samples the window holds.
func (w *latencyWindow) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.full {
		return len(w.ring)
	}
	return w.next
}

// p99 returns the 99th percentile of the window; 0 when empty. It is
// recomputed at most once per 8 new samples.
func (w *latencyWindow) p99() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dirty >= 8 || (w.dirty > 0 && !w.full && w.next < 100) {
		w.cached = w.quantileLocked(0.99)
		w.dirty = 0
	}
	return w.cached
}

func (w *latencyWindow) quantileLocked(q float64) time.Duration {
	n := w.next
	if w.full {
		n = len(w.ring)
	}
	if n == 0 {
		return 0
	}
	s := append(w.scratch[:0], w.ring[:n]...)
	slices.Sort(s)
	i := int(q*float64(n)+0.5) - 1
	return s[min(max(i, 0), n-1)]
}
