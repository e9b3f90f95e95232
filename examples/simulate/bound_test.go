package main

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/examples/simulate/simfleet"
)

// TestUnloadedBound holds the unloaded bound (bound.go) to the fleet it is
// computed from, so that it cannot drift from the fleet's model: batch
// requests served one at a time through a cluster-aware Router on an idle
// fleet are answered on the model path the bound assumed, with the prompt
// tokens it counted and at most the cached tokens it assumed, never sooner
// than their bound; a long prompt whose shared context was sent to its path
// first (the best case of the cache) has exactly the cached tokens the
// bound assumed; and each answer takes at least its path's AnswerTime for
// the cached tokens it had (with RELAY_SIM_TARGETS=1, see simTargets, also
// no more than that plus the router's and loopback's overheads: a figure
// of the host's speed).
func TestUnloadedBound(t *testing.T) {
	fleet := simfleet.New(simfleet.Config{TimeScale: 0.05, CacheBlocks: simCacheBlocks})
	defer fleet.Close()
	cfg := fleet.Config()
	policy := clusterPolicy(false)(&env{fast: fast, cheap: cheap})
	w := newWorkload(1, 300)
	us, err := unloadedTimes(w, cfg, policy)
	require.NoError(t, err)
	require.Len(t, us, len(w.reqs))

	p99, err := unloadedP99(w, cfg, policy)
	require.NoError(t, err)
	times := make([]time.Duration, len(us))
	for i, u := range us {
		times[i] = u.time
	}
	slices.Sort(times)
	assert.Equal(t, times[len(times)*99/100-1], p99, "the p99 of the requests' bounds")

	urls := map[string]string{}
	var ups []relay.Upstream
	for _, u := range fleet.Upstreams() {
		urls[u.Name] = u.URL
		ups = append(ups, relay.Upstream{Name: u.Name, BaseURL: u.URL, Models: []string{u.Model}})
	}
	var mu sync.Mutex
	var reports []relay.Report
	r, err := relay.New(relay.Config{Upstreams: ups, Policy: policy, Jitter: -1, Prices: simPrices(),
		Retry:    relay.RetryConfig{MaxAttempts: 1},
		OnReport: func(rep relay.Report) { mu.Lock(); reports = append(reports, rep); mu.Unlock() }})
	require.NoError(t, err)
	defer r.CloseIdleConnections()

	// The long prompt with the longest bound, and the request whose prompt
	// shares the most of its prefix: the bound's best case is what that one
	// request leaves in the cache.
	long := -1
	for i, q := range w.reqs {
		if q.kind == "long" && (long < 0 || us[i].time > us[long].time) {
			long = i
		}
	}
	require.GreaterOrEqual(t, long, 0)
	require.Equal(t, flagship, us[long].model, "long prompts stay on the flagship")
	require.Positive(t, us[long].cached, "a long prompt starts with a shared context")
	warm, most := -1, 0
	for j, q := range w.reqs {
		if j == long {
			continue
		}
		c := simfleet.NewPrefixCache(1<<12, cfg.BlockBytes)
		c.Serve(endpointOf(q), []byte(q.body))
		if _, n := c.Serve(endpointOf(w.reqs[long]), []byte(w.reqs[long].body)); n > most {
			warm, most = j, n
		}
	}
	require.Equal(t, us[long].cached, most, "the best case is the longest prefix shared with another request")
	d, err := decideBody(r, &w.reqs[long], w.reqs[long].body)
	require.NoError(t, err)
	resp, err := http.Post(urls[d.Upstreams[0]]+"/chat/completions", "application/json", strings.NewReader(w.reqs[warm].body))
	require.NoError(t, err)
	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	http.DefaultClient.CloseIdleConnections()

	// The long prompt, then a streamed and an unstreamed request of each
	// other kind the policy moves (mid → cheap, band → fast).
	picks := []int{long}
	for _, kind := range []string{"mid", "band"} {
		for _, stream := range []bool{false, true} {
			if i := slices.IndexFunc(w.reqs, func(q request) bool { return q.kind == kind && q.stream == stream }); i >= 0 {
				picks = append(picks, i)
			}
		}
	}
	require.Len(t, picks, 5)
	for _, i := range picks {
		q, u := w.reqs[i], us[i]
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		require.NoError(t, send(ctx, r, &q))
		cancel()
		mu.Lock()
		rep := reports[len(reports)-1]
		mu.Unlock()
		require.NoError(t, rep.Err)
		assert.Equal(t, u.model, rep.Model, "request %d (%s) on the bound's path", i, q.kind)
		assert.Equal(t, u.prompt, rep.Usage.PromptTokens, "request %d: the bound's prompt tokens", i)
		assert.LessOrEqual(t, rep.Usage.CachedTokens, u.cached, "request %d: no more cached than the best case", i)
		if i == long {
			assert.Equal(t, u.cached, rep.Usage.CachedTokens, "the long prompt found the best case")
		}
		// A timer never fires early; the fleet rounds each scaled part of
		// a service time to the nanosecond.
		assert.GreaterOrEqual(t, rep.Latency+time.Microsecond, u.time, "request %d is not answered before its bound", i)
		m, ok := fleet.Model(u.model)
		require.True(t, ok)
		exact := time.Duration(float64(m.AnswerTime(u.prompt, rep.Usage.CachedTokens, q.output, q.stream)) * cfg.TimeScale)
		assert.GreaterOrEqual(t, rep.Latency+time.Microsecond, exact, "request %d", i)
		if simTargets { // how far over it the answer came is the host's overhead
			assert.LessOrEqual(t, rep.Latency, exact+exact/4+20*time.Millisecond, "request %d: its AnswerTime plus overheads", i)
		}
		t.Logf("request %d (%s, stream %v) on %s: bound %v, AnswerTime %v, answered in %v (cached %d of %d, best case %d)",
			i, q.kind, q.stream, rep.Model, u.time, exact, rep.Latency, rep.Usage.CachedTokens, u.prompt, u.cached)
	}
}
