package relay

import (
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
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
	header http.Header     // Upstream.Header, canonical keys, the router's own copy
	tags   []bodyTag
	factor float64 // price factor, 1 for list price

	seed     uint64  // rendezvous seed, from the name
	weight   float64 // Upstream.Weight, 1 when unset
	inflight atomic.Int64
	requests atomic.Uint64
	failures atomic.Uint64
	lat      latencyWindow
	br       breaker
	lim      limiter
}

func (u *upstream) initRuntime(r *Router) {
	u.seed = fnv1a(fnvOffset64, u.cfg.Name)
	u.weight = u.cfg.Weight
	if u.weight == 0 {
		u.weight = 1
	}
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

// Strategy decides the order in which the upstreams serving a model are
// tried. Every strategy skips open circuits.
type Strategy uint8

const (
	// StrategyAffinity (the default) sends a request to the home upstream
	// its affinity key picks by rendezvous hashing, so requests sharing a
	// prompt prefix land where the provider's cache holds it, and adding an
	// upstream moves only its share of keys. A fraction (Config.Jitter) goes
	// to another upstream at random to break bursts. The rest of the order
	// follows the hash ranking.
	StrategyAffinity Strategy = iota
	// StrategyBoundedLoad is consistent hashing with bounded loads (Mirrokni
	// et al.): the hash ranking, but no upstream takes more than
	// ⌈LoadFactor·average⌉ in-flight requests; overflow walks on in hash
	// order.
	StrategyBoundedLoad
	// StrategyLeastLatency is power of two choices over a peak-sensitive
	// EWMA of latency × (in-flight + 1), the way Finagle and Linkerd balance.
	StrategyLeastLatency
	// StrategyWeighted picks the first upstream at random by
	// Upstream.Weight; the rest follow by weight.
	StrategyWeighted
	// StrategyPriority keeps the configuration order: the first upstream
	// serving the model is the primary, the others are its failovers.
	StrategyPriority
)

func (s Strategy) String() string {
	switch s {
	case StrategyAffinity:
		return "affinity"
	case StrategyBoundedLoad:
		return "bounded-load"
	case StrategyLeastLatency:
		return "least-latency"
	case StrategyWeighted:
		return "weighted"
	case StrategyPriority:
		return "priority"
	}
	return "Strategy(" + strconv.Itoa(int(s)) + ")"
}

// plan lists the candidates for a route in the order to try them: the
// upstreams serving the route's model, then those of each fallback model,
// each group in the strategy's order for the affinity key. Open circuits are
// skipped, except that a model whose every upstream is open still gets the
// one whose cooldown ends first, so a pool never runs empty. With random
// false (Decide), the strategies' random parts (jitter, the two choices, the
// weighted draw) are left out and the order is the deterministic ranking.
func (r *Router) plan(buf []candidate, model string, fallbacks []string, key uint64, random bool) []candidate {
	out := buf[:0]
	now := r.clock.Now()
	out = r.appendCandidates(out, model, now, key, random)
	for _, fb := range fallbacks {
		if fb == "" || fb == model || slices.ContainsFunc(out, func(c candidate) bool { return c.model == fb }) {
			continue
		}
		out = r.appendCandidates(out, fb, now, key, random)
	}
	return out
}

func (r *Router) appendCandidates(out []candidate, model string, now time.Time, key uint64, random bool) []candidate {
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
		return append(out, candidate{up: soonest, model: model, forced: true})
	}
	r.order(out[start:], key, now, random)
	return out
}

// order sorts one model's candidates by the router's strategy.
func (r *Router) order(seg []candidate, key uint64, now time.Time, random bool) {
	n := len(seg)
	if n < 2 || r.strategy == StrategyPriority {
		return
	}
	switch r.strategy {
	case StrategyAffinity, StrategyBoundedLoad:
		sortBy(seg, func(c *candidate) uint64 { return ^rendezvous(key, c.up.seed) }) // highest score first
		if r.strategy == StrategyAffinity && random && r.jitter > 0 && rand.Float64() < r.jitter {
			j := 1 + rand.IntN(n-1)
			home := seg[j]
			copy(seg[1:j+1], seg[:j])
			seg[0] = home
		}
	case StrategyLeastLatency:
		sortBy(seg, func(c *candidate) uint64 { return math.Float64bits(c.up.cost(now)) }) // non-negative floats order as their bits
		if !random {
			return
		}
		// Power of two choices: the better of two random picks goes first.
		i, j := rand.IntN(n), rand.IntN(n-1)
		if j >= i {
			j++
		}
		w := min(i, j) // seg is sorted: the lower index has the lower cost
		home := seg[w]
		copy(seg[1:w+1], seg[:w])
		seg[0] = home
	case StrategyWeighted:
		sortBy(seg, func(c *candidate) uint64 { return ^math.Float64bits(c.up.weight) }) // heaviest first
		if !random {
			return
		}
		total := 0.0
		for i := range seg {
			total += seg[i].up.weight
		}
		x := rand.Float64() * total
		w := 0
		for ; w < n-1; w++ {
			if x -= seg[w].up.weight; x < 0 {
				break
			}
		}
		home := seg[w]
		copy(seg[1:w+1], seg[:w])
		seg[0] = home
	}
}

