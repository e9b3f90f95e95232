package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tokenrelay/relay"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestFlagsRejected(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-concurrency", "0"}, "-concurrency must be positive"},
		{[]string{"-requests", "-3"}, "-requests must be positive"},
		{[]string{"-window", "-5-220"}, "-window must be MIN-MAX"},
		{[]string{"-window", "220-150"}, "is empty"},
		{[]string{"-window", "abc"}, "-window must be MIN-MAX"},
		{[]string{"-modes", "direct,teleport"}, `unknown mode "teleport"`},
		{[]string{"-seed", "-1"}, "-seed must not be negative"},
		{[]string{"-floor-sample", "0"}, "-floor-sample must be positive"},
		{[]string{"-nope"}, "flag provided but not defined"},
		{[]string{"extra"}, "unexpected arguments"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			assert.Equal(t, 2, run(tc.args, &out, &errb))
			assert.Contains(t, errb.String(), tc.want)
			assert.Contains(t, errb.String(), "usage: simulate")
			assert.Empty(t, out.String())
		})
	}
	var out, errb bytes.Buffer
	assert.Equal(t, 0, run([]string{"-h"}, &out, &errb))
	assert.Contains(t, errb.String(), "-concurrency")
}

func TestWorkload(t *testing.T) {
	a, b := newWorkload(7, 300), newWorkload(7, 300)
	assert.Equal(t, a.reqs, b.reqs, "seeded")
	assert.NotEqual(t, a.reqs[0].body, newWorkload(8, 300).reqs[0].body)

	// The router counts what the workload aimed for.
	r, err := relay.New(relay.Config{Upstreams: []relay.Upstream{{Name: "x", BaseURL: "http://x.invalid/v1"}}})
	require.NoError(t, err)
	kinds := map[string]int{}
	for _, q := range a.reqs {
		kinds[q.kind]++
		req, err := http.NewRequest(http.MethodPost, "http://x.invalid/v1/chat/completions", strings.NewReader(q.body))
		require.NoError(t, err)
		d, err := r.Decide(req)
		require.NoError(t, err)
		assert.InDelta(t, q.prompt, d.Request.PromptTokens, 4, q.body)
		assert.Equal(t, q.output, d.Request.MaxTokens)
		assert.Equal(t, q.stream, d.Request.Stream)
	}
	assert.Greater(t, kinds["band"], 150, "most prompts in the 80-260 band")
	assert.Greater(t, kinds["mid"], 20)
	assert.Len(t, a.sample(30), 30)
	assert.Len(t, a.sample(1000), 300)
}

// TestShortRun runs every mode on a shortened workload, checks the output,
// and logs the target ratios. It asserts success in the relay modes
// (by construction: 3 attempts, at most two regions failing at once, queues
// deeper than the concurrency) but not the latency ratios, which depend on
// the machine's load on such a short run.
func TestShortRun(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"-requests", "240", "-concurrency", "16", "-floor-sample", "40", "-json"}, &out, &errb)
	require.Equal(t, 0, code, errb.String())
	assert.Contains(t, errb.String(), "simulate: cluster-aware")

	var rows []map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &rows), out.String())
	require.Len(t, rows, len(modes))
	byMode := map[string]map[string]any{}
	for i, row := range rows {
		assert.Equal(t, modes[i].name, row["mode"])
		for _, k := range []string{"p50_ms", "p99_ms", "throughput_rps", "success_pct", "cost_usd", "cache_hit_pct", "hedges_pct", "model_paths_pct"} {
			assert.Contains(t, row, k)
		}
		assert.Greater(t, row["p99_ms"].(float64), 0.0)
		assert.GreaterOrEqual(t, row["p99_ms"].(float64), row["p50_ms"].(float64))
		assert.Greater(t, row["cost_usd"].(float64), 0.0)
		assert.Equal(t, 0.0, row["usage_missing"].(float64), "every successful answer reported usage")
		byMode[row["mode"].(string)] = row
	}
	f := func(mode, k string) float64 { return byMode[mode][k].(float64) }
	assert.Equal(t, 40.0, f("floor", "requests"))
	assert.Equal(t, 100.0, byMode["direct"]["model_paths_pct"].(map[string]any)[flagship])
	assert.Less(t, f("cluster-aware", "cost_per_1m_output_tokens_usd"), f("direct", "cost_per_1m_output_tokens_usd"), "cheaper paths")
	for _, m := range modes {
		if m.name == "floor" || m.name == "direct" {
			continue
		}
		assert.GreaterOrEqual(t, f(m.name, "success_pct"), 99.9, m.name)
		assert.Greater(t, f(m.name, "refused"), 0.0, "%s met the dark region", m.name)
	}
	assert.Greater(t, f("hedged", "hedges_pct"), 0.0, "hedges were sent")
	t.Logf("cluster-aware p99 / direct p99 = %.2f (target ≤ 0.5)", f("cluster-aware", "p99_ms")/f("direct", "p99_ms"))
	t.Logf("cluster-aware p99 / floor p99 = %.2f (target ≤ 1.3)", f("cluster-aware", "p99_ms")/f("floor", "p99_ms"))
	t.Logf("cluster-aware throughput / direct = %.2f (target ≥ 2)", f("cluster-aware", "throughput_rps")/f("direct", "throughput_rps"))
	t.Logf("striped throughput / direct = %.2f", f("striped", "throughput_rps")/f("direct", "throughput_rps"))
	t.Logf("affinity cache hits / striped = %.2f (target ≥ 2)", f("affinity", "cache_hit_pct")/f("striped", "cache_hit_pct"))
	for _, m := range modes {
		t.Logf("%-14s p50 %6.1f ms  p99 %6.1f ms  %6.0f req/s  success %.2f%%  cache-hit %.1f%%  hedges %.1f%%",
			m.name, f(m.name, "p50_ms"), f(m.name, "p99_ms"), f(m.name, "throughput_rps"), f(m.name, "success_pct"), f(m.name, "cache_hit_pct"), f(m.name, "hedges_pct"))
	}
}

