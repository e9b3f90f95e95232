package main

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/examples/simulate/simfleet"
	"github.com/tokenrelay/relay/internal/prompt"
)

// The cache sweep (-sweep): the cache hits a workload would have with
// prefix caches of several sizes, from an offline replay of its requests
// through the fleet's own cache (simfleet.PrefixCache, one per region of
// the flagship's path, the one the generated workloads ask for), in the
// order the run interleaves them (interleaved), without timing, faults or
// retries. Each request goes to a region by one of four rules:
//
//   - striped: a region at random, as StrategyWeighted with equal weights;
//   - key: first 256 tokens: the home region of the affinity key of the
//     request's leading system messages and first other message alone (the
//     key of the canonical prompt's first 256 tokens, without the
//     conversation anchor, as the router keyed conversations before it),
//     with the router's default jitter: 12.5% of requests go to one of the
//     other regions at random;
//   - key: + first turn: the home region of the router's own key (a
//     conversation past its first turn keyed on its first turn too), with
//     the same jitter;
//   - no jitter: the same, always home.
//
// It also measures what the cache size should hold: the distinct blocks of
// the prompts of the sessions open at once (each one's latest request)
// homed in one region by the router's key, sampled as the replay goes.

// sweepRules names the routing rules of the sweep, in the table's order.
var sweepRules = []string{"striped", "key: first 256 tokens", "key: + first turn", "no jitter"}

// sweepJitter is the router's default Config.Jitter.
const sweepJitter = 0.125

// interleaved returns w's requests in the order a run sends them when
// every answer takes the same time: the users open sessions in turn, each
// sending its next request and going to the back of the line, a finished
// session's place taken by the one after it in the workload (drive's
// order). users <= 0 opens every session at once.
func (w *workload) interleaved(users int) []*request {
	if users <= 0 {
		users = len(w.sessions)
	}
	type open struct{ s, next int }
	var line []open
	opened := 0
	for ; opened < min(users, len(w.sessions)); opened++ {
		line = append(line, open{s: opened})
	}
	var out []*request
	for len(line) > 0 {
		o := line[0]
		line = line[1:]
		out = append(out, &w.sessions[o.s][o.next])
		switch o.next++; {
		case o.next < len(w.sessions[o.s]):
			line = append(line, o)
		case opened < len(w.sessions):
			line = append(line, open{s: opened})
			opened++
		}
	}
	return out
}

// firstTurn returns a chat body cut to its leading system and developer
// messages and the first message after them: a conversation's first turn,
// whose affinity key is the key of its prompt's first 256 tokens alone.
func firstTurn(body string) string {
	msgs := gjson.Get(body, "messages").Array()
	n := 0
	for n < len(msgs) && (msgs[n].Get("role").Str == "system" || msgs[n].Get("role").Str == "developer") {
		n++
	}
	if n+1 >= len(msgs) {
		return body
	}
	raws := make([]string, n+1)
	for i := range raws {
		raws[i] = msgs[i].Raw
	}
	out, err := sjson.SetRaw(body, "messages", "["+strings.Join(raws, ",")+"]")
	if err != nil {
		return body
	}
	return out
}

// sweepRoutes returns, for each rule of sweepRules, the region (index into
// regions) of each request of order.
func sweepRoutes(order []*request, regions []string, seed uint64) ([][]int, error) {
	var ups []relay.Upstream
	for _, reg := range regions {
		ups = append(ups, relay.Upstream{Name: reg, BaseURL: "http://sim.invalid/v1", Models: []string{flagship}})
	}
	r, err := relay.New(relay.Config{Upstreams: ups, Strategy: relay.StrategyAffinity, Jitter: -1})
	if err != nil {
		return nil, err
	}
	index := map[string]int{}
	for i, reg := range regions {
		index[reg] = i
	}
	ranked := func(q *request, body string) ([]string, error) {
		d, err := decideBody(r, q, body)
		return d.Upstreams, err
	}
	rng := rand.New(rand.NewPCG(seed, 0x5ee9))
	routes := make([][]int, len(sweepRules))
	for i := range routes {
		routes[i] = make([]int, len(order))
	}
	for k, q := range order {
		prefix, err := ranked(q, firstTurn(q.body))
		if err != nil {
			return nil, err
		}
		conv, err := ranked(q, q.body)
		if err != nil {
			return nil, err
		}
		routes[0][k] = rng.IntN(len(regions))
		routes[1][k] = index[jitter(rng, prefix)]
		routes[2][k] = index[jitter(rng, conv)]
		routes[3][k] = index[conv[0]]
	}
	return routes, nil
}

// jitter returns the first of ranked, or with the router's default jitter
// one of the others at random (as StrategyAffinity moves a request).
func jitter(rng *rand.Rand, ranked []string) string {
	if rng.Float64() < sweepJitter {
		return ranked[1+rng.IntN(len(ranked)-1)]
	}
	return ranked[0]
}

