package relay

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// upstream is an Upstream with its live state: in-flight count, counters,
// latency window, circuit breaker and limiter. Each part has its own lock
// (or none), so no lock is shared by all upstreams.
//
// Its settings and limits are those of one configuration of the Router;
// what the router learned of it (learned) outlives them: Router.Update
// gives the upstream of the same name in the new configuration the same
// learned state.
type upstream struct {
	upstreamSettings

	seed  uint64                      // rendezvous seed, from the name
	paths [len(knownEndpoints)]string // the URL path of each of knownEndpoints on this upstream
	lim   limiter
	*learned
}

// learned is what the router learned of one upstream, kept across
// Router.Update while the upstream keeps its name.
type learned struct {
	inflight atomic.Int64
	requests atomic.Uint64
	failures atomic.Uint64
	lat      latencyWindow
	circ     circuit
	queues   queues      // the limiter's
	blocks   blockRecord // the prompt-prefix blocks it served (StrategyExpectedCost)
	fits     ttftFits
}

// newUpstream returns the upstream us with the state it learned: from
// was, the same upstream in the configuration before (nil: a new one,
// which starts with nothing learned).
func newUpstream(us upstreamSettings, s *settings, was *upstream) *upstream {
	u := &upstream{upstreamSettings: us, seed: fnv1a(fnvOffset64, us.cfg.Name)}
	for i, ep := range knownEndpoints {
		u.paths[i] = u.base.Path + "/" + ep
	}
	var slots *slots
	if was == nil {
		u.learned = new(learned)
		u.lat.init(latencyWindowSize)
	} else {
		u.learned, slots = was.learned, was.lim.slots
	}
	u.lim.init(us.cfg.Name, us.cfg.RPM, us.cfg.TPM, s.replicas, us.cfg.MaxInFlight, &u.queues, slots)
	return u
}

func (u *upstream) serves(model string) bool {
	return (u.models == nil || model == "" || u.models[model]) && u.canName(model)
}

// carries reports whether the upstream has every tag of require.
func (u *upstream) carries(require []string) bool {
	for _, tag := range require {
		if !slices.Contains(u.cfg.Tags, tag) {
			return false
		}
	}
	return true
}

// busy reports whether the upstream is saturated (MaxInFlight reached) or
// its recent p99 latency is over bound.
func (u *upstream) busy(bound time.Duration) bool {
	if m := u.cfg.MaxInFlight; m > 0 && u.inflight.Load() >= int64(m) {
		return true
	}
	return u.lat.p99() > bound
}

// unclaim gives back an in-flight count and slot.
func (u *upstream) unclaim() {
	u.inflight.Add(-1)
	u.lim.release()
}

// Busy implements Load for the router's own upstreams: every upstream
// serving the model is saturated at MaxInFlight or has a recent p99 over
// Breaker.BusyP99. It is false when no upstream serves the model.
func (r *Router) Busy(model string) bool {
	r = r.current()
	any := false
	for _, u := range r.ups {
		if !u.serves(model) {
			continue
		}
		if !u.busy(r.s.busyP99) {
			return false
		}
		any = true
	}
	return any
}

// UpstreamStats is a snapshot of one upstream's live state, for dashboards.
type UpstreamStats struct {
	Name      string        // the upstream's
	InFlight  int           // requests in flight now
	Samples   int           // latencies in the window (at most 200)
	P50, P99  time.Duration // of the last 200 times to response headers
	EWMA      time.Duration // peak-sensitive EWMA of the same
	Requests  uint64        // attempts sent
	Failures  uint64        // of which failed (5xx, 429, connection errors)
	ErrorRate float64       // Failures / Requests
	Breaker   BreakerState  // as of now
}

// Stats returns a snapshot of every upstream's live state, in
// configuration order. It is safe for concurrent use.
func (r *Router) Stats() []UpstreamStats {
	r = r.current()
	now := r.s.clock.Now()
	out := make([]UpstreamStats, len(r.ups))
	for i, u := range r.ups {
		s := &out[i]
		s.Name = u.cfg.Name
		s.InFlight = int(u.inflight.Load())
		s.Samples, s.P50, s.P99 = u.lat.snapshot()
		e, _ := u.lat.ewmaAt()
		s.EWMA = time.Duration(e)
		s.Requests, s.Failures = u.requests.Load(), u.failures.Load()
		if s.Requests > 0 {
			s.ErrorRate = float64(s.Failures) / float64(s.Requests)
		}
		s.Breaker = u.circ.stateAt(now, r.s.breaker.probePath != "")
	}
	return out
}

// latencyWindowSize is the number of recent latencies kept per upstream.
const latencyWindowSize = 200

// ewmaDecay is the time constant of the latency EWMA (Finagle's default).
const ewmaDecay = 10 * time.Second

// latencyWindow keeps the last n latencies of an upstream, their p95 and
// p99 (recomputed lazily), and a peak-sensitive EWMA. Every request reads
// the count and the p99 (the breaker's bound): they are read without the
// lock until the p99 is due to be computed again.
type latencyWindow struct {
	mu sync.Mutex
	// The peak-sensitive EWMA (float64 bits, nanoseconds) and the time of
	// its last sample: written under mu, read without it.
	ewmaBits  atomic.Uint64
	ewmaNanos atomic.Int64
	ring      []time.Duration
	next      int
	full      bool
	dirty     int // samples added since the quantiles were computed
	scratch   []time.Duration
	// Written under mu, read without it: the sample count, the cached
	// quantiles, and whether they are due to be computed again.
	n        atomic.Int64
	c99, c95 atomic.Int64
	stale    atomic.Bool
}

