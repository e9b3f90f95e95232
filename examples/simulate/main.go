// Command simulate sends one seeded workload to a simulated fleet of
// OpenAI-compatible upstreams in several modes, straight to one clustering
// upstream and through the relay router, and prints p50, p99, throughput,
// success, cost and cache hits side by side.
//
// The fleet is simulated: relaytest.SimFleet runs on loopback, no key and no
// network needed. Its model (regions of FIFO shards with bounded queues,
// service time = prefill + decode on a 1:50 clock, the clustering of 150–220
// token prompts onto one shard, prefix caches per region and model path, a
// region going dark, 429 bursts) is documented on relaytest.SimFleet; the
// numbers show how routing changes queueing in that model, not what any
// provider measures.
//
// With -replay FILE it replays a JSONL file of recorded requests instead of
// the generated workload (see replay.go), against the simulated fleet or,
// with -base-url, against a real OpenAI-compatible endpoint.
//
//	go run ./examples/simulate
//	go run ./examples/simulate -requests 500 -concurrency 16 -modes direct,cluster-aware -json
//	go run ./examples/simulate -replay examples/simulate/testdata/sample.jsonl -speed 2
//	OPENAI_API_KEY=... go run ./examples/simulate -replay my.jsonl -base-url https://api.openai.com/v1
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/internal/bpe"
	"github.com/tokenrelay/relay/relaytest"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// The three model paths of the simulated fleet.
const (
	flagship = "gpt-5.5-codex"
	fast     = "gemini-2.5-flash"
	cheap    = "deepseek-v3.2"
)

// timeScale is the fleet's wall-clock time per simulated second.
const timeScale = 0.02

// scaled converts a simulated duration to wall-clock time.
func scaled(d time.Duration) time.Duration { return time.Duration(float64(d) * timeScale) }

// mode is one row of the table. Adding a mode (hedging, affinity striping)
// is one entry here.
type mode struct {
	name  string
	about string
	// floor sends a sample of the workload one request at a time.
	floor bool
	// newSender builds the mode's client side over a running fleet.
	newSender func(e *env) (*sender, error)
}

var modes = []mode{
	{name: "floor", about: "direct, one request at a time (unloaded baseline)", floor: true, newSender: direct},
	{name: "direct", about: "one upstream (us-east " + flagship + "), clustering on, no retries", newSender: direct},
	{name: "striped", about: "relay over 4 regions, StrategyWeighted (random first region), retries elsewhere",
		newSender: relayed(relay.StrategyWeighted, nil)},
	{name: "affinity", about: "relay over 4 regions, StrategyAffinity (prompt-prefix home region + jitter), retries elsewhere",
		newSender: relayed(relay.StrategyAffinity, nil)},
	{name: "cluster-aware", about: "affinity + ClusterPolicy: 80–260 tokens → " + fast + ", other mid → " + cheap,
		newSender: relayed(relay.StrategyAffinity, clusterPolicy(false))},
	{name: "cluster-busy", about: "cluster-aware, WhenBusy: the window moves only while " + flagship + " is busy",
		newSender: relayed(relay.StrategyAffinity, clusterPolicy(true))},
	// A fixed delay alone (HedgeConfig{Delay: scaled(time.Second)}) measured
	// the same as P95 here (see the README); P95 is kept because one fixed
	// delay cannot suit three model paths of different speeds.
	{name: "hedged", about: "cluster-aware + HedgeConfig{P95: true, Delay: 1 s simulated}: a second region after the first one's p95 to headers (5% budget)",
		newSender: relayedHedge(relay.StrategyAffinity, clusterPolicy(false), relay.HedgeConfig{P95: true, Delay: scaled(time.Second)})},
}

// aboutReal describes the modes against a real endpoint (-base-url).
var aboutReal = map[string]string{
	"floor":         "direct, one request at a time",
	"direct":        "a Router with the one endpoint, no policy, no retries",
	"striped":       "a Router with the one endpoint, retries and breaker (no other region to stripe over)",
	"cluster-aware": "striped + ClusterPolicy with -fast and -cheap",
	"cluster-busy":  "cluster-aware, WhenBusy",
	"affinity":      "striped with StrategyAffinity (one endpoint: the same route for every key)",
	"hedged":        "cluster-aware + P95 hedging (the hedge is a second call to the same endpoint)",
}

