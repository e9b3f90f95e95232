package main

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/examples/simulate/simfleet"
)

// result is one mode's row; the JSON field names are part of the output.
// Floats are rounded: milliseconds and percentages to 2 decimals (or 1),
// request rates to 1, attempts per request to 3, US dollars to 4
// significant digits.
type result struct {
	Mode            string             `json:"mode"`
	About           string             `json:"about"`
	Workload        string             `json:"workload"` // batch, chat, agent or replay
	Scenario        string             `json:"scenario"`
	RealEndpoint    bool               `json:"real_endpoint,omitempty"` // -base-url: not the simulated fleet
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
	InputPer1kReq   float64            `json:"input_cost_per_1k_requests_usd"`
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
	QueueFull       int                `json:"queue_full"`
	Slowed          int                `json:"slowed"`
	Hung            int                `json:"hung"`
	// HistoryHitPct is the share of history tokens (prompt tokens past
	// the system prompt) that were cached: chat only.
	HistoryHitPct float64 `json:"history_hit_pct,omitempty"`
	// PredictErrPct is the median |predicted − reported| cached tokens as
	// a percentage of the prompt tokens: expected-cost only.
	PredictErrPct float64 `json:"predict_err_pct,omitempty"`
	// UnloadedP99ms is the p99 the mode's policy would have if every
	// request were served alone with the best case of the prefix cache
	// (bound.go): cluster-aware on the batch workload only.
	UnloadedP99ms float64         `json:"unloaded_p99_ms,omitempty"`
	Budget        *budgetResult   `json:"budget,omitempty"`   // the budget mode's
	Priority      *priorityResult `json:"priority,omitempty"` // the priority mode's
	Replicas      *replicasResult `json:"replicas,omitempty"` // a row of the replicas comparison
	// CalmP99ms is the p99 of the same mode run again without the stalls
	// (calm.go): the hedged mode in the stalls scenario only.
	CalmP99ms float64 `json:"calm_p99_ms,omitempty"`

	okLatencies []time.Duration // the successful requests', sorted (for -save)
}

func summarize(m mode, o options, reports []relay.Report, wall time.Duration, conc int, prices map[string]relay.Price, st simfleet.Stats) result {
	res := result{Mode: m.name, About: m.about, Requests: len(reports), Concurrency: conc,
		ModelPaths: map[string]float64{}, WallMs: ms(wall)}
	if m.name == "bounded" {
		lf := o.loadFactor
		if lf == 0 {
			lf = 1.25
		}
		res.About += fmt.Sprintf(", LoadFactor %g", lf)
	}
	if prices == nil {
		prices = relay.DefaultPrices()
	}
	var lat, okLat []time.Duration
	var ok, hedged, attempts int
	var input float64
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
		okLat = append(okLat, r.Latency)
		res.ModelPaths[r.Model]++
		res.CostUSD += r.CostUSD
		if r.Usage == (relay.Usage{}) {
			res.UsageMissing++ // no usage in the answer the router saw
			continue
		}
		res.PromptTokens += r.Usage.PromptTokens
		res.OutputTokens += r.Usage.CompletionTokens
		res.CachedTokens += r.Usage.CachedTokens
		input += prices[r.Model].Cost(relay.Usage{PromptTokens: r.Usage.PromptTokens, CachedTokens: r.Usage.CachedTokens})
	}
	n := float64(len(reports))
	for k, v := range res.ModelPaths {
		res.ModelPaths[k] = round(100*v/float64(max(ok, 1)), 1)
	}
	slices.Sort(lat)
	slices.Sort(okLat)
	res.okLatencies = okLat
	res.P50ms, res.P99ms, res.MaxMs = ms(quantile(lat, 0.50)), ms(quantile(lat, 0.99)), ms(lat[len(lat)-1])
	res.ThroughputRPS = round(n/wall.Seconds(), 1)
	res.SuccessPct = round(100*float64(ok)/n, 2)
	res.CostPer1kReq = sig(1000*res.CostUSD/n, 4)
	res.InputPer1kReq = sig(1000*input/n, 4)
	if res.OutputTokens > 0 {
		res.CostPer1MOutput = sig(1e6*res.CostUSD/float64(res.OutputTokens), 4)
	}
	res.CostUSD = sig(res.CostUSD, 4)
	if res.PromptTokens > 0 {
		res.CacheHitPct = round(100*float64(res.CachedTokens)/float64(res.PromptTokens), 1)
	}
	res.HedgesPct = round(100*float64(hedged)/n, 2)
	res.HistoryHitPct = historyHitPct(reports)
	res.AttemptsPerReq = round(float64(attempts)/n, 3)
	fleetCounts(&res, st)
	return res
}

