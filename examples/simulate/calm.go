package main

import (
	"fmt"
	"io"
	"slices"

	"github.com/tokenrelay/relay/examples/simulate/simfleet"
)

// calmMode is the mode whose tail the stalls scenario compares with its
// own run without stalls.
const calmMode = "hedged"

// addCalm runs the hedged mode once more without the scenario's stalls,
// on the same workload, when a stalls run on the simulated fleet ran it,
// and keeps that run's p99 in the hedged row (CalmP99ms): what the stalls
// cost the hedged mode's tail is then one ratio of the same run.
func addCalm(o options, w *workload, results []result, stderr io.Writer) error {
	if o.scenario.stalls == (simfleet.Stalls{}) || o.baseURL != "" {
		return nil
	}
	i := slices.IndexFunc(results, func(r result) bool { return r.Mode == calmMode })
	if i < 0 {
		return nil
	}
	calm := o
	calm.scenario = scenario{name: "none"}
	m := modes[slices.IndexFunc(modes, func(m mode) bool { return m.name == calmMode })]
	fmt.Fprintf(stderr, "simulate: %s again without stalls, for its p99 under stalls / without\n", calmMode)
	res, _, err := runMode(calm, m, w, stderr)
	if err != nil {
		return err
	}
	results[i].CalmP99ms = res.P99ms
	return nil
}