// clusterPolicy is the ready-made policy with the fast and cheap models of
// the run (the fleet's, or -fast and -cheap against a real endpoint).
func clusterPolicy(whenBusy bool) func(e *env) relay.Policy {
	return func(e *env) relay.Policy {
		return relay.ClusterPolicy{Fast: e.fast, Cheap: e.cheap, WhenBusy: whenBusy}
	}
}

func modeNames() []string {
	out := make([]string, len(modes))
	for i, m := range modes {
		out[i] = m.name
	}
	return out
}

// options are the command's flags.
type options struct {
	requests    int
	concurrency int
	seed        uint64
	windowMin   int
	windowMax   int
	modes       []mode
	json        bool
	floorSample int

	// Replay (replay.go).
	replay      string  // JSONL file of recorded requests; "": the generated workload
	baseURL     string  // real endpoint to replay against; "": the simulated fleet
	apiKey      string  // for baseURL; never printed
	speed       float64 // divides recorded times
	requestsSet bool    // -requests was given (it then caps a replay)
	fast, cheap string  // ClusterPolicy models
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	var window, modeList string
	var seed int64
	fs.IntVar(&o.requests, "requests", 1200, "requests per mode")
	fs.IntVar(&o.concurrency, "concurrency", 24, "requests in flight at once (the floor mode sends one at a time)")
	fs.Int64Var(&seed, "seed", 1, "workload seed")
	fs.StringVar(&window, "window", "150-220", "the fleet's clustered prompt-token window, MIN-MAX")
	fs.StringVar(&modeList, "modes", strings.Join(modeNames(), ","), "comma-separated modes: "+strings.Join(modeNames(), ", "))
	fs.BoolVar(&o.json, "json", false, "print one JSON object per mode instead of the table")
	fs.IntVar(&o.floorSample, "floor-sample", 100, "requests the floor mode sends (an evenly spaced sample of the workload)")
	fs.StringVar(&o.replay, "replay", "", "replay this JSONL file of recorded chat-completions or responses bodies instead of the generated workload")
	fs.StringVar(&o.baseURL, "base-url", "", "with -replay: send to this real OpenAI-compatible API root (e.g. https://api.openai.com/v1) instead of the simulated fleet")
	fs.StringVar(&o.apiKey, "api-key", "", "API key for -base-url (default $OPENAI_API_KEY)")
	fs.Float64Var(&o.speed, "speed", 1, "with -replay: replay the recorded timestamps this many times faster")
	fs.StringVar(&o.fast, "fast", fast, "the cluster-aware modes' fast model (ClusterPolicy.Fast)")
	fs.StringVar(&o.cheap, "cheap", cheap, "the cluster-aware modes' cheap model (ClusterPolicy.Cheap)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: simulate [flags]\n\nRuns a seeded workload against a simulated fleet (relaytest.SimFleet) in several modes.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	bad := func(format string, a ...any) (options, error) {
		err := fmt.Errorf(format, a...)
		fmt.Fprintf(stderr, "simulate: %v\n", err)
		fs.Usage()
		return o, err
	}
	if fs.NArg() > 0 {
		return bad("unexpected arguments %q", fs.Args())
	}
	if o.requests <= 0 {
		return bad("-requests must be positive, got %d", o.requests)
	}
	if o.concurrency <= 0 {
		return bad("-concurrency must be positive, got %d", o.concurrency)
	}
	if o.floorSample <= 0 {
		return bad("-floor-sample must be positive, got %d", o.floorSample)
	}
	if seed < 0 {
		return bad("-seed must not be negative, got %d", seed)
	}
	o.seed = uint64(seed)
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	o.requestsSet = set["requests"]
	if !(o.speed > 0) || math.IsInf(o.speed, 0) {
		return bad("-speed must be a positive number, got %g", o.speed)
	}
	if o.baseURL != "" {
		if o.replay == "" {
			return bad("-base-url needs -replay: only recorded traffic is sent to a real endpoint")
		}
		if u, err := url.Parse(o.baseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return bad("-base-url must be an http or https URL, got %q", o.baseURL)
		}
		if o.apiKey == "" {
			o.apiKey = os.Getenv("OPENAI_API_KEY")
		}
		if !set["modes"] {
			modeList = "direct,striped"
		}
	}
	if o.fast == "" || o.cheap == "" {
		return bad("-fast and -cheap must name models")
	}
	if o.baseURL == "" && (o.fast != fast || o.cheap != cheap) {
		return bad("-fast and -cheap apply to -base-url only: the simulated fleet serves %s, %s and %s", flagship, fast, cheap)
	}
	lo, hi, ok := strings.Cut(window, "-")
	wmin, err1 := strconv.Atoi(strings.TrimSpace(lo))
	wmax, err2 := strconv.Atoi(strings.TrimSpace(hi))
	switch {
	case !ok || err1 != nil || err2 != nil:
		return bad("-window must be MIN-MAX with MIN and MAX non-negative token counts, got %q", window)
	case wmin > wmax || wmax == 0:
		return bad("-window %q is empty: MIN must be at most MAX, and MAX positive", window)
	}
	o.windowMin, o.windowMax = wmin, wmax
	seen := map[string]bool{}
	for _, name := range strings.Split(modeList, ",") {
		name = strings.TrimSpace(name)
		i := slices.IndexFunc(modes, func(m mode) bool { return m.name == name })
		if i < 0 {
			return bad("unknown mode %q (modes: %s)", name, strings.Join(modeNames(), ", "))
		}
		if !seen[name] {
			seen[name] = true
			o.modes = append(o.modes, modes[i])
		}
	}
	return o, nil
}