// fleetCounts adds the fleet's counters to a row: its faults, and how its
// shards' queues and calls were spread.
func fleetCounts(res *result, st simfleet.Stats) {
	served, hot := 0, 0
	for _, p := range st.Paths {
		res.Refused += p.Refused
		res.Throttled += p.Throttled
		res.QueueFull += p.Rejected
		res.Slowed += p.Slowed
		res.Hung += p.Hung
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
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func ms(d time.Duration) float64 { return round(float64(d)/float64(time.Millisecond), 2) }

// round rounds x to places decimals.
func round(x float64, places int) float64 {
	p := math.Pow(10, float64(places))
	return math.Round(x*p) / p
}

// sig rounds x to digits significant digits.
func sig(x float64, digits int) float64 {
	if x == 0 || math.IsNaN(x) || math.IsInf(x, 0) {
		return x
	}
	v, _ := strconv.ParseFloat(strconv.FormatFloat(x, 'g', digits, 64), 64)
	return v
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

func printReport(out io.Writer, o options, cfg simfleet.Config, w *workload, results []result) {
	printVerdict(out, o, cfg, results)
	if o.baseURL != "" {
		fmt.Fprintf(out, "REAL ENDPOINT %s — every request was sent to it and billed by it.\n", o.baseURL)
		fmt.Fprintf(out, "Workload: %s\n\n", w.describe())
	} else {
		printFleet(out, o, cfg, w)
	}
	printTables(out, o, results)
}

func printFleet(out io.Writer, o options, cfg simfleet.Config, w *workload) {
	fmt.Fprintf(out, "SIMULATED FLEET — no real provider is called. examples/simulate/simfleet on loopback:\n")
	fmt.Fprintf(out, "  %d regions (%s) × %d model paths, %d FIFO shards each (queue %d, full → 429 + retry-after-ms)\n",
		len(cfg.Regions), strings.Join(cfg.Regions, ", "), len(cfg.Models), cfg.Models[0].Shards, cfg.Models[0].QueueLimit)
	for _, m := range cfg.Models {
		fmt.Fprintf(out, "  %-17s service = %v + %v/prompt token (%v cached) + %v/output token\n",
			m.Name, m.Base, m.PrefillPerToken, m.CachedPerToken, m.DecodePerToken)
	}
	fmt.Fprintf(out, "  wall clock = simulated time × %g; clustering: prompts of %d–%d tokens pinned to shard 0 of their path;\n",
		timeScale, o.windowMin, o.windowMax)
	fmt.Fprintf(out, "  prefix cache per path: LRU of %d blocks of %d bytes of the router's canonical prompt (%d KB)\n",
		cfg.CacheBlocks, cfg.BlockBytes, cfg.CacheBlocks*cfg.BlockBytes>>10)
	fmt.Fprintf(out, "  prices: relay.DefaultPrices, except %s input $%.2f and cached input $%.3f per 1M tokens (unpublished: the simulation's own)\n",
		flagship, flagshipInput.InputPerMTok, flagshipInput.CachedInputPerMTok)
	fmt.Fprintf(out, "Scenario %s: %s.\n", o.scenario.name, o.scenario.about)
	fmt.Fprintf(out, "Workload %s.\n", w.describe())
	fmt.Fprintf(out, "Latencies are wall-clock ms (×%g for simulated).\n\n", 1/timeScale)
}

func printTables(out io.Writer, o options, all []result) {
	results := slices.DeleteFunc(slices.Clone(all), func(r result) bool { return r.Replicas != nil })
	defer printReplicas(out, all)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tmodel paths\tp50 ms\tp99 ms\treq/s\tsuccess %\t$/1k req\tinput $/1k\t$/1M out\tcache-hit %\thedges %\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%.1f\t%.0f\t%.2f\t%.4f\t%.4f\t%.2f\t%.1f\t%.1f\t\n",
			r.Mode, paths(r.ModelPaths), r.P50ms, r.P99ms, r.ThroughputRPS, r.SuccessPct,
			r.CostPer1kReq, r.InputPer1kReq, r.CostPer1MOutput, r.CacheHitPct, r.HedgesPct)
	}
	tw.Flush()
	fmt.Fprintln(out)
	if o.baseURL != "" {
		for _, r := range results {
			about := aboutReal[r.Mode]
			if about == "" {
				about = r.About
			}
			fmt.Fprintf(out, "  %-14s %s\n", r.Mode, about)
		}
		return
	}
	for _, r := range results {
		fmt.Fprintf(out, "  %-14s %s\n", r.Mode, r.About)
	}
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "mode\tattempts/req\trefused\t429 burst\t429 full\tstalled\tmax queue\thottest shard\tusage missing")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%.3f\t%d\t%d\t%d\t%d+%d\t%d (%s)\t%.1f%% of calls\t%d\n",
			r.Mode, r.AttemptsPerReq, r.Refused, r.Throttled, r.QueueFull, r.Slowed, r.Hung, r.MaxQueue, r.MaxQueueShard, r.HotShardPct, r.UsageMissing)
	}
	tw.Flush()
	fmt.Fprint(out, legend)
	printSpend(out, results)
	printPriority(out, results)
	if o.replay == "" {
		printTargets(out, o, results)
	}
	projection(out)
}