func (w *latencyWindow) init(n int) {
	w.ring = make([]time.Duration, n)
	w.scratch = make([]time.Duration, 0, n)
}

func (w *latencyWindow) add(d time.Duration, now time.Time) {
	w.mu.Lock()
	e, at := w.ewmaAt()
	if x := float64(d); x > e || at.UnixNano() == 0 {
		e = x // peak-sensitive: a slow sample counts at once
	} else {
		decay := math.Exp(-float64(now.Sub(at)) / float64(ewmaDecay))
		e = e*decay + x*(1-decay)
	}
	w.ewmaBits.Store(math.Float64bits(e))
	w.ewmaNanos.Store(now.UnixNano())
	w.ring[w.next] = d
	w.next++
	if w.next == len(w.ring) {
		w.next, w.full = 0, true
	}
	w.dirty++
	w.n.Store(int64(w.countLocked()))
	if w.dueLocked() {
		w.stale.Store(true)
	}
	w.mu.Unlock()
}

// ewmaAt returns the EWMA and the time of its last sample, without taking
// the lock.
func (w *latencyWindow) ewmaAt() (float64, time.Time) {
	return math.Float64frombits(w.ewmaBits.Load()), time.Unix(0, w.ewmaNanos.Load())
}

// snapshot returns the sample count, p50 and p99.
func (w *latencyWindow) snapshot() (int, time.Duration, time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.countLocked(), w.quantileLocked(0.5), w.quantileLocked(0.99)
}

// reset empties the window.
func (w *latencyWindow) reset() {
	w.mu.Lock()
	w.next, w.full, w.dirty = 0, false, 0
	w.n.Store(0)
	w.c99.Store(0)
	w.c95.Store(0)
	w.stale.Store(false)
	w.mu.Unlock()
}

// count returns how many samples the window holds.
func (w *latencyWindow) count() int { return int(w.n.Load()) }

func (w *latencyWindow) countLocked() int {
	if w.full {
		return len(w.ring)
	}
	return w.next
}

// p99 returns the 99th percentile of the window; 0 when empty. It is
// recomputed at most once per 8 new samples.
func (w *latencyWindow) p99() time.Duration {
	w.refresh()
	return time.Duration(w.c99.Load())
}

// p95 is p99's companion, for the hedge delay.
func (w *latencyWindow) p95() time.Duration {
	w.refresh()
	return time.Duration(w.c95.Load())
}

// refresh computes the quantiles again when they are due.
func (w *latencyWindow) refresh() {
	if !w.stale.Load() {
		return
	}
	w.mu.Lock()
	w.refreshLocked()
	w.mu.Unlock()
}

func (w *latencyWindow) refreshLocked() {
	if w.dueLocked() {
		p95, p99 := w.tailLocked()
		w.c95.Store(int64(p95))
		w.c99.Store(int64(p99))
		w.dirty = 0
	}
	w.stale.Store(false)
}

// dueLocked reports whether the quantiles are to be computed again: after
// every 8 new samples, and after each one while there are fewer than 100.
func (w *latencyWindow) dueLocked() bool {
	return w.dirty >= 8 || (w.dirty > 0 && !w.full && w.next < 100)
}

// tailKeep is how many of the largest latencies tailLocked keeps: enough
// for the p95 of a full window.
const tailKeep = latencyWindowSize/20 + 2

// tailLocked returns the p95 and p99 of the window, as quantileLocked
// would, from its largest latencies, found in one pass without sorting.
func (w *latencyWindow) tailLocked() (p95, p99 time.Duration) {
	n := w.countLocked()
	if n == 0 {
		return 0, 0
	}
	var top [tailKeep]time.Duration // descending
	k := 0
	for _, d := range w.ring[:n] {
		if k == len(top) && d <= top[k-1] {
			continue
		}
		j := min(k, len(top)-1)
		for ; j > 0 && top[j-1] < d; j-- {
			top[j] = top[j-1]
		}
		top[j] = d
		k = min(k+1, len(top))
	}
	// quantileLocked's index i, counted from the top.
	rank := func(q float64) int { return n - 1 - min(max(int(q*float64(n)+0.5)-1, 0), n-1) }
	return top[rank(0.95)], top[rank(0.99)]
}

func (w *latencyWindow) quantileLocked(q float64) time.Duration {
	n := w.countLocked()
	if n == 0 {
		return 0
	}
	s := append(w.scratch[:0], w.ring[:n]...)
	slices.Sort(s)
	i := int(q*float64(n)+0.5) - 1
	return s[min(max(i, 0), n-1)]
}

// shareOf is one replica's share of a fleet-wide limit: at least 1 when
// the limit is set.
func shareOf(limit, replicas int) int {
	if limit <= 0 {
		return limit
	}
	return max(limit/replicas, 1)
}
