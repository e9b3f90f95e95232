package relay

import (
	"cmp"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"
)

// candidate is one place to send a request: an upstream and the model to ask
// it for.
type candidate struct {
	up    *upstream
	model string
	// probe is the token of the half-open circuit's probe it carries
	// (store.Verdict.Probe); nil: none. (A pointer, set on the rare
	// claim, keeps a trip's candidates, and the trip, small.)
	probe   *string
	forced  bool  // its circuit is open, but it is the model's soonest to recover
	failing bool  // a run of failures is in progress on it: a success ends it
	took    uint8 // where its admission took its tokens (tookStore, tookShare), tookNone until it did
	// predicted is the cached tokens StrategyExpectedCost predicts for
	// the request here (Candidate.PredictedCached).
	predicted int32
}

// probeToken returns the token of the probe c carries, or "".
func (c *candidate) probeToken() string {
	if c.probe == nil {
		return ""
	}
	return *c.probe
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
	// StrategyExpectedCost sends a request where it is expected to cost
	// least: each upstream's cached tokens for it are predicted from the
	// prompt-prefix blocks it recently served and its CacheRules, and the
	// upstreams are ranked by (prompt − cached)·input + cached·cached input
	// + output·output at the model's price and the upstream's price factor
	// (a model without a price: by uncached tokens). Ties (a cold prompt)
	// follow the affinity ranking, so cold requests keep cache locality.
	// No upstream takes more than ⌈LoadFactor·average⌉ in-flight requests,
	// as under StrategyBoundedLoad.
	StrategyExpectedCost
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
	case StrategyExpectedCost:
		return "expected-cost"
	}
	return "Strategy(" + strconv.Itoa(int(s)) + ")"
}

// candidates lists where a request may go: for the known endpoints the
// route's plan; other paths (/models, /files...) go to the upstreams in
// configuration order, open circuits skipped (and, when every one is open,
// the soonest to recover), since they are not routed by model.
func (r *Router) candidates(buf []candidate, c *classified, route Route, key uint64, random bool, require []string) []candidate {
	if c.req.Endpoint == "" {
		return r.healthy(buf[:0], "", r.s.clock.Now(), require)
	}
	out := r.plan(buf, route.Model, route.Fallbacks, key, random, require)
	if r.s.strategy == StrategyExpectedCost {
		r.rankByCost(out, c, key, r.s.clock.Now())
	}
	return out
}

// plan lists the candidates for a route in the order to try them: the
// upstreams serving the route's model, then those of each fallback model,
// each group in the strategy's order for the affinity key. Open circuits are
// skipped, except that a model whose every upstream is open still gets the
// one whose cooldown ends first, so a pool never runs empty. With random
// false (Decide), the strategies' random parts (jitter, the two choices, the
// weighted draw) are left out and the order is the deterministic ranking.
// Only upstreams that carry every tag of require are candidates.
func (r *Router) plan(buf []candidate, model string, fallbacks []string, key uint64, random bool, require []string) []candidate {
	out := buf[:0]
	now := r.s.clock.Now()
	out = r.appendCandidates(out, model, now, key, random, require)
	for _, fb := range fallbacks {
		if fb == "" || fb == model || slices.ContainsFunc(out, func(c candidate) bool { return c.model == fb }) {
			continue
		}
		out = r.appendCandidates(out, fb, now, key, random, require)
	}
	return out
}

func (r *Router) appendCandidates(out []candidate, model string, now time.Time, key uint64, random bool, require []string) []candidate {
	start := len(out)
	out = r.healthy(out, model, now, require)
	r.order(out[start:], key, now, random)
	return out
}

// healthy appends the upstreams serving model and carrying the required
// tags whose circuits are not open, in configuration order, or, when every
// one is open, the one whose cooldown ends first: a pool never runs empty.
func (r *Router) healthy(out []candidate, model string, now time.Time, require []string) []candidate {
	start := len(out)
	var soonest *upstream
	var soonestAt time.Time
	for _, u := range r.ups {
		if !u.serves(model) || !u.carries(require) {
			continue
		}
		if at, open := u.circ.openUntil(now, r.s.breaker.probePath != ""); open {
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
	return out
}

// order sorts one model's candidates by the router's strategy.
func (r *Router) order(seg []candidate, key uint64, now time.Time, random bool) {
	n := len(seg)
	if n < 2 || r.s.strategy == StrategyPriority {
		return
	}
	switch r.s.strategy {
	case StrategyAffinity, StrategyBoundedLoad, StrategyExpectedCost:
		sortBy(seg, func(c *candidate) uint64 { return ^rendezvous(key, c.up.seed) }) // highest score first
		if r.s.strategy == StrategyAffinity && random && r.s.jitter > 0 && rand.Float64() < r.s.jitter {
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
		slices.SortStableFunc(seg, func(a, b candidate) int { return cmp.Compare(key(&a), key(&b)) })
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
	return int64(math.Ceil(r.s.loadFactor * float64(total+1) / float64(n)))
}
