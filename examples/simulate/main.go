// Command simulate sends one seeded workload to a simulated fleet of
// OpenAI-compatible upstreams in several modes — straight to one upstream,
// round-robin over the whole fleet, and through the relay router with
// several strategies — and prints its verdict first (cluster-aware routing
// against the same upstreams without the router and against one upstream,
// verdict.go), then p50, p99, throughput, success, cost and cache hits side
// by side, with the targets each run is held to. The guide is the
// repository's docs/simulation.md.
//
// The fleet is simulated: package simfleet runs it on loopback, no key and
// no network needed. Its model (regions of FIFO shards with bounded queues,
// service time = prefill + decode on a 1:50 clock, the clustering of 150–220
// token prompts onto one shard, prefix caches per region and model path, a
// region going dark, 429 bursts, slow shards and hung connections) is
// documented in package simfleet; the numbers show how routing changes
// queueing and caching in that model, not what any provider measures.
//
// -workload picks the traffic (batch, chat, agent; workload.go), -scenario
// the trouble it meets (outage, none, stalls; scenario.go). The budget mode
// (budget.go) runs cluster-aware routing under a relay.Budget the workload
// outspends; the priority mode (priority.go) a batch flood and an
// interactive trickle under one upstream's RPM limit, without and with
// X-Relay-Priority. -replicas N (replicas.go) then compares N routers over
// upstreams that enforce RPM and TPM limits (gate.go), with per-process
// state and with the limits shared on Redis (an embedded server unless
// -redis names one). These runs keep their routers on a simulated clock
// (clock.go), so limits per minute and budget windows are simulated time.
// -save FILE also writes the rows, with each mode's latency CDF, for the
// charts of examples/simchart (save.go). On the batch
// workload the run prints the unloaded lower bound of cluster-aware's p99
// (bound.go); -sweep SIZES prints a workload's cache hits by prefix-cache
// size from an offline replay instead of running the modes (sweep.go).
// With -replay FILE it replays a JSONL file of recorded requests instead
// (see replay.go), against the simulated fleet or, with -base-url, against
// a real OpenAI-compatible endpoint.
//
//	go run ./examples/simulate
//	go run ./examples/simulate -workload chat
//	go run ./examples/simulate -scenario stalls -modes cluster-aware,hedged
//	go run ./examples/simulate -requests 500 -concurrency 16 -modes direct,cluster-aware -json
//	go run ./examples/simulate -modes cluster-aware,budget,priority
//	go run ./examples/simulate -modes direct -replicas 4
//	go run ./examples/simulate -modes direct -replicas 4 -redis 127.0.0.1:6379
//	go run ./examples/simulate -save run.json && go run ./examples/simchart -out charts run.json
//	go run ./examples/simulate -workload chat -sweep 1024,4096,8192,16384
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
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/examples/simulate/simfleet"
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

// Time limits, in simulated time. Every request's context has a deadline of
// callerDeadline, as a caller's would (it only matters for a hung
// connection in the modes that do not retry); the relay modes bound each
// attempt's wait for response headers by attemptTimeout and try elsewhere.
// Both are far above the slowest legitimate answer of any workload.
const (
	callerDeadline = 5 * time.Minute
	attemptTimeout = time.Minute
)

// simCacheBlocks is the prefix cache of each (region, model) of the fleet:
// 8192 blocks of 64 bytes, 512 KB of canonical prompt text (about 80k
// tokens of the workloads' text). The README's tuning table shows why:
// it holds what one region's share of the chat and agent sessions needs,
// not every session's history in every region.
const simCacheBlocks = 8192

// flagshipInput is the input price the simulation gives the flagship,
// whose input price relay.DefaultPrices leaves unpublished (0): without
// one, cache hits would show in latency but never in cost.
var flagshipInput = relay.Price{InputPerMTok: 1.25, CachedInputPerMTok: 0.125}

// simPrices are the fleet's prices: relay.DefaultPrices with the flagship's
// input priced at flagshipInput.
func simPrices() map[string]relay.Price {
	p := relay.DefaultPrices()
	f := p[flagship]
	f.InputPerMTok, f.CachedInputPerMTok = flagshipInput.InputPerMTok, flagshipInput.CachedInputPerMTok
	p[flagship] = f
	return p
}