// run is the command: it returns the exit code (2 for bad flags).
func run(args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		return 2
	}
	var w *workload
	if o.replay != "" {
		var models []string
		if o.baseURL == "" {
			models = []string{flagship, fast, cheap}
		}
		w, err = replayWorkload(o, models, stderr)
		if err != nil {
			fmt.Fprintf(stderr, "simulate: %v\n", err)
			return 1
		}
	} else {
		w = newWorkload(o.seed, o.requests)
	}
	var results []result
	var cfg relaytest.SimConfig
	for _, m := range o.modes {
		res, c, err := runMode(o, m, w, stderr)
		cfg = c
		if err != nil {
			fmt.Fprintf(stderr, "simulate: mode %s: %v\n", m.name, err)
			return 1
		}
		results = append(results, res)
	}
	if o.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(results); err != nil {
			fmt.Fprintf(stderr, "simulate: %v\n", err)
			return 1
		}
		return 0
	}
	printReport(stdout, o, cfg, w, results)
	return 0
}

// env is what a mode's sender is built over.
type env struct {
	fleet *relaytest.SimFleet // nil against a real endpoint
	// direct is the upstream of the direct modes; all, every upstream of
	// the relay modes (against a real endpoint, both are that endpoint).
	direct   relay.Upstream
	all      []relay.Upstream
	fast     string
	cheap    string
	base     *http.Transport
	onReport func(relay.Report)
}

// sender sends one request of the workload: it picks the Router for it.
type sender struct {
	routers []*relay.Router
	pick    func(q *request) int
}

func (s *sender) close() {
	for _, r := range s.routers {
		r.CloseIdleConnections()
	}
}

// retry is the routers' retry configuration, on the fleet's time scale: the
// default 100 ms → 1.2 s backoff would be 10–120 s of simulated time.
var retry = relay.RetryConfig{
	MaxAttempts:     3,
	InitialInterval: scaled(200 * time.Millisecond),
	MaxInterval:     scaled(2 * time.Second),
	MaxRetryAfter:   scaled(10 * time.Second),
}

// direct sends every request to us-east's flagship, once.
func direct(e *env) (*sender, error) {
	r, err := relay.New(relay.Config{
		Upstreams: []relay.Upstream{e.direct},
		Base:      e.base,
		OnReport:  e.onReport,
		Retry:     relay.RetryConfig{MaxAttempts: 1},
	})
	if err != nil {
		return nil, err
	}
	return &sender{routers: []*relay.Router{r}, pick: func(*request) int { return 0 }}, nil
}

// relayed sends through one Router over every region and model path, with
// retries, ordering the upstreams of a model by strategy, under policy (nil:
// keep the requested model).
func relayed(strategy relay.Strategy, policy func(e *env) relay.Policy) func(e *env) (*sender, error) {
	return relayedHedge(strategy, policy, relay.HedgeConfig{})
}

// relayedHedge is relayed with hedging.
func relayedHedge(strategy relay.Strategy, policy func(e *env) relay.Policy, hedge relay.HedgeConfig) func(e *env) (*sender, error) {
	return func(e *env) (*sender, error) {
		var p relay.Policy
		if policy != nil {
			p = policy(e)
		}
		r, err := relay.New(relay.Config{
			Upstreams: e.all,
			Policy:    p,
			Strategy:  strategy,
			Base:      e.base,
			OnReport:  e.onReport,
			Retry:     retry,
			Hedge:     hedge,
			// Busy: a recent p99 over 5 s of simulated time. The breaker's
			// cooldown is on the fleet's clock too: the default 30 s would
			// be 25 minutes of simulated time, longer than the whole run.
			Breaker: relay.BreakerConfig{BusyP99: scaled(5 * time.Second), Cooldown: scaled(30 * time.Second)},
		})
		if err != nil {
			return nil, err
		}
		return &sender{routers: []*relay.Router{r}, pick: func(*request) int { return 0 }}, nil
	}
}

