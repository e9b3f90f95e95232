package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// checkPriority holds the priority mode's two runs of n requests to what
// priorities are for. Always: the runs' sizes. With RELAY_SIM_TARGETS=1
// (see simTargets), by what depends on how fast the host runs the flood:
// nothing lost (every request answered within its timeouts); by the order
// in which the requests reached the upstream and by the waits, which
// depend on how many requests the flood queues: without priorities, an
// interactive request goes after the batch requests that started before
// it, and waits as long as they do; with them, it goes ahead of those that
// wait, and waits a fraction of that, while the batch ones still wait.
// (TestShortRun runs the mode.)
func checkPriority(t *testing.T, p *priorityResult, n int) {
	t.Helper()
	require.NotNil(t, p)
	require.Len(t, p.Runs, 2)
	assert.Equal(t, n/interactiveEvery, p.Interactive)
	assert.Equal(t, n-n/interactiveEvery, p.Batch)
	assert.Equal(t, priorityRPM(n), p.RPM)
	fifo, prio := p.Runs[0], p.Runs[1]
	assert.False(t, fifo.Prioritized)
	assert.True(t, prio.Prioritized)
	t.Logf("interactive requests ahead of %d (FIFO) and %d batch requests; waits p50/p99: FIFO %.1f/%.1f ms, prioritized %.1f/%.1f ms; batch p50 %.1f/%.1f ms",
		fifo.AheadOf, prio.AheadOf, fifo.Interactive.WaitP50ms, fifo.Interactive.WaitP99ms, prio.Interactive.WaitP50ms, prio.Interactive.WaitP99ms,
		fifo.Batch.WaitP50ms, prio.Batch.WaitP50ms)
	if !simTargets {
		return
	}
	for _, run := range p.Runs {
		assert.Zero(t, run.Interactive.Failed, "nothing lost")
		assert.Zero(t, run.Batch.Failed, "nothing lost")
	}
	assert.LessOrEqual(t, fifo.AheadOf, 1, "first come, first served")
	assert.Greater(t, fifo.Batch.WaitP99ms, 0.0, "the flood queues for the limit")
	assert.GreaterOrEqual(t, prio.AheadOf, p.Workers/4, "interactive requests go ahead of the waiting flood")
	assert.Less(t, prio.Interactive.WaitP50ms, 0.3*fifo.Interactive.WaitP99ms, "with priorities, interactive requests wait a fraction of what they did")
}

// TestOrderAheadOf counts, for the median interactive request, the batch
// requests started before it that reached the upstream after it.
func TestOrderAheadOf(t *testing.T) {
	var o order
	b := func(started int64) *place { return &place{started: started} }
	i := func(started int64) *place { return &place{interactive: true, started: started} }
	o.arrived = []*place{b(1), i(5), b(2), b(3), b(6), i(7), b(4), i(9), b(8)}
	// i5 went ahead of b2, b3, b4; i7 ahead of b4; i9 ahead of b8.
	assert.Equal(t, 1, o.aheadOf())
	o.arrived = []*place{i(5), i(7), b(1), b(2)}
	assert.Equal(t, 2, o.aheadOf())
	o.arrived = []*place{b(1)}
	assert.Zero(t, o.aheadOf(), "no interactive request")
}

func TestSplitPriority(t *testing.T) {
	w := newWorkload(3, 100)
	flood, trickle := splitPriority(w.reqs)
	assert.Len(t, flood, 95)
	require.Len(t, trickle, 5)
	assert.Equal(t, w.reqs[19], trickle[0][0], "every 20th request is interactive")
	assert.Equal(t, w.reqs[99], trickle[4][0])
	assert.Equal(t, w.reqs[20], flood[19][0])
	trickle[0] = append(trickle[0], request{})
	assert.Equal(t, w.reqs[20], flood[19][0], "sessions do not share room")
	assert.Equal(t, 400, priorityRPM(priorityRequests))
	assert.Equal(t, 160, priorityRPM(80))
	assert.Equal(t, 3, priorityRPM(1))
}

func TestClassStats(t *testing.T) {
	var l classLog
	for i := 1; i <= 100; i++ {
		l.waits = append(l.waits, time.Duration(i)*time.Second) // simulated
		l.latencies = append(l.latencies, time.Duration(i)*time.Millisecond)
	}
	l.failed = 2
	assert.Equal(t, classStats{WaitP50ms: 1000, WaitP99ms: 1980, P50ms: 50, P99ms: 99, Failed: 2}, l.stats(), "waits in wall-clock ms")

	var out bytes.Buffer
	p := &priorityResult{Upstream: "us-east/" + fast, RPM: 80, Interactive: 12, Batch: 228, Workers: 16, GapMs: 185,
		Runs: []priorityRun{{Interactive: classStats{WaitP50ms: 200}}, {Prioritized: true, Interactive: classStats{WaitP50ms: 3.5}, AheadOf: 14}}}
	printPriority(&out, []result{{Mode: "direct"}, {Mode: "priority", Priority: p}})
	containsAll(t, out.String(),
		"Priority: every request to one upstream (us-east/gemini-2.5-flash), held to RPM 80 per simulated minute",
		"(every 20th, interactive), one every 9.2 s of simulated time (185 ms)",
		"none (FIFO)       interactive  12        200.0",
		"X-Relay-Priority  interactive  12        3.5          0.0          0.0     0.0     0     14\n",
		"                  batch        228       0.0          0.0          0.0     0.0     0     -\n",
		"  ahead of  batch requests that started before an interactive request but reached the upstream after it")
	out.Reset()
	printPriority(&out, []result{{Mode: "direct"}})
	assert.Empty(t, out.String())
}

// containsAll asserts that s holds each of wants.
func containsAll(t *testing.T, s string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		assert.Contains(t, s, w)
	}
}
