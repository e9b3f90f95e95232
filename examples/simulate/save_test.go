package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSave runs two modes with -save: the tables stay the output, and the
// file holds one JSON array, a row per line, each row what -json prints
// plus the mode's latency CDF, which ends at its success rate.
func TestSave(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run.json")
	var out, errb bytes.Buffer
	code := run([]string{"-requests", "40", "-concurrency", "8", "-modes", "direct,cluster-aware", "-save", path}, &out, &errb)
	require.Equal(t, 0, code, errb.String())
	assert.Contains(t, out.String(), "SIMULATED FLEET", "the tables stay the output")
	assert.Contains(t, errb.String(), "simulate: wrote "+path+" (charts: go run ./examples/simchart -out DIR "+path+")")

	b, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	require.Len(t, lines, 4, "[, a row per mode, ]")
	assert.Equal(t, "[", lines[0])
	assert.Equal(t, "]", lines[3])
	var rows []map[string]any
	require.NoError(t, json.Unmarshal(b, &rows))
	require.Len(t, rows, 2)
	for i, name := range []string{"direct", "cluster-aware"} {
		row := rows[i]
		assert.Equal(t, name, row["mode"])
		for _, k := range []string{"workload", "scenario", "throughput_rps", "success_pct", "cache_hit_pct", "cost_per_1k_requests_usd", "p99_ms"} {
			assert.Contains(t, row, k)
		}
		assert.NotContains(t, row, "real_endpoint", "the simulated fleet")
		pts := row["latency_cdf"].([]any)
		require.NotEmpty(t, pts)
		prev := []float64{0, 0}
		for _, p := range pts {
			xy := p.([]any)
			x, y := xy[0].(float64), xy[1].(float64)
			assert.GreaterOrEqual(t, x, prev[0])
			assert.Greater(t, y, prev[1])
			prev = []float64{x, y}
		}
		assert.InDelta(t, row["success_pct"].(float64)/100, prev[1], 1e-9, "the CDF ends at the success rate")
	}

	// A file that cannot be written fails the run.
	errb.Reset()
	assert.Equal(t, 1, run([]string{"-requests", "10", "-modes", "direct", "-save", t.TempDir()}, io.Discard, &errb))
	assert.Contains(t, errb.String(), "simulate: -save: ")
}

func TestCDF(t *testing.T) {
	ms := func(n ...int) []time.Duration {
		var out []time.Duration
		for _, v := range n {
			out = append(out, time.Duration(v)*time.Millisecond)
		}
		return out
	}
	assert.Equal(t, [][2]float64{{1, 0.4}, {2, 0.6}, {4, 0.8}}, cdf(ms(0, 1, 2, 4), 5),
		"out of every request, failures included; no 0 on a log axis")
	long := make([]time.Duration, 1000)
	for i := range long {
		long[i] = time.Duration(i+1) * time.Millisecond
	}
	pts := cdf(long, 1000)
	require.Len(t, pts, cdfPoints)
	assert.Equal(t, [2]float64{5, 0.005}, pts[0])
	assert.Equal(t, [2]float64{1000, 1}, pts[len(pts)-1])
	assert.Empty(t, cdf(nil, 10))
}