// result is one mode's row; the JSON field names are part of the output.
type result struct {
	Mode            string             `json:"mode"`
	About           string             `json:"about"`
	Requests        int                `json:"requests"`
	Concurrency     int                `json:"concurrency"`
	ModelPaths      map[string]float64 `json:"model_paths_pct"`
	P50ms           float64            `json:"p50_ms"`
	P99ms           float64            `json:"p99_ms"`
	MaxMs           float64            `json:"max_ms"`
	ThroughputRPS   float64            `json:"throughput_rps"`
	SuccessPct      float64            `json:"success_pct"`
	Failed          int                `json:"failed"`
	CostUSD         float64            `json:"cost_usd"`
	CostPer1kReq    float64            `json:"cost_per_1k_requests_usd"`
	CostPer1MOutput float64            `json:"cost_per_1m_output_tokens_usd"`
	PromptTokens    int                `json:"prompt_tokens"`
	OutputTokens    int                `json:"output_tokens"`
	CachedTokens    int                `json:"cached_tokens"`
	CacheHitPct     float64            `json:"cache_hit_pct"`
	UsageMissing    int                `json:"usage_missing"`
	HedgesPct       float64            `json:"hedges_pct"`
	AttemptsPerReq  float64            `json:"attempts_per_request"`
	WallMs          float64            `json:"wall_ms"`
	MaxQueue        int                `json:"max_queue"`
	MaxQueueShard   string             `json:"max_queue_shard"`
	HotShardPct     float64            `json:"hot_shard_pct"`
	Refused         int                `json:"refused"`
	Throttled       int                `json:"throttled"`
}

// faults are the default run's failures, by share of the mode's requests
// sent: ap-southeast dark from 25% to 55%, a burst of 429s (hint 200 ms)
// from eu-west at 70%. The direct and floor modes use us-east only, so they
// never meet them.
type fault struct {
	at    float64
	apply func(f *relaytest.SimFleet)
}

var faults = []fault{
	{0.25, func(f *relaytest.SimFleet) { f.SetDark("ap-southeast", true) }},
	{0.55, func(f *relaytest.SimFleet) { f.SetDark("ap-southeast", false) }},
	{0.70, func(f *relaytest.SimFleet) { f.Burst429("eu-west", 20, 200*time.Millisecond) }},
}