// mode is one row of the table. Adding a mode is one entry here.
type mode struct {
	name  string
	about string
	// floor sends a sample of the workload one request at a time.
	floor bool
	// simOnly: the mode needs the simulated fleet (not -base-url).
	simOnly bool
	// newSender builds the mode's client side over a running fleet.
	newSender func(e *env) (*sender, error)
	// run, when set, runs the mode instead, for traffic of its own shape
	// (the priority mode).
	run func(o options, m mode, w *workload, stderr io.Writer) (result, simfleet.Config, error)
}

var modes = []mode{
	{name: "floor", about: "direct, one request at a time (unloaded baseline)", floor: true, newSender: direct},
	{name: "direct", about: "one upstream (us-east " + flagship + "), no retries: the \"before\" row", newSender: direct},
	{name: "baseline", about: "no router: the 12 upstreams in turn, each asked for its own model, no retries (capacity-matched)",
		newSender: baseline},
	{name: "striped", about: "relay over 4 regions, StrategyWeighted (random first region), retries elsewhere",
		newSender: relayed(relayMode{strategy: relay.StrategyWeighted})},
	{name: "affinity", about: "relay over 4 regions, StrategyAffinity (prompt-prefix home region + 12.5% jitter), retries elsewhere",
		newSender: relayed(relayMode{strategy: relay.StrategyAffinity})},
	{name: "bounded", about: "relay over 4 regions, StrategyBoundedLoad (the home region unless it holds over ⌈LoadFactor·average⌉ in flight)",
		newSender: relayed(relayMode{strategy: relay.StrategyBoundedLoad})},
	{name: "expected-cost", about: "relay over 4 regions, StrategyExpectedCost (the cheapest region for the prompt's predicted cached tokens, at most LoadFactor 2 × the average in flight; cold prompts: the affinity home), retries elsewhere",
		simOnly: true, newSender: expectedCost},
	{name: "cluster-aware", about: "affinity + ClusterPolicy: 80–260 tokens → " + fast + ", other mid → " + cheap,
		newSender: relayed(relayMode{strategy: relay.StrategyAffinity, policy: clusterPolicy(false)})},
	{name: "cluster-busy", about: "cluster-aware, WhenBusy: the window moves only while " + flagship + " is busy",
		newSender: relayed(relayMode{strategy: relay.StrategyAffinity, policy: clusterPolicy(true)})},
	{name: "budget", about: fmt.Sprintf("cluster-aware (CheapWhenSpent %g) under a relay.Budget on all traffic, Downgrade → %s, on the simulated clock", cheapWhenSpent, cheap),
		simOnly: true, newSender: budgeted},
	{name: "priority", about: fmt.Sprintf("the workload's first %d requests to one upstream (us-east %s) under an RPM limit on the simulated clock: a batch flood plus an interactive trickle, with X-Relay-Priority (the priority table compares a run without)", priorityRequests, fast),
		simOnly: true, run: runPriority},
	// P95 because one fixed delay cannot suit three model paths of
	// different speeds; the 3 s floor keeps the 5% budget for the calls
	// that are slow for no reason of their own (stalls) instead of spending
	// it on the long prompts that are slow everywhere. A stream's headers
	// come at once, so hedging cannot see a stream stall; first-token
	// failover can (see the README).
	{name: "hedged", about: "cluster-aware + HedgeConfig{P95: true, Delay: 3 s}: a second region once an answer is slower than its p95 and 3 s (5% budget); Stream.FirstTokenTimeout 5 s: a stream silent 5 s after its headers goes elsewhere",
		newSender: relayed(relayMode{strategy: relay.StrategyAffinity, policy: clusterPolicy(false),
			hedge:  relay.HedgeConfig{P95: true, Delay: scaled(3 * time.Second)},
			stream: relay.StreamConfig{FirstTokenTimeout: scaled(5 * time.Second)}})},
}