// TestAffinityCacheHits runs striped and affinity on half the default
// workload: affinity keeps each shared context on its home region, striping
// scatters it over four caches, so affinity's cache-hit rate is well above
// striping's. The full run's target is 2× (3.2× measured); the bound here,
// 1.3×, leaves room for the shorter run's noise.
func TestAffinityCacheHits(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"-requests", "600", "-concurrency", "16", "-modes", "striped,affinity", "-json"}, &out, &errb)
	require.Equal(t, 0, code, errb.String())
	var rows []result
	require.NoError(t, json.Unmarshal(out.Bytes(), &rows))
	require.Len(t, rows, 2)
	st, af := rows[0], rows[1]
	t.Logf("cache hits: striped %.1f%%, affinity %.1f%% (× %.2f)", st.CacheHitPct, af.CacheHitPct, af.CacheHitPct/st.CacheHitPct)
	assert.Greater(t, af.CacheHitPct, 1.3*st.CacheHitPct)
}

func TestTableOutput(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"-requests", "60", "-concurrency", "8", "-modes", "direct, cluster-aware,direct", "-window", "140-230"}, &out, &errb)
	require.Equal(t, 0, code, errb.String())
	s := out.String()
	for _, want := range []string{
		"SIMULATED FLEET", "prompts of 140–230 tokens pinned", "gpt-5.5-codex     service = 300ms",
		"p50 ms", "p99 ms", "req/s", "success %", "$/1k req", "$/1M out", "cache-hit %", "hedges %",
		"cluster-aware p99 / direct p99", "Monthly projection, 50M output tokens",
		"all on gpt-5.5-codex: list $600.00, with price factor 0.147 $88.20",
		"list $399.60, with price factor 0.147 $58.74",
	} {
		assert.Contains(t, s, want)
	}
	assert.Equal(t, 1, strings.Count(s, "\n         direct "), "a mode listed twice runs once:\n%s", s)
	assert.NotContains(t, s, "floor p99")
}

// TestTargets runs a shortened simulation and asserts the targets
// that hold with a margin on a short run: cluster-aware p99 at most half of
// direct's, throughput at least twice direct's, success at least 99.9%. The
// floor ratio and the affinity cache ratio need the full run on an idle
// machine (see the README); they are logged. Under the race detector the
// simulation is starved of CPU and its timings mean nothing, so the test
// is skipped there (CI runs -race; `go test ./...` runs it).
func TestTargets(t *testing.T) {
	if raceDetector || testing.Short() {
		t.Skip("timing targets need an uninstrumented, full-speed build")
	}
	var out, errb bytes.Buffer
	code := run([]string{"-requests", "600", "-modes", "floor,direct,striped,affinity,cluster-aware", "-json"}, &out, &errb)
	require.Equal(t, 0, code, errb.String())
	var rows []map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &rows))
	m := map[string]map[string]any{}
	for _, r := range rows {
		m[r["mode"].(string)] = r
	}
	f := func(mode, k string) float64 { return m[mode][k].(float64) }
	p99 := f("cluster-aware", "p99_ms") / f("direct", "p99_ms")
	tput := f("cluster-aware", "throughput_rps") / f("direct", "throughput_rps")
	assert.LessOrEqual(t, p99, 0.5, "cluster-aware p99 / direct p99")
	assert.GreaterOrEqual(t, tput, 2.0, "cluster-aware throughput / direct")
	for _, mode := range []string{"striped", "affinity", "cluster-aware"} {
		assert.GreaterOrEqual(t, f(mode, "success_pct"), 99.9, mode)
	}
	t.Logf("cluster-aware p99 / direct p99 = %.2f, throughput × %.1f, p99 / floor p99 = %.2f, affinity cache hits / striped = %.2f",
		p99, tput, f("cluster-aware", "p99_ms")/f("floor", "p99_ms"), f("affinity", "cache_hit_pct")/max(f("striped", "cache_hit_pct"), 0.01))
}