func runMode(o options, m mode, w *workload, stderr io.Writer) (result, relaytest.SimConfig, error) {
	e := &env{fast: o.fast, cheap: o.cheap}
	var fleet *relaytest.SimFleet
	if o.baseURL == "" {
		fleet = relaytest.NewSimFleet(relaytest.SimConfig{
			TimeScale:  timeScale,
			ClusterMin: o.windowMin,
			ClusterMax: o.windowMax,
		})
		defer fleet.Close()
		e.fleet = fleet
		up, _ := fleet.Upstream("us-east", flagship)
		e.direct = relay.Upstream{Name: up.Name, BaseURL: up.URL, Models: []string{flagship}}
		for _, u := range fleet.Upstreams() {
			e.all = append(e.all, relay.Upstream{Name: u.Name, BaseURL: u.URL, Models: []string{u.Model}})
		}
	} else {
		e.direct = relay.Upstream{Name: "remote", BaseURL: strings.TrimSuffix(o.baseURL, "/"), APIKey: o.apiKey}
		e.all = []relay.Upstream{e.direct}
	}
	base := &http.Transport{
		MaxIdleConns:        0,
		MaxIdleConnsPerHost: o.concurrency + 8,
		IdleConnTimeout:     30 * time.Second,
	}
	defer base.CloseIdleConnections()

	var mu sync.Mutex
	var reports []relay.Report
	e.base = base
	e.onReport = func(r relay.Report) {
		mu.Lock()
		reports = append(reports, r)
		mu.Unlock()
	}
	s, err := m.newSender(e)
	if err != nil {
		return result{}, relaytest.SimConfig{}, err
	}
	defer s.close()

	reqs := w.reqs
	conc := o.concurrency
	if m.floor {
		reqs = w.sample(o.floorSample)
		conc = 1
	}
	var next, done atomic.Int64
	var sendErrs atomic.Int64
	var firstErr atomic.Value
	total := len(reqs)
	stopProgress := progress(stderr, m.name, total, &done)
	nextFault := 0
	var faultMu sync.Mutex
	start := time.Now()
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= total {
					return
				}
				if w.timed && !m.floor {
					// Recorded traffic: wait for the request's time.
					if d := time.Until(start.Add(reqs[i].at)); d > 0 {
						time.Sleep(d)
					}
				}
				if !m.floor && fleet != nil {
					faultMu.Lock()
					for nextFault < len(faults) && float64(i) >= faults[nextFault].at*float64(total) {
						faults[nextFault].apply(fleet)
						nextFault++
					}
					faultMu.Unlock()
				}
				q := &reqs[i]
				if err := send(s.routers[s.pick(q)], q); err != nil {
					sendErrs.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	stopProgress()
	if fleet == nil {
		mu.Lock()
		defer mu.Unlock()
		if len(reports) != total {
			return result{}, relaytest.SimConfig{}, fmt.Errorf("%d reports for %d requests", len(reports), total)
		}
		return summarize(m, reports, wall, conc, relaytest.SimStats{}), relaytest.SimConfig{}, nil
	}
	fleet.SetDark("ap-southeast", false)

	mu.Lock()
	defer mu.Unlock()
	if len(reports) != total {
		return result{}, relaytest.SimConfig{}, fmt.Errorf("%d reports for %d requests", len(reports), total)
	}
	res := summarize(m, reports, wall, conc, fleet.Stats())
	return res, fleet.Config(), nil
}

// send makes one request through rt and reads the answer to its end.
func send(rt *relay.Router, q *request) error {
	ep := q.endpoint
	if ep == "" {
		ep = relay.EndpointChat
	}
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost,
		"http://relay.invalid/v1/"+ep, strings.NewReader(q.body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return err
}

// progress prints a progress line on w until stop is called.
func progress(w io.Writer, name string, total int, done *atomic.Int64) (stop func()) {
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				fmt.Fprintf(w, "\rsimulate: %-14s %5d/%d", name, done.Load(), total)
			case <-quit:
				fmt.Fprintf(w, "\rsimulate: %-14s %5d/%d done\n", name, done.Load(), total)
				return
			}
		}
	}()
	return func() { close(quit); wg.Wait() }
}

func summarize(m mode, reports []relay.Report, wall time.Duration, conc int, st relaytest.SimStats) result {
	res := result{Mode: m.name, About: m.about, Requests: len(reports), Concurrency: conc,
		ModelPaths: map[string]float64{}, WallMs: ms(wall)}
	var lat []time.Duration
	var ok, hedged, attempts int
	for _, r := range reports {
		lat = append(lat, r.Latency)
		attempts += r.Attempts
		if r.Hedged {
			hedged++
		}
		if r.Err != nil || r.StatusCode != http.StatusOK {
			res.Failed++
			continue
		}
		ok++
		res.ModelPaths[r.Model]++
		res.CostUSD += r.CostUSD
		if r.Usage == (relay.Usage{}) {
			res.UsageMissing++ // no usage in the answer the router saw (e.g. streams, until stream usage lands)
			continue
		}
		res.PromptTokens += r.Usage.PromptTokens
		res.OutputTokens += r.Usage.CompletionTokens
		res.CachedTokens += r.Usage.CachedTokens
	}
	n := float64(len(reports))
	for k, v := range res.ModelPaths {
		res.ModelPaths[k] = round(100*v/float64(max(ok, 1)), 1)
	}
	slices.Sort(lat)
	res.P50ms, res.P99ms, res.MaxMs = ms(quantile(lat, 0.50)), ms(quantile(lat, 0.99)), ms(lat[len(lat)-1])
	res.ThroughputRPS = round(n/wall.Seconds(), 1)
	res.SuccessPct = round(100*float64(ok)/n, 2)
	res.CostPer1kReq = 1000 * res.CostUSD / n
	if res.OutputTokens > 0 {
		res.CostPer1MOutput = 1e6 * res.CostUSD / float64(res.OutputTokens)
	}
	if res.PromptTokens > 0 {
		res.CacheHitPct = round(100*float64(res.CachedTokens)/float64(res.PromptTokens), 1)
	}
	res.HedgesPct = round(100*float64(hedged)/n, 2)
	res.AttemptsPerReq = round(float64(attempts)/n, 3)
	served := 0
	hot := 0
	for _, p := range st.Paths {
		res.Refused += p.Refused
		res.Throttled += p.Throttled
		for i, sh := range p.Shards {
			served += sh.Served
			hot = max(hot, sh.Served)
			if sh.MaxQueue > res.MaxQueue {
				res.MaxQueue, res.MaxQueueShard = sh.MaxQueue, fmt.Sprintf("%s#%d", p.Name, i)
			}
		}
	}
	if served > 0 {
		res.HotShardPct = round(100*float64(hot)/float64(served), 1)
	}
	return res
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func ms(d time.Duration) float64 { return round(float64(d)/float64(time.Millisecond), 2) }

func round(x float64, places int) float64 {
	p := math.Pow(10, float64(places))
	return math.Round(x*p) / p
}

var shortNames = map[string]string{flagship: "codex", fast: "flash", cheap: "deepseek"}

func paths(m map[string]float64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] || m[keys[i]] == m[keys[j]] && keys[i] < keys[j] })
	var parts []string
	for _, k := range keys {
		name := shortNames[k]
		if name == "" {
			name = k
		}
		parts = append(parts, fmt.Sprintf("%s %.0f%%", name, m[k]))
	}
	return strings.Join(parts, " · ")
}