// aboutReal describes the modes against a real endpoint (-base-url).
var aboutReal = map[string]string{
	"floor":         "direct, one request at a time",
	"direct":        "a Router with the one endpoint, no policy, no retries",
	"baseline":      "the one endpoint, no router, no retries",
	"striped":       "a Router with the one endpoint, retries and breaker (no other region to stripe over)",
	"cluster-aware": "striped + ClusterPolicy with -fast and -cheap",
	"cluster-busy":  "cluster-aware, WhenBusy",
	"affinity":      "striped with StrategyAffinity (one endpoint: the same route for every key)",
	"bounded":       "striped with StrategyBoundedLoad (one endpoint: the same route for every key)",
	"hedged":        "cluster-aware + P95 hedging and first-token failover (the second call goes to the same endpoint)",
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
	workload    string   // a generated workload's name
	scenario    scenario // the fleet's trouble
	loadFactor  float64  // Config.LoadFactor of the bounded mode; 0: relay's default
	cacheBlocks int      // simfleet.Config.CacheBlocks; 0: the fleet's default
	tty         bool     // stderr is a terminal: progress redraws one line

	// Replay (replay.go).
	replay      string  // JSONL file of recorded requests; "": the generated workload
	baseURL     string  // real endpoint to replay against; "": the simulated fleet
	apiKey      string  // for baseURL; never printed
	speed       float64 // divides recorded times
	requestsSet bool    // -requests was given (it then caps a replay)
	fast, cheap string  // ClusterPolicy models
	save        string  // file to write the rows into, for charts; "": none

	// The cache sweep (sweep.go): prefix-cache sizes to replay the
	// workload through; nil: no sweep.
	sweep []int

	// The replicas comparison (replicas.go).
	replicas int    // routers sharing the fleet; 0: no comparison
	redis    string // Redis address of the shared state; "": an embedded server
}

// flagText are the flags parsed into options only once checked.
type flagText struct {
	window, modeList, scenario string
	sweep                      string
	seed                       int64
	set                        map[string]bool // the flags given
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	var raw flagText
	fs := defineFlags(&o, &raw, stderr)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	raw.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { raw.set[f.Name] = true })
	err := o.check(raw, fs.Args())
	if err == nil {
		err = o.checkSweep(raw)
	}
	if err == nil {
		err = o.checkRemote(&raw)
	}
	if err == nil {
		err = o.pick(raw)
	}
	if err != nil {
		fmt.Fprintf(stderr, "simulate: %v\n", err)
		fs.Usage()
	}
	return o, err
}

// defineFlags defines the command's flags, into o and raw.
func defineFlags(o *options, raw *flagText, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.requests, "requests", 1200, "requests per mode")
	fs.IntVar(&o.concurrency, "concurrency", 24, "requests in flight at once (the floor mode sends one at a time)")
	fs.Int64Var(&raw.seed, "seed", 1, "workload seed")
	fs.StringVar(&o.workload, "workload", "batch", "the generated traffic: "+strings.Join(workloadNames(), ", "))
	fs.StringVar(&raw.scenario, "scenario", "outage", "the fleet's trouble: "+strings.Join(scenarioNames(), ", "))
	fs.StringVar(&raw.window, "window", "150-220", "the fleet's clustered prompt-token window, MIN-MAX")
	fs.StringVar(&raw.modeList, "modes", strings.Join(modeNames(), ","), "comma-separated modes: "+strings.Join(modeNames(), ", "))
	fs.BoolVar(&o.json, "json", false, "print one JSON array, an object per mode, instead of the tables")
	fs.IntVar(&o.floorSample, "floor-sample", 100, "requests the floor mode sends (whole sessions evenly spaced over the workload)")
	fs.Float64Var(&o.loadFactor, "load-factor", 0, "Config.LoadFactor of the bounded mode (0: relay's default, 1.25)")
	fs.IntVar(&o.cacheBlocks, "cache-blocks", simCacheBlocks, "prefix-cache blocks (64 bytes each) per (region, model) of the simulated fleet")
	fs.StringVar(&o.replay, "replay", "", "replay this JSONL file of recorded chat-completions or responses bodies instead of the generated workload")
	fs.StringVar(&o.baseURL, "base-url", "", "with -replay: send to this real OpenAI-compatible API root (e.g. https://api.openai.com/v1) instead of the simulated fleet")
	fs.StringVar(&o.apiKey, "api-key", "", "API key for -base-url (default $OPENAI_API_KEY)")
	fs.Float64Var(&o.speed, "speed", 1, "with -replay: replay the recorded timestamps this many times faster")
	fs.StringVar(&o.fast, "fast", fast, "the cluster-aware modes' fast model (ClusterPolicy.Fast)")
	fs.StringVar(&o.cheap, "cheap", cheap, "the cluster-aware modes' cheap model (ClusterPolicy.Cheap)")
	fs.StringVar(&o.save, "save", "", "also write the rows (the objects of -json, one a line, each mode's with its latency CDF) to `FILE`,\nfor the charts of examples/simchart: go run ./examples/simchart -out DIR FILE")
	fs.StringVar(&raw.sweep, "sweep", "", "instead of the modes, print the workload's cache hits with prefix caches of these `SIZES` (comma-separated blocks, e.g.\n1024,4096,8192,16384), from an offline replay of its requests through the fleet's cache under four routing rules")
	fs.IntVar(&o.replicas, "replicas", 0, "after the modes, compare `N` routers (one per simulated replica) over upstreams that enforce RPM/TPM limits:\nper-process state, then limits shared on Redis (0: no comparison)")
	fs.StringVar(&o.redis, "redis", "", "with -replicas: the Redis server (`host:port`) of the shared state (default: an embedded, in-process server)")
	fs.Usage = func() {
		fmt.Fprint(stderr, usageHead)
		fs.PrintDefaults()
		fmt.Fprintf(stderr, "\nmodes (-modes):\n")
		for _, m := range modes {
			fmt.Fprintf(stderr, "  %-14s %s\n", m.name, m.about)
		}
		fmt.Fprintf(stderr, "\nworkloads (-workload):\n")
		for _, g := range workloads {
			fmt.Fprintf(stderr, "  %-7s %s\n", g.name, g.about)
		}
		fmt.Fprintf(stderr, "\nscenarios (-scenario):\n")
		for _, sc := range scenarios {
			fmt.Fprintf(stderr, "  %-7s %s\n", sc.name, sc.about)
		}
	}
	return fs
}