// sortBy sorts a few candidates by ascending key (insertion sort on the
// keys and an index, then one permutation: no allocation for up to 16
// candidates, and the lists are short). Ties keep configuration order.
func sortBy(seg []candidate, key func(*candidate) uint64) {
	n := len(seg)
	if n > 16 {
		slices.SortStableFunc(seg, func(a, b candidate) int { return cmpUint(key(&a), key(&b)) })
		return
	}
	var keys [16]uint64
	var idx [16]uint8
	for i := range seg {
		keys[i], idx[i] = key(&seg[i]), uint8(i)
	}
	for i := 1; i < n; i++ {
		k, x := keys[i], idx[i]
		j := i
		for ; j > 0 && k < keys[j-1]; j-- {
			keys[j], idx[j] = keys[j-1], idx[j-1]
		}
		keys[j], idx[j] = k, x
	}
	var tmp [16]candidate
	copy(tmp[:n], seg)
	for i := range n {
		seg[i] = tmp[idx[i]]
	}
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// rendezvous is the highest-random-weight score of an upstream for a key.
func rendezvous(key, seed uint64) uint64 { return fmix64(key ^ seed) }

// cost is the least-latency score: the peak EWMA of latency, decayed
// toward zero while no sample arrives (so a slow upstream is probed again
// in time), times in-flight + 1.
func (u *upstream) cost(now time.Time) float64 {
	e, at := u.lat.ewmaAt()
	if e > 0 {
		e *= math.Exp(-float64(now.Sub(at)) / float64(ewmaDecay))
	}
	return e * float64(u.inflight.Load()+1)
}

// ewmaDecay is the time constant of the latency EWMA (Finagle's default).
const ewmaDecay = 10 * time.Second

// boundedCap is the in-flight cap of one upstream under bounded loads:
// ⌈c·(in-flight of the model's candidates + 1)/n⌉.
func (r *Router) boundedCap(cands []candidate, model string) int64 {
	var total, n int64
	for i := range cands {
		if cands[i].model == model {
			total += cands[i].up.inflight.Load()
			n++
		}
	}
	return int64(math.Ceil(r.loadFactor * float64(total+1) / float64(n)))
}

// keyOf returns the request's affinity key (shard.go); 0 for a request
// without a prompt. Only the strategies that hash need it.
func (r *Router) keyOf(c *classified) uint64 {
	if r.strategy != StrategyAffinity && r.strategy != StrategyBoundedLoad && !r.cfg.PromptCacheKey {
		return 0
	}
	return r.affinityKey(c)
}

// UpstreamStats is a snapshot of one upstream's live state, for dashboards.
type UpstreamStats struct {
	Name      string
	InFlight  int
	Samples   int           // latencies in the window (at most 200)
	P50, P99  time.Duration // of the last 200 times to response headers
	EWMA      time.Duration // peak-sensitive EWMA of the same
	Requests  uint64        // attempts sent
	Failures  uint64        // of which failed (5xx, 429, connection errors)
	ErrorRate float64       // Failures / Requests
	Breaker   BreakerState
}

// Stats returns a snapshot of every upstream's live state, in
// configuration order.
func (r *Router) Stats() []UpstreamStats {
	now := r.clock.Now()
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
		s.Breaker = u.br.stateAt(now)
	}
	return out
}

// latencyWindowSize is the number of recent latencies kept per upstream.
const latencyWindowSize = 200

// latencyWindow keeps the last n latencies of an upstream and their p99,
// recomputed lazily.
type latencyWindow struct {
	mu sync.Mutex
	// The peak-sensitive EWMA (float64 bits, nanoseconds) and the time of
	// its last sample: written under mu, read without it.
	ewmaBits  atomic.Uint64
	ewmaNanos atomic.Int64
	ring      []time.Duration
	next      int
	full      bool
	dirty     int // samples added since p99 was computed
	cached    time.Duration
	cached95  time.Duration
	scratch   []time.Duration
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
	n := w.next
	if w.full {
		n = len(w.ring)
	}
	return n, w.quantileLocked(0.5), w.quantileLocked(0.99)
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
	w.refreshLocked()
	return w.cached
}

// p95 is p99's companion, for the hedge delay.
func (w *latencyWindow) p95() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.refreshLocked()
	return w.cached95
}

func (w *latencyWindow) refreshLocked() {
	if w.dirty >= 8 || (w.dirty > 0 && !w.full && w.next < 100) {
		w.cached = w.quantileLocked(0.99)
		w.cached95 = w.quantileLocked(0.95)
		w.dirty = 0
	}
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