func printReport(out io.Writer, o options, cfg relaytest.SimConfig, w *workload, results []result) {
	if o.baseURL != "" {
		fmt.Fprintf(out, "REAL ENDPOINT %s — every request was sent to it and billed by it.\n", o.baseURL)
		fmt.Fprintf(out, "Workload: %s\n\n", w.describe())
	} else {
		printFleet(out, o, cfg, w)
	}
	printTables(out, o, results)
}

func printFleet(out io.Writer, o options, cfg relaytest.SimConfig, w *workload) {
	fmt.Fprintf(out, "SIMULATED FLEET — no real provider is called. relaytest.SimFleet on loopback:\n")
	fmt.Fprintf(out, "  %d regions (%s) × %d model paths, %d FIFO shards each (queue %d, full → 429 + retry-after-ms)\n",
		len(cfg.Regions), strings.Join(cfg.Regions, ", "), len(cfg.Models), cfg.Models[0].Shards, cfg.Models[0].QueueLimit)
	for _, m := range cfg.Models {
		fmt.Fprintf(out, "  %-17s service = %v + %v/prompt token (%v cached) + %v/output token\n",
			m.Name, m.Base, m.PrefillPerToken, m.CachedPerToken, m.DecodePerToken)
	}
	fmt.Fprintf(out, "  wall clock = simulated time × %g; clustering: prompts of %d–%d tokens pinned to shard 0 of their path;\n",
		timeScale, o.windowMin, o.windowMax)
	fmt.Fprintf(out, "  prefix cache per path: LRU of %d blocks of %d bytes; faults: ap-southeast dark 25%%–55%% of each relay run,\n", cfg.CacheBlocks, cfg.BlockBytes)
	fmt.Fprintf(out, "  20 × 429 (retry-after-ms) from eu-west at 70%%. Latencies below are wall-clock ms (×%g for simulated).\n", 1/timeScale)
	fmt.Fprintf(out, "Workload: %s\n\n", w.describe())
}

func printTables(out io.Writer, o options, results []result) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tmodel paths\tp50 ms\tp99 ms\treq/s\tsuccess %\t$/1k req\t$/1M out\tcache-hit %\thedges %\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%.1f\t%.0f\t%.2f\t%.4f\t%.2f\t%.1f\t%.1f\t\n",
			r.Mode, paths(r.ModelPaths), r.P50ms, r.P99ms, r.ThroughputRPS, r.SuccessPct,
			r.CostPer1kReq, r.CostPer1MOutput, r.CacheHitPct, r.HedgesPct)
	}
	tw.Flush()
	fmt.Fprintln(out)
	if o.baseURL != "" {
		for _, m := range o.modes {
			about := aboutReal[m.name]
			if about == "" {
				about = m.about
			}
			fmt.Fprintf(out, "  %-14s %s\n", m.name, about)
		}
		ratios(out, results)
		return
	}
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "mode\trequests\tconcurrency\tattempts/req\trefused\t429 burst\tmax queue\thottest shard\tusage missing\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.3f\t%d\t%d\t%d (%s)\t%.1f%% of calls\t%d\t\n",
			r.Mode, r.Requests, r.Concurrency, r.AttemptsPerReq, r.Refused, r.Throttled, r.MaxQueue, r.MaxQueueShard, r.HotShardPct, r.UsageMissing)
	}
	tw.Flush()
	for _, m := range o.modes {
		fmt.Fprintf(out, "  %-14s %s\n", m.name, m.about)
	}

	ratios(out, results)
	if o.baseURL == "" {
		projection(out)
	}
}