// check checks the flags that stand on their own, and the seed, workload
// and scenario.
func (o *options) check(raw flagText, args []string) error {
	switch {
	case len(args) > 0:
		return fmt.Errorf("unexpected arguments %q", args)
	case o.requests <= 0:
		return fmt.Errorf("-requests must be positive, got %d", o.requests)
	case o.concurrency <= 0:
		return fmt.Errorf("-concurrency must be positive, got %d", o.concurrency)
	case o.floorSample <= 0:
		return fmt.Errorf("-floor-sample must be positive, got %d", o.floorSample)
	case raw.seed < 0:
		return fmt.Errorf("-seed must not be negative, got %d", raw.seed)
	}
	o.seed = uint64(raw.seed)
	o.requestsSet = raw.set["requests"]
	if !slices.Contains(workloadNames(), o.workload) {
		return fmt.Errorf("unknown workload %q (workloads: %s)", o.workload, strings.Join(workloadNames(), ", "))
	}
	i := slices.IndexFunc(scenarios, func(s scenario) bool { return s.name == raw.scenario })
	if i < 0 {
		return fmt.Errorf("unknown scenario %q (scenarios: %s)", raw.scenario, strings.Join(scenarioNames(), ", "))
	}
	o.scenario = scenarios[i]
	switch {
	case o.replay != "" && raw.set["workload"]:
		return errors.New("-workload and -replay exclude each other: a replay is its own workload")
	case o.loadFactor != 0 && !(o.loadFactor >= 1 && !math.IsInf(o.loadFactor, 0)):
		return fmt.Errorf("-load-factor must be at least 1, got %g", o.loadFactor)
	case o.replicas < 0:
		return fmt.Errorf("-replicas must not be negative, got %d", o.replicas)
	case o.redis != "" && o.replicas == 0:
		return errors.New("-redis needs -replicas: only the replicas comparison shares state")
	case o.cacheBlocks <= 0:
		return fmt.Errorf("-cache-blocks must be positive, got %d", o.cacheBlocks)
	case !(o.speed > 0) || math.IsInf(o.speed, 0):
		return fmt.Errorf("-speed must be a positive number, got %g", o.speed)
	case raw.set["speed"] && o.replay == "":
		return errors.New("-speed applies to -replay only")
	case raw.set["api-key"] && o.baseURL == "":
		return errors.New("-api-key applies to -base-url only")
	}
	return nil
}

// sweepFlags are the flags that apply to -sweep: the generated workload's.
var sweepFlags = []string{"sweep", "workload", "seed", "requests", "concurrency"}

// checkSweep reads -sweep's cache sizes and refuses the flags that do not
// apply to it.
func (o *options) checkSweep(raw flagText) error {
	if !raw.set["sweep"] {
		return nil
	}
	for name := range raw.set {
		if !slices.Contains(sweepFlags, name) {
			return fmt.Errorf("-%s does not apply to -sweep (it takes %s)", name, "-"+strings.Join(sweepFlags[1:], ", -"))
		}
	}
	for _, f := range strings.Split(raw.sweep, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return fmt.Errorf("-sweep must list positive cache sizes in blocks, e.g. 1024,8192, got %q", raw.sweep)
		}
		o.sweep = append(o.sweep, n)
	}
	return nil
}

