package main

import (
	"fmt"
	"io"
	"slices"

	"github.com/tokenrelay/relay/examples/simulate/simfleet"
)

// verdictMode is the mode the verdict speaks for: the router with the
// ready-made policy, as a caller would deploy it.
const verdictMode = "cluster-aware"

// printVerdict prints the run's verdict, the first lines of its output and
// at most six of them: the verdict mode against the same upstreams without
// the router (baseline), the fair comparison, and against the one upstream
// of the direct mode; each ratio is the relay's figure over the other's.
// It prints nothing when the verdict mode or both comparisons did not run.
func printVerdict(out io.Writer, o options, cfg simfleet.Config, results []result) {
	get := func(name string) (result, bool) { return modeRow(results, name) }
	relayed, ok := get(verdictMode)
	if !ok {
		return
	}
	var lines [][2]string
	same := "the endpoint without relay (baseline)"
	if o.baseURL == "" {
		same = fmt.Sprintf("the same %d upstreams without relay (baseline)", len(cfg.Regions)*len(cfg.Models))
	}
	for _, c := range []struct{ mode, label string }{
		{"baseline", same},
		{"direct", "one upstream (direct)"},
	} {
		other, ok := get(c.mode)
		if !ok {
			continue
		}
		lines = append(lines, [2]string{"vs " + c.label + ":", fmt.Sprintf("success %.2f%% vs %.2f%%, cost %s×, p99 %s×, throughput %s×",
			relayed.SuccessPct, other.SuccessPct, ratio(relayed.CostPer1kReq, other.CostPer1kReq),
			ratio(relayed.P99ms, other.P99ms), ratio(relayed.ThroughputRPS, other.ThroughputRPS))})
	}
	if len(lines) == 0 {
		return
	}
	where := fmt.Sprintf("the simulated fleet, %s workload, %s scenario", o.workload, o.scenario.name)
	switch {
	case o.baseURL != "":
		where = "a real endpoint, replay of " + o.replay
	case o.replay != "":
		where = "the simulated fleet, replay of " + o.replay
	}
	fmt.Fprintf(out, "VERDICT: relay (%s routing) on %s, %d requests a mode\n", verdictMode, where, relayed.Requests)
	width := 0
	for _, l := range lines {
		width = max(width, len([]rune(l[0])))
	}
	for _, l := range lines {
		fmt.Fprintf(out, "  %-*s %s\n", width+len(l[0])-len([]rune(l[0])), l[0], l[1])
	}
	fmt.Fprintf(out, "  × is relay's figure over the other's: under 1 is better for cost ($ per 1,000 requests) and p99, over 1 for throughput.\n")
	fmt.Fprintf(out, "  p99 and throughput are wall-clock figures of this machine and move with its load; success and cost follow from the seeded workload.\n\n")
}

// modeRow returns the row of the mode named name, if it ran.
func modeRow(results []result, name string) (result, bool) {
	i := slices.IndexFunc(results, func(r result) bool { return r.Mode == name && r.Replicas == nil })
	if i < 0 {
		return result{}, false
	}
	return results[i], true
}

// ratio prints a/b with two decimals, "-" when b is not positive.
func ratio(a, b float64) string {
	if !(b > 0) {
		return "-"
	}
	return fmt.Sprintf("%.2f", a/b)
}