// sweepHits replays order through one cache of blocks blocks per region,
// each request to the region of route, and returns the cache hits: cached
// tokens over prompt tokens, in percent.
func sweepHits(order []*request, route []int, regions, blocks, blockBytes int) float64 {
	caches := make([]*simfleet.PrefixCache, regions)
	for i := range caches {
		caches[i] = simfleet.NewPrefixCache(blocks, blockBytes)
	}
	prompt, cached := 0, 0
	for k, q := range order {
		p, c := caches[route[k]].Serve(endpointOf(*q), []byte(q.body))
		prompt += p
		cached += c
	}
	return 100 * float64(cached) / float64(max(prompt, 1))
}

// openShare measures the blocks one region's cache needs to hold its share
// of the open sessions: every every requests of order, the distinct blocks
// of the latest prompt of each session open then (a session is open from
// its first request to its last), in the region the route sends it to. It
// returns the mean over the samples of the mean region, and the largest
// region of any sample.
func openShare(w *workload, order []*request, route []int, regions, blockBytes, every int) (mean float64, peak int) {
	sessionOf := map[*request]int{}
	for s, reqs := range w.sessions {
		for i := range reqs {
			sessionOf[&reqs[i]] = s
		}
	}
	blocks := make([]int, len(order)) // full blocks of each request's canonical prompt
	for k, q := range order {
		blocks[k] = len(prompt.AppendCanonical(nil, endpointOf(*q), q.body, math.MaxInt)) / blockBytes
	}
	latest := map[int]int{} // open session -> index in order of its latest request
	samples := 0
	for k, q := range order {
		s := sessionOf[q]
		latest[s] = k
		if (k+1)%every == 0 {
			room := make([]int, regions)
			for _, j := range latest {
				room[route[j]] += blocks[j]
			}
			caches := make([]*simfleet.PrefixCache, regions)
			for i := range caches {
				caches[i] = simfleet.NewPrefixCache(room[i]+1, blockBytes)
			}
			for _, j := range latest {
				p := order[j]
				caches[route[j]].Serve(endpointOf(*p), []byte(p.body))
			}
			sum := 0
			for _, c := range caches {
				sum += c.Len()
				peak = max(peak, c.Len())
			}
			mean += float64(sum) / float64(regions)
			samples++
		}
		if q == &w.sessions[s][len(w.sessions[s])-1] {
			delete(latest, s) // its last request: closed after this one
		}
	}
	return mean / float64(max(samples, 1)), peak
}

// runSweep prints the sweep of w over sizes (blocks per cache).
func runSweep(out io.Writer, o options, w *workload, sizes []int) error {
	fleet := simfleet.New(simfleet.Config{TimeScale: timeScale})
	cfg := fleet.Config()
	fleet.Close()
	var regions []string
	for _, reg := range cfg.Regions {
		regions = append(regions, reg+"/"+flagship)
	}
	order := w.interleaved(w.users)
	routes, err := sweepRoutes(order, regions, o.seed)
	if err != nil {
		return err
	}
	hits := make([][]float64, len(sizes))
	var wg sync.WaitGroup
	for i, size := range sizes {
		hits[i] = make([]float64, len(sweepRules))
		for j := range sweepRules {
			wg.Go(func() { hits[i][j] = sweepHits(order, routes[j], len(regions), size, cfg.BlockBytes) })
		}
	}
	var mean float64
	var peak int
	if w.users > 0 {
		wg.Go(func() { mean, peak = openShare(w, order, routes[3], len(regions), cfg.BlockBytes, 25) })
	}
	wg.Wait()

	fmt.Fprintf(out, "Cache hits by prefix-cache size, %s (seed %d): cached tokens / prompt tokens, %%.\n", w.describe(), o.seed)
	fmt.Fprintf(out, "An offline replay of the requests in the order they interleave through simfleet.PrefixCache (blocks of %d bytes), one\n", cfg.BlockBytes)
	fmt.Fprintf(out, "cache per region (%d), no timing, faults or retries; both keys with the router's jitter (%g%% elsewhere) unless \"no jitter\".\n",
		len(regions), 100*sweepJitter)
	if w.users > 0 {
		fmt.Fprintf(out, "One region's share of the open sessions (the distinct blocks of their latest prompts, homed by the router's key):\n")
		fmt.Fprintf(out, "%.0f blocks on average (sampled every 25 requests), %d at the most.\n", mean, peak)
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "blocks\t%s\n", strings.Join(sweepRules, "\t"))
	for i, size := range sizes {
		cells := make([]string, len(sweepRules))
		for j := range sweepRules {
			cells[j] = strconv.FormatFloat(hits[i][j], 'f', 1, 64)
		}
		fmt.Fprintf(tw, "%d\t%s\n", size, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}