// checkRemote checks the flags of a replay against a real endpoint
// (-base-url), and sets what such a run changes: no scenario, the key from
// the environment, the direct and striped modes unless -modes is given.
func (o *options) checkRemote(raw *flagText) error {
	if o.baseURL != "" {
		if o.replay == "" {
			return errors.New("-base-url needs -replay: only recorded traffic is sent to a real endpoint")
		}
		if u, err := url.Parse(o.baseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("-base-url must be an http or https URL, got %q", o.baseURL)
		}
		if o.replicas > 0 {
			return errors.New("-replicas runs on the simulated fleet only, not with -base-url")
		}
		if raw.set["scenario"] || raw.set["cache-blocks"] || raw.set["window"] {
			return errors.New("-scenario, -cache-blocks and -window shape the simulated fleet; they do not apply to -base-url")
		}
		o.scenario = scenario{name: "none", about: "no fault"}
		if o.apiKey == "" {
			o.apiKey = os.Getenv("OPENAI_API_KEY")
		}
		if !raw.set["modes"] {
			raw.modeList = "direct,striped"
		}
	}
	if o.fast == "" || o.cheap == "" {
		return errors.New("-fast and -cheap must name models")
	}
	if o.baseURL == "" && (o.fast != fast || o.cheap != cheap) {
		return fmt.Errorf("-fast and -cheap apply to -base-url only: the simulated fleet serves %s, %s and %s", flagship, fast, cheap)
	}
	return nil
}

// pick reads the clustered window and the modes to run.
func (o *options) pick(raw flagText) error {
	lo, hi, ok := strings.Cut(raw.window, "-")
	wmin, err1 := strconv.Atoi(strings.TrimSpace(lo))
	wmax, err2 := strconv.Atoi(strings.TrimSpace(hi))
	switch {
	case !ok || err1 != nil || err2 != nil:
		return fmt.Errorf("-window must be MIN-MAX with MIN and MAX non-negative token counts, got %q", raw.window)
	case wmin > wmax || wmax == 0:
		return fmt.Errorf("-window %q is empty: MIN must be at most MAX, and MAX positive", raw.window)
	}
	o.windowMin, o.windowMax = wmin, wmax
	seen := map[string]bool{}
	for _, name := range strings.Split(raw.modeList, ",") {
		name = strings.TrimSpace(name)
		i := slices.IndexFunc(modes, func(m mode) bool { return m.name == name })
		if i < 0 {
			return fmt.Errorf("unknown mode %q (modes: %s)", name, strings.Join(modeNames(), ", "))
		}
		if modes[i].simOnly && o.baseURL != "" {
			return fmt.Errorf("mode %s runs on the simulated fleet only, not with -base-url", name)
		}
		if !seen[name] {
			seen[name] = true
			o.modes = append(o.modes, modes[i])
		}
	}
	return nil
}

