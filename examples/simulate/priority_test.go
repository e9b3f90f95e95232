package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// checkPriority holds the priority mode's two runs of n requests to what
// priorities are for: nothing is lost; without them, the interactive
// requests wait in the queue as long as the batch ones; with them, a
// fraction of that, while the batch ones still wait. (TestShortRun runs
// the mode.)
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
	for _, run := range p.Runs {
		assert.Zero(t, run.Interactive.Failed, "nothing lost")
		assert.Zero(t, run.Batch.Failed, "nothing lost")
	}
	assert.Greater(t, fifo.Batch.WaitP50ms, 0.0, "the flood queues for the limit")
	assert.Greater(t, fifo.Interactive.WaitP50ms, 0.5*fifo.Batch.WaitP50ms, "first come, first served: interactive requests wait behind the flood")
	assert.Less(t, prio.Interactive.WaitP99ms, 0.3*fifo.Interactive.WaitP50ms, "with priorities, interactive requests go first")
	assert.Greater(t, prio.Batch.WaitP50ms, 0.5*fifo.Batch.WaitP50ms, "the flood still waits its turn")
	t.Logf("interactive wait p50/p99: FIFO %.1f/%.1f ms, prioritized %.1f/%.1f ms; batch p50 %.1f/%.1f ms",
		fifo.Interactive.WaitP50ms, fifo.Interactive.WaitP99ms, prio.Interactive.WaitP50ms, prio.Interactive.WaitP99ms,
		fifo.Batch.WaitP50ms, prio.Batch.WaitP50ms)
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
		Runs: []priorityRun{{Interactive: classStats{WaitP50ms: 200}}, {Prioritized: true, Interactive: classStats{WaitP50ms: 3.5}}}}
	printPriority(&out, []result{{Mode: "direct"}, {Mode: "priority", Priority: p}})
	s := out.String()
	assert.Contains(t, s, "Priority: every request to one upstream (us-east/gemini-2.5-flash), held to RPM 80 per simulated minute")
	assert.Contains(t, s, "(every 20th, interactive), one every 9.2 s of simulated time (185 ms)")
	assert.Contains(t, s, "none (FIFO)       interactive  12        200.0")
	assert.Contains(t, s, "X-Relay-Priority  interactive  12        3.5")
	assert.Contains(t, s, "                  batch        228 ")
	out.Reset()
	printPriority(&out, []result{{Mode: "direct"}})
	assert.Empty(t, out.String())
}