// ratios prints the targets as measured.
func ratios(out io.Writer, results []result) {
	get := func(name string) (result, bool) {
		i := slices.IndexFunc(results, func(r result) bool { return r.Mode == name })
		if i < 0 {
			return result{}, false
		}
		return results[i], true
	}
	fl, okF := get("floor")
	di, okD := get("direct")
	ca, okC := get("cluster-aware")
	st, okS := get("striped")
	af, okA := get("affinity")
	fmt.Fprintln(out)
	if okS && okA && st.CacheHitPct > 0 {
		fmt.Fprintf(out, "affinity cache hits / striped = %.1f (target ≥ 2)\n", af.CacheHitPct/st.CacheHitPct)
	}
	if okD && okC {
		fmt.Fprintf(out, "cluster-aware p99 / direct p99 = %.2f (target ≤ 0.5); throughput × %.1f vs direct (target ≥ 2)\n",
			ca.P99ms/di.P99ms, ca.ThroughputRPS/di.ThroughputRPS)
	}
	if okF && okC {
		fmt.Fprintf(out, "cluster-aware p99 / floor p99 = %.2f (target ≤ 1.3)\n", ca.P99ms/fl.P99ms)
	}
	relayModes, under := 0, 0
	for _, r := range results {
		if r.Mode == "floor" || r.Mode == "direct" {
			continue
		}
		relayModes++
		if r.SuccessPct < 99.9 {
			under++
			fmt.Fprintf(out, "mode %s: success %.2f%% is under the 99.9%% target\n", r.Mode, r.SuccessPct)
		}
	}
	if relayModes > 0 && under == 0 {
		fmt.Fprintf(out, "success ≥ 99.9%% in every relay mode (target ≥ 99.9%%)\n")
	}
}

// projection prints a month's cost at 50M output tokens with the default
// prices, split 60/30/10 over the three model paths, at list price and with
// an upstream price factor of 0.147.
func projection(out io.Writer) {
	prices := relay.DefaultPrices()
	const month = 50_000_000
	split := []struct {
		model string
		share float64
	}{{flagship, 0.6}, {fast, 0.3}, {cheap, 0.1}}
	list, all := 0.0, 0.0
	for _, s := range split {
		list += prices[s.model].Cost(relay.Usage{CompletionTokens: int(month * s.share)})
	}
	all = prices[flagship].Cost(relay.Usage{CompletionTokens: month})
	fmt.Fprintf(out, "\nMonthly projection, 50M output tokens (output prices of relay.DefaultPrices; input not included):\n")
	fmt.Fprintf(out, "  all on %s: list $%.2f, with price factor 0.147 $%.2f\n", flagship, all, all*0.147)
	fmt.Fprintf(out, "  60/30/10 over %s / %s / %s: list $%.2f, with price factor 0.147 $%.2f\n",
		flagship, fast, cheap, list, list*0.147)
}

// request is one request of the workload.
type request struct {
	body     string
	endpoint string // "": chat/completions
	prompt   int    // approximate prompt tokens (the router counts exactly)
	output   int
	stream   bool
	kind     string
	at       time.Duration // send offset from the start (timed replays)
}

// workload is the request list, the same in every mode: seeded, or read
// from a replay file.
type workload struct {
	reqs  []request
	timed bool      // send each request at its offset
	bad   []badLine // malformed lines of a replay file
	desc  string    // a replay's description
}

var vocab = strings.Fields(`index file function return value error type struct field method
package import module build test case check parse token count route model region shard cache
prefix request response stream chunk usage cost price latency queue worker batch job agent
summary symbol reference comment line block scope name path config option default limit retry
backoff header body json schema table column row key hash map list set string number bool`)

// sharedContexts is the number of repository contexts (shared system
// prompts of about 500 tokens) the mid and long requests start with.
const sharedContexts = 48