// usageHead opens the usage text: what the command simulates.
const usageHead = `usage: simulate [flags]

Runs a seeded workload against a simulated fleet (OpenAI-compatible servers on loopback
with simulated queues, caches and service times, 1 simulated second = 20 ms; no key, no
network) in several modes and prints a verdict (cluster-aware routing against the same
upstreams without the router, and against one upstream), then tables (or, with -json, one
JSON array) of latency, throughput, cost and cache hits. The budget and priority modes and the
-replicas comparison run their routers on a simulated clock, so their rate limits and budget
windows count simulated minutes; in the -replicas comparison the fleet's upstreams enforce
RPM/TPM limits as a provider would, and the shared state runs on an embedded Redis unless
-redis names one. With -save FILE it also writes the rows that examples/simchart draws
SVG charts from.

`

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
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
	o.tty = isTerminal(stderr)
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
		i := slices.IndexFunc(workloads, func(g generator) bool { return g.name == o.workload })
		w = workloads[i].gen(o.seed, o.requests, o.concurrency)
	}
	if o.sweep != nil {
		if err := runSweep(stdout, o, w, o.sweep); err != nil {
			fmt.Fprintf(stderr, "simulate: -sweep: %v\n", err)
			return 1
		}
		return 0
	}
	var results []result
	var cfg simfleet.Config
	for _, m := range o.modes {
		res, c, err := runMode(o, m, w, stderr)
		cfg = c
		if err != nil {
			fmt.Fprintf(stderr, "simulate: mode %s: %v\n", m.name, err)
			return 1
		}
		res.Workload, res.Scenario, res.RealEndpoint = w.name, o.scenario.name, o.baseURL != ""
		if o.replay != "" {
			res.Workload = "replay"
		}
		results = append(results, res)
	}
	if err := addBound(o, cfg, w, results); err != nil {
		fmt.Fprintf(stderr, "simulate: unloaded bound: %v\n", err)
		return 1
	}
	if err := addCalm(o, w, results, stderr); err != nil {
		fmt.Fprintf(stderr, "simulate: %s without stalls: %v\n", calmMode, err)
		return 1
	}
	if o.replicas > 0 {
		rows, err := runReplicas(o, w, stderr)
		if err != nil {
			fmt.Fprintf(stderr, "simulate: replicas: %v\n", err)
			return 1
		}
		for i := range rows {
			rows[i].Workload, rows[i].Scenario = results[0].Workload, o.scenario.name
		}
		results = append(results, rows...)
	}
	if o.save != "" {
		if err := save(o.save, results); err != nil {
			fmt.Fprintf(stderr, "simulate: -save: %v\n", err)
			return 1
		}
		fmt.Fprintf(stderr, "simulate: wrote %s (charts: go run ./examples/simchart -out DIR %s)\n", o.save, o.save)
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
	fleet *simfleet.Fleet // nil against a real endpoint
	w     *workload
	// direct are the upstreams of the direct modes: us-east's, one a
	// model (the generated workloads ask for the flagship alone); all,
	// every upstream of the relay modes (against a real endpoint, both are
	// that endpoint).
	direct     []relay.Upstream
	all        []relay.Upstream
	fast       string
	cheap      string
	prices     map[string]relay.Price // nil: relay.DefaultPrices
	loadFactor float64
	base       http.RoundTripper
	onReport   func(relay.Report)
}

// sender sends one request of the workload and reads its answer to the end.
type sender struct {
	do    func(ctx context.Context, q *request) error
	close func()
	// finish, when set, adds what the mode measured beyond the table's
	// columns to its row, once every request is done; reports are the
	// run's, in the order they came.
	finish func(res *result, reports []relay.Report)
}

// routed sends through r.
func routed(r *relay.Router) *sender {
	return &sender{do: func(ctx context.Context, q *request) error { return send(withRequest(ctx, q), r, q) }, close: r.CloseIdleConnections}
}

// direct sends every request to us-east's flagship, once: a Router with
// one upstream and no retries, so cost and cache hits come from the same
// OnReport as the relay modes.
func direct(e *env) (*sender, error) {
	r, err := relay.New(relay.Config{
		Upstreams: e.direct,
		Base:      e.base,
		OnReport:  e.onReport,
		Prices:    e.prices,
		Retry:     relay.RetryConfig{MaxAttempts: 1},
	})
	if err != nil {
		return nil, err
	}
	return routed(r), nil
}

// relayMode is the router configuration of a relay mode.
type relayMode struct {
	strategy relay.Strategy
	policy   func(e *env) relay.Policy // nil: keep the requested model
	hedge    relay.HedgeConfig
	stream   relay.StreamConfig
}

// relayConfig is the configuration every relay mode starts from: the
// run's transport, report hook and prices, with retries and breakers on
// the fleet's time scale (see routerTiming). With clock set, the router
// runs on it and every duration is simulated time: the fleet's retry hints
// are turned to simulated time for it (simHints), and its reports back to
// wall-clock time for the tables.
func relayConfig(e *env, clock *simClock) relay.Config {
	retry, breaker, stream := routerTiming(clock != nil)
	cfg := relay.Config{Base: e.base, OnReport: e.onReport, Prices: e.prices,
		Retry: retry, Breaker: breaker, Stream: stream}
	if clock != nil {
		cfg.Clock, cfg.Base = clock, simHints{e.base}
		cfg.OnReport = func(r relay.Report) {
			r.Latency, r.TTFT = scaled(r.Latency), scaled(r.TTFT)
			e.onReport(r)
		}
	}
	return cfg
}

// relayed sends through one Router over every region and model path, with
// retries, ordering the upstreams of a model by the mode's strategy.
func relayed(rm relayMode) func(e *env) (*sender, error) {
	return func(e *env) (*sender, error) {
		cfg := relayConfig(e, nil)
		cfg.Upstreams, cfg.Strategy, cfg.LoadFactor = e.all, rm.strategy, e.loadFactor
		if rm.policy != nil {
			cfg.Policy = rm.policy(e)
		}
		cfg.Hedge, cfg.Stream = rm.hedge, rm.stream
		r, err := relay.New(cfg)
		if err != nil {
			return nil, err
		}
		return routed(r), nil
	}
}