// legend explains the second table's columns.
const legend = `  attempts/req   upstream calls per request: 1 + retries + hedges
  refused        calls a dark region refused (connection closed, outage scenario)
  429 burst      calls answered by a region's scripted burst of 429s (outage scenario)
  429 full       calls answered 429 because their shard's queue was full
  stalled        calls that met a slow shard + calls whose connection hung (stalls scenario)
  max queue      the longest any shard's queue grew, and that shard (region/model#shard)
  hottest shard  the share of all served calls that the busiest shard served
                 (12 shards serve one model, 48 the three: ~8% or ~2% each when even)
  usage missing  successful answers whose report had no usage (they would cost nothing)
`

// target is one line of the targets: a measured value held to a bound.
type target struct {
	what   string
	value  float64
	bound  float64
	atMost bool   // the value must be at most bound (else at least)
	unit   string // printed after the numbers: "×", "%"
	prec   int    // decimals printed
}

func (t target) pass() bool {
	if t.atMost {
		return t.value <= t.bound
	}
	return t.value >= t.bound
}

func (t target) String() string {
	verdict, op := "MISS", "≥"
	if t.pass() {
		verdict = "PASS"
	}
	if t.atMost {
		op = "≤"
	}
	return fmt.Sprintf("%s  %s = %.*f%s (target %s %.*f%s)", verdict, t.what, t.prec, t.value, t.unit, op, t.prec, t.bound, t.unit)
}

func num(x float64) string {
	if math.Abs(x) >= 10 {
		return strconv.FormatFloat(x, 'f', 1, 64)
	}
	return strconv.FormatFloat(x, 'f', 2, 64)
}

// relayModes are the modes that go through the router with retries.
var relayModes = []string{"striped", "affinity", "bounded", "cluster-aware", "cluster-busy", "hedged", "expected-cost"}

