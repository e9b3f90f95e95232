package main

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relaytest"
)

// TestDirectReplayServesFleetModels: a replay against the simulated fleet
// keeps a request for a model the fleet serves (gemini-2.5-flash,
// deepseek-v3.2); the direct and floor modes send each to its us-east
// upstream. (Their router had the flagship's upstream only, and such
// requests failed at once with relay.ErrNoUpstream.)
func TestDirectReplayServesFleetModels(t *testing.T) {
	file := filepath.Join(t.TempDir(), "models.jsonl")
	lines := []string{
		`{"model":"gemini-2.5-flash","messages":[{"role":"user","content":"hello there"}],"max_tokens":8}`,
		`{"model":"deepseek-v3.2","messages":[{"role":"user","content":"hello there"}],"max_tokens":8}`,
		`{"model":"gpt-5.5-codex","messages":[{"role":"user","content":"hello there"}],"max_tokens":8}`,
	}
	require.NoError(t, os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o644))
	rows := runJSON(t, "-replay", file, "-modes", "floor,direct,striped", "-scenario", "none", "-concurrency", "2")
	assert.Equal(t, 100.0, rows["striped"].SuccessPct, "the relay modes serve every model the fleet has")
	for _, m := range []string{"floor", "direct"} {
		assert.Equal(t, 100.0, rows[m].SuccessPct, "%s: a request for a model the fleet serves does not fail for want of an upstream", m)
		assert.Zero(t, rows[m].Failed, m)
	}
}

// TestIgnoredFlagsRefused: flags that cannot apply to a run are refused,
// not accepted and ignored: -window shapes only the simulated fleet (as
// -scenario and -cache-blocks do), and -speed applies only to -replay.
func TestIgnoredFlagsRefused(t *testing.T) {
	srv := relaytest.NewServer()
	defer srv.Close()
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"-replay", "testdata/bad.jsonl", "-base-url", srv.URL, "-speed", "100", "-window", "100-200", "-modes", "direct"}, "-window"},
		{[]string{"-speed", "4", "-requests", "2", "-concurrency", "1", "-modes", "direct", "-scenario", "none"}, "-speed"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(tc.args, &out, &errb)
			assert.Equal(t, 2, code, "%s is accepted and has no effect on the run", tc.flag)
			assert.Contains(t, errb.String(), tc.flag)
		})
	}
}

// TestRouterTimingSameOnBothClocks: routerTiming gives both clocks the
// same router, MaxCooldown included: 5 minutes of simulated time on both
// (it was relay's default, 5 minutes, on each clock: 250 simulated
// minutes on the real one).
func TestRouterTimingSameOnBothClocks(t *testing.T) {
	const relayDefaultMaxCooldown = 5 * time.Minute // config.go: Breaker.MaxCooldown's default
	orDefault := func(d time.Duration) time.Duration {
		if d == 0 {
			return relayDefaultMaxCooldown
		}
		return d
	}
	_, real, _ := routerTiming(false)
	_, sim, _ := routerTiming(true)
	// In wall-clock time: the real clock's as it stands, the simulated
	// clock's scaled.
	assert.Equal(t, scaled(sim.Cooldown), real.Cooldown, "Cooldown agrees")
	assert.Equal(t, scaled(orDefault(sim.MaxCooldown)), orDefault(real.MaxCooldown), "MaxCooldown, wall-clock time")
}

// TestPriorityLostCountsFailedAnswers: the priority table's "lost" is
// "requests that failed (shed by the queue, or any other error)": an
// answer that came back with a failure status (the router's last attempt
// got a 5xx or 429) is lost, as the main table counts it failed. (Only a
// RoundTrip error was counted.)
func TestPriorityLostCountsFailedAnswers(t *testing.T) {
	srv := relaytest.NewServer()
	defer srv.Close()
	srv.SetDefault(relaytest.Fault{Status: http.StatusServiceUnavailable})
	r, err := relay.New(relay.Config{
		Upstreams: []relay.Upstream{{Name: "u", BaseURL: srv.URL}},
		Retry:     relay.RetryConfig{MaxAttempts: 1},
	})
	require.NoError(t, err)
	defer r.CloseIdleConnections()
	var l classLog
	var ord order
	q := &request{body: `{"model":"gpt-4o","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`}
	_ = classSender(r, "interactive", true, &l, &ord).do(context.Background(), q)
	assert.Equal(t, 1, l.stats().Failed, "a request answered 503 is lost")
}