// rig is one run of a mode: the fleet (nil against a real endpoint), the
// env its sender is built over, and the reports it collects.
type rig struct {
	e       *env
	fleet   *simfleet.Fleet
	base    *http.Transport
	mu      sync.Mutex
	reports []relay.Report
}

// newRig starts a fleet for o (unless o names a real endpoint) and the
// transport and report hook of one run of w.
func newRig(o options, w *workload) *rig {
	g := &rig{e: &env{w: w, fast: o.fast, cheap: o.cheap, loadFactor: o.loadFactor}}
	e := g.e
	if o.baseURL == "" {
		g.fleet = simfleet.New(simfleet.Config{
			TimeScale:   timeScale,
			ClusterMin:  o.windowMin,
			ClusterMax:  o.windowMax,
			CacheBlocks: o.cacheBlocks,
		})
		e.fleet = g.fleet
		e.prices = simPrices()
		for _, u := range g.fleet.Upstreams() {
			ru := relay.Upstream{Name: u.Name, BaseURL: u.URL, Models: []string{u.Model}}
			e.all = append(e.all, ru)
			if u.Region == "us-east" {
				// The generated workloads ask for the flagship only; a
				// replay may ask for the fleet's other models too.
				e.direct = append(e.direct, ru)
			}
		}
		if o.scenario.stalls != (simfleet.Stalls{}) {
			st := o.scenario.stalls
			st.Seed = o.seed
			g.fleet.SetStalls(st)
		}
	} else {
		e.direct = []relay.Upstream{{Name: "remote", BaseURL: strings.TrimSuffix(o.baseURL, "/"), APIKey: o.apiKey}}
		e.all = e.direct
	}
	g.base = &http.Transport{
		MaxIdleConns:        0,
		MaxIdleConnsPerHost: 2*o.concurrency + 8,
		IdleConnTimeout:     30 * time.Second,
	}
	e.base = g.base
	e.onReport = func(r relay.Report) {
		g.mu.Lock()
		g.reports = append(g.reports, r)
		g.mu.Unlock()
	}
	return g
}

// close closes the transport's idle connections, then the fleet.
func (g *rig) close() {
	g.base.CloseIdleConnections()
	if g.fleet != nil {
		g.fleet.Close()
	}
}

// result summarizes the run's reports as m's row, with what snd adds;
// total is the number of requests sent.
func (g *rig) result(m mode, o options, snd *sender, wall time.Duration, conc, total int) (result, simfleet.Config, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.reports) != total {
		return result{}, simfleet.Config{}, fmt.Errorf("%d reports for %d requests", len(g.reports), total)
	}
	var res result
	var cfg simfleet.Config
	if g.fleet == nil {
		res = summarize(m, o, g.reports, wall, conc, nil, simfleet.Stats{})
	} else {
		res, cfg = summarize(m, o, g.reports, wall, conc, g.e.prices, g.fleet.Stats()), g.fleet.Config()
	}
	if snd.finish != nil {
		snd.finish(&res, g.reports)
	}
	return res, cfg, nil
}

// traffic is what a run sends: sessions, by conc workers with users
// sessions open at once, each request at its offset when timed, and the
// faults to apply by share of requests sent.
type traffic struct {
	sessions    [][]request
	conc, users int
	timed       bool
	faults      []fault
}

// modeTraffic is the traffic of mode m: the workload (the floor: a sample,
// one request at a time), with the scenario's faults in the relay modes
// against the simulated fleet.
func modeTraffic(o options, m mode, w *workload, fleet *simfleet.Fleet) traffic {
	t := traffic{sessions: w.sessions, conc: o.concurrency, users: w.users, timed: w.timed, faults: o.scenario.faults}
	if m.floor {
		t.sessions = w.sample(o.floorSample)
		t.conc, t.users, t.timed = 1, 1, false
	}
	if m.floor || fleet == nil {
		t.faults = nil
	}
	if t.users <= 0 {
		t.users = len(t.sessions)
	}
	return t
}

func (t traffic) total() int {
	n := 0
	for _, s := range t.sessions {
		n += len(s)
	}
	return n
}

