package main

import (
	"time"

	"github.com/tokenrelay/relay/examples/simulate/simfleet"
)

// scenario is the trouble a run meets, the same for every workload
// (-scenario).
type scenario struct {
	name  string
	about string // for the header, after "faults: "
	// faults are applied by share of a mode's requests sent, in the relay
	// modes only (see fault).
	faults []fault
	// stalls, when set, are on for the whole of every mode's run: the
	// fleet is sick everywhere, so direct, baseline and floor meet them too.
	stalls simfleet.Stalls
}

// fault is a change to the fleet once a share of the mode's requests was
// sent. Faults hit ap-southeast and eu-west only, so the direct and floor
// modes (us-east only) never meet them; the baseline, the relay modes do.
type fault struct {
	at    float64
	apply func(f *simfleet.Fleet)
}

var scenarios = []scenario{
	{name: "outage",
		about: "ap-southeast dark (connections closed) from 25% to 55% of each run's requests; 20 × 429 (retry-after-ms 200 ms) from eu-west at 70%",
		faults: []fault{
			{0.25, func(f *simfleet.Fleet) { f.SetDark("ap-southeast", true) }},
			{0.55, func(f *simfleet.Fleet) { f.SetDark("ap-southeast", false) }},
			{0.70, func(f *simfleet.Fleet) { f.Burst429("eu-west", 20, 200*time.Millisecond) }},
		}},
	{name: "none", about: "no fault"},
	{name: "stalls",
		about:  "in every mode, 1.5% of calls meet a shard 10–50× slower (it stays busy), 0.5% a connection that hangs until the caller gives up",
		stalls: simfleet.Stalls{Slow: 0.015, Hang: 0.005, SlowMin: 10, SlowMax: 50}},
}

func scenarioNames() []string {
	out := make([]string, len(scenarios))
	for i, s := range scenarios {
		out[i] = s.name
	}
	return out
}