// targets returns the targets that apply to a run of a generated workload
// and whose modes ran, and notes: measured ratios that have no target.
//
//   - every workload and scenario: success ≥ 99.9% in every relay mode;
//   - batch (outage, none): cluster-aware p99 ≤ 0.5× baseline's and ≤ 0.5×
//     direct's, throughput ≥ 2× direct's;
//   - chat (outage, none): affinity's cache hits ≥ 75% and ≥ 2.5× striped's,
//     its input cost per request ≥ 40% under striped's, its p99 at most
//     striped's;
//   - stalls (every workload): hedged p99 ≤ 0.4× cluster-aware's, for at
//     most 6% more upstream calls.
func targets(o options, results []result) (ts []target, notes []string) {
	get := func(name string) (result, bool) { return modeRow(results, name) }
	lowest, lowestMode := 101.0, ""
	for _, name := range relayModes {
		if r, ok := get(name); ok && r.SuccessPct < lowest {
			lowest, lowestMode = r.SuccessPct, name
		}
	}
	if lowestMode != "" {
		ts = append(ts, target{what: "lowest success of the relay modes (" + lowestMode + ")", value: lowest, bound: 99.9, unit: "%", prec: 2})
	}
	fl, okF := get("floor")
	di, okD := get("direct")
	bl, okB := get("baseline")
	st, okS := get("striped")
	af, okA := get("affinity")
	ca, okC := get("cluster-aware")
	he, okH := get("hedged")
	bd, okBd := get("bounded")
	faults := o.scenario.name != "stalls"
	switch {
	case o.workload == "batch" && faults:
		if okC && ca.UnloadedP99ms > 0 {
			ts = append(ts, target{what: "cluster-aware p99 / its unloaded bound", value: ca.P99ms / ca.UnloadedP99ms, bound: 1.2, atMost: true, unit: "×", prec: 2})
		}
		if okC && okD {
			ts = append(ts,
				target{what: "cluster-aware p99 / direct p99", value: ca.P99ms / di.P99ms, bound: 0.5, atMost: true, unit: "×", prec: 2},
				target{what: "cluster-aware throughput / direct", value: ca.ThroughputRPS / di.ThroughputRPS, bound: 2, unit: "×", prec: 2})
		}
	case o.workload == "chat" && faults:
		if okA {
			ts = append(ts, target{what: "affinity cache hits", value: af.CacheHitPct, bound: 75, unit: "%", prec: 1})
		}
		if okA && okS {
			ts = append(ts,
				target{what: "affinity history-token cache hits / striped", value: af.HistoryHitPct / math.Max(st.HistoryHitPct, 0.01), bound: 2.5, unit: "×", prec: 2},
				target{what: "affinity input $/1k req / striped", value: af.InputPer1kReq / st.InputPer1kReq, bound: 0.6, atMost: true, unit: "×", prec: 2},
				target{what: "affinity p99 / striped p99", value: af.P99ms / st.P99ms, bound: 1, atMost: true, unit: "×", prec: 2})
		}
		ts = append(ts, ecostTargets(results)...)
	case o.workload == "agent" && faults:
		ts = append(ts, ecostTargets(results)...)
	}
	if !faults && okH && okC {
		if o.workload == "chat" && he.CalmP99ms > 0 {
			ts = append(ts, target{what: "hedged p99 under stalls / without", value: he.P99ms / he.CalmP99ms, bound: 1.1, atMost: true, unit: "×", prec: 2})
		} else if o.workload != "chat" {
			ts = append(ts, target{what: "hedged p99 / cluster-aware p99", value: he.P99ms / ca.P99ms, bound: 0.4, atMost: true, unit: "×", prec: 2})
		}
		ts = append(ts, target{what: "hedged upstream calls / cluster-aware", value: he.AttemptsPerReq / ca.AttemptsPerReq, bound: 1.06, atMost: true, unit: "×", prec: 2})
	}

	note := func(format string, a ...any) { notes = append(notes, fmt.Sprintf(format, a...)) }
	if o.workload == "batch" {
		if okC && okB {
			note("cluster-aware vs baseline: throughput %s×, success %.2f%% vs %.2f%%, $/1k req %s×",
				num(ca.ThroughputRPS/bl.ThroughputRPS), ca.SuccessPct, bl.SuccessPct, num(ca.CostPer1kReq/bl.CostPer1kReq))
		}
		if okF && okC {
			note("cluster-aware p99 / floor p99 = %s×", num(ca.P99ms/fl.P99ms))
		}
		if okC && ca.UnloadedP99ms > 0 {
			line := fmt.Sprintf("cluster-aware p99, unloaded lower bound = %.1f ms (every request served alone on the path ClusterPolicy picks, best-case prefix cache); measured p99 / bound = %s×",
				ca.UnloadedP99ms, num(ca.P99ms/ca.UnloadedP99ms))
			if okB {
				line += fmt.Sprintf(", bound / baseline p99 = %s×", num(ca.UnloadedP99ms/bl.P99ms))
			}
			notes = append(notes, line)
		}
	}
	if !faults && okH && he.CalmP99ms > 0 {
		note("hedged p99 under stalls %.1f ms, without them (the same workload again) %.1f ms", he.P99ms, he.CalmP99ms)
	}
	// The cache figures of the two home-keeping strategies against striping.
	for _, h := range []struct {
		r  result
		ok bool
	}{{af, okA}, {bd, okBd}} {
		if h.ok && okS && (o.workload != "chat" || h.r.Mode != "affinity" || !faults) {
			note("%s vs striped: cache hits %.1f%% vs %.1f%% (%s×), input $/1k req %s×, p99 %s×", h.r.Mode,
				h.r.CacheHitPct, st.CacheHitPct, num(h.r.CacheHitPct/math.Max(st.CacheHitPct, 0.01)),
				num(h.r.InputPer1kReq/st.InputPer1kReq), num(h.r.P99ms/st.P99ms))
		}
	}
	return ts, notes
}

func printTargets(out io.Writer, o options, results []result) {
	ts, notes := targets(o, results)
	if len(ts) > 0 {
		miss := 0
		for _, t := range ts {
			if !t.pass() {
				miss++
			}
		}
		fmt.Fprintf(out, "\nTargets (%s workload, %s scenario): %d of %d met\n", o.workload, o.scenario.name, len(ts)-miss, len(ts))
		for _, t := range ts {
			fmt.Fprintf(out, "  %s\n", t)
		}
	}
	if len(notes) > 0 {
		fmt.Fprintf(out, "Measured, no target:\n")
		for _, n := range notes {
			fmt.Fprintf(out, "  %s\n", n)
		}
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