// newWorkload builds n requests shaped like an agent or batch-indexing job:
// 5% short (30–80 prompt tokens), 70% in the 80–260 band IDE completions and
// indexing fill, 20% mid (520–900), 5% long (900–2400). Mid and long
// requests start with one of 48 shared repository contexts (a system prompt
// of about 500 tokens), so prefix caches matter and requests sharing a
// context share an affinity key (the router keys on the first 256 tokens);
// band requests carry a one-line instruction, shorter than a cache block,
// and code of their own. Output tokens: 12–48 (short, band), 24–96 (mid),
// 48–160 (long), sent as max_tokens, which the fleet answers exactly. 30%
// stream (with stream_options.include_usage).
func newWorkload(seed uint64, n int) *workload {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	enc := bpe.O200K()
	contexts := make([]string, sharedContexts)
	for i := range contexts {
		contexts[i] = fmt.Sprintf("You are indexing agent %d for repository project-%d. Repository map: ", i, i*11+5) + words(rng, 480) + "."
	}
	w := &workload{}
	for range n {
		q := request{stream: rng.Float64() < 0.3}
		sys := ""
		switch x := rng.Float64(); {
		case x < 0.05:
			q.kind, q.prompt, q.output = "short", 30+rng.IntN(50), 12+rng.IntN(37)
		case x < 0.75:
			q.kind, q.prompt, q.output = "band", 80+rng.IntN(181), 12+rng.IntN(37)
		case x < 0.95:
			q.kind, q.prompt, q.output = "mid", 520+rng.IntN(380), 24+rng.IntN(73)
		default:
			q.kind, q.prompt, q.output = "long", 900+rng.IntN(1501), 48+rng.IntN(113)
		}
		switch q.kind {
		case "band":
			sys = fmt.Sprintf("Complete code in project-%d.", rng.IntN(8))
		case "mid", "long":
			sys = contexts[rng.IntN(len(contexts))]
		}
		// chat formula: 3 per message + role + content, 3 for the reply.
		need := q.prompt - 3 - 1 - 3
		msgs := []map[string]string{}
		if sys != "" {
			msgs = append(msgs, map[string]string{"role": "system", "content": sys})
			need -= 3 + 1 + enc.Count(sys)
		}
		user := fmt.Sprintf("File src/%s/%s_%d.go:", vocab[rng.IntN(len(vocab))], vocab[rng.IntN(len(vocab))], rng.IntN(1000))
		// Space-separated words are pre-tokens of their own, so the count of
		// the text is the sum of the counts of " word".
		have := enc.Count(user)
		var ub strings.Builder
		ub.WriteString(user)
		for have < need {
			word := vocab[rng.IntN(len(vocab))]
			ub.WriteString(" " + word)
			have += wordTokens[word]
		}
		user = ub.String()
		msgs = append(msgs, map[string]string{"role": "user", "content": user})
		body := map[string]any{"model": flagship, "messages": msgs, "max_tokens": q.output}
		if q.stream {
			body["stream"] = true
			body["stream_options"] = map[string]any{"include_usage": true}
		}
		b, _ := json.Marshal(body)
		q.body = string(b)
		w.reqs = append(w.reqs, q)
	}
	return w
}

// wordTokens are the o200k_base tokens of " word" for each vocab word.
var wordTokens = func() map[string]int {
	m := make(map[string]int, len(vocab))
	for _, w := range vocab {
		m[w] = bpe.O200K().Count(" " + w)
	}
	return m
}()

func words(rng *rand.Rand, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocab[rng.IntN(len(vocab))])
	}
	return b.String()
}

// sample returns k requests evenly spaced over the workload (all when k is
// at least its size).
func (w *workload) sample(k int) []request {
	if k >= len(w.reqs) {
		return w.reqs
	}
	out := make([]request, k)
	for i := range out {
		out[i] = w.reqs[i*len(w.reqs)/k]
	}
	return out
}

func (w *workload) describe() string {
	if w.desc != "" {
		return w.desc
	}
	count := map[string]int{}
	streams := 0
	for _, q := range w.reqs {
		count[q.kind]++
		if q.stream {
			streams++
		}
	}
	n := float64(len(w.reqs))
	return fmt.Sprintf("%d requests to %s: %.0f%% 30–80 tokens, %.0f%% 80–260, %.0f%% 520–900, %.0f%% 900–2400; mid and long behind %d shared ~500-token contexts; %.0f%% streamed",
		len(w.reqs), flagship, 100*float64(count["short"])/n, 100*float64(count["band"])/n,
		100*float64(count["mid"])/n, 100*float64(count["long"])/n, sharedContexts, 100*float64(streams)/n)
}