func runMode(o options, m mode, w *workload, stderr io.Writer) (result, simfleet.Config, error) {
	if m.run != nil {
		return m.run(o, m, w, stderr)
	}
	g := newRig(o, w)
	defer g.close()
	snd, err := m.newSender(g.e)
	if err != nil {
		return result{}, simfleet.Config{}, err
	}
	defer snd.close()
	t := modeTraffic(o, m, w, g.fleet)
	var done atomic.Int64
	stop := progress(stderr, o.tty, m.name, t.total(), &done)
	wall := drive(t, snd, g.fleet, &done)
	stop()
	return g.result(m, o, snd, wall, t.conc, t.total())
}

// drive sends t through snd and returns the wall-clock time from the first
// request to the last answer; done counts the requests answered.
//
// The open sessions wait in ready; a worker takes the one at the front,
// sends its next request, and puts it back at the end (or, when it is
// over, opens the one after it in the workload). The last request closes
// ready.
func drive(t traffic, snd *sender, fleet *simfleet.Fleet, done *atomic.Int64) time.Duration {
	type open struct {
		reqs []request
		next int
	}
	sessions, total := t.sessions, t.total()
	ready := make(chan *open, len(sessions))
	var qmu sync.Mutex
	opened, remaining := 0, total
	for ; opened < min(t.users, len(sessions)); opened++ {
		ready <- &open{reqs: sessions[opened]}
	}
	if total == 0 {
		close(ready)
	}
	var sent atomic.Int64
	nextFault := 0
	start := time.Now()
	var wg sync.WaitGroup
	for range t.conc {
		wg.Go(func() {
			for s := range ready {
				q := &s.reqs[s.next]
				i := int(sent.Add(1)) - 1
				if t.timed {
					// Recorded traffic: wait for the request's time.
					if d := time.Until(start.Add(q.at)); d > 0 {
						time.Sleep(d)
					}
				}
				qmu.Lock()
				for nextFault < len(t.faults) && float64(i) >= t.faults[nextFault].at*float64(total) {
					t.faults[nextFault].apply(fleet)
					nextFault++
				}
				qmu.Unlock()
				ctx, cancel := context.WithTimeout(context.Background(), scaled(callerDeadline))
				_ = snd.do(ctx, q) // failures are in the reports
				cancel()
				done.Add(1)
				qmu.Lock()
				s.next++
				switch {
				case s.next < len(s.reqs):
					ready <- s
				case opened < len(sessions):
					ready <- &open{reqs: sessions[opened]}
					opened++
				}
				if remaining--; remaining == 0 {
					close(ready)
				}
				qmu.Unlock()
			}
		})
	}
	wg.Wait()
	return time.Since(start)
}

// decideBody returns r's decision for a request of the workload to q's
// endpoint with body (q's own, or one cut from it), sending nothing.
func decideBody(r *relay.Router, q *request, body string) (relay.Decision, error) {
	req, err := http.NewRequest(http.MethodPost, "http://relay.invalid/v1/"+endpointOf(*q), strings.NewReader(body))
	if err != nil {
		return relay.Decision{}, err
	}
	return r.Decide(req)
}

// send makes one request through rt and reads the answer to its end.
func send(ctx context.Context, rt *relay.Router, q *request) error {
	_, err := sendStatus(ctx, rt, q)
	return err
}

// sendStatus is send, with the answer's status (0 when none came).
func sendStatus(ctx context.Context, rt *relay.Router, q *request) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost,
		"http://relay.invalid/v1/"+endpointOf(*q), strings.NewReader(q.body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if q.priority != "" {
		req.Header.Set(relay.HeaderPriority, q.priority)
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, err
}

// progress reports a mode's progress on w until stop is called: on a
// terminal one line redrawn four times a second; otherwise (a file, a
// pipe, CI) whole lines only, one every 5 s and one at the end.
func progress(w io.Writer, tty bool, name string, total int, done *atomic.Int64) (stop func()) {
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	start := time.Now()
	go func() {
		defer wg.Done()
		every := 5 * time.Second
		if tty {
			every = 250 * time.Millisecond
		}
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				if tty {
					fmt.Fprintf(w, "\rsimulate: %-14s %5d/%d", name, done.Load(), total)
				} else {
					fmt.Fprintf(w, "simulate: %-14s %5d/%d\n", name, done.Load(), total)
				}
			case <-quit:
				cr := ""
				if tty {
					cr = "\r"
				}
				fmt.Fprintf(w, "%ssimulate: %-14s %5d/%d done in %.1f s\n", cr, name, done.Load(), total, time.Since(start).Seconds())
				return
			}
		}
	}()
	return func() { close(quit); wg.Wait() }
}
