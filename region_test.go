package relay

import (
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
)

func upstreamsN(n int) []Upstream {
	ups := make([]Upstream, n)
	for i := range ups {
		ups[i] = Upstream{Name: fmt.Sprintf("region-%d", i), BaseURL: "http://127.0.0.1:1/v1"}
	}
	return ups
}

func routerWith(t testing.TB, cfg Config) *Router {
	t.Helper()
	r, err := New(cfg)
	require.NoError(t, err)
	return r
}

// home returns the upstream a key's hash ranking puts first.
func home(r *Router, key uint64) string {
	best, bestScore := "", uint64(0)
	for _, u := range r.ups {
		if s := rendezvous(key, u.seed); best == "" || s > bestScore {
			best, bestScore = u.cfg.Name, s
		}
	}
	return best
}

func TestAffinityKeepsKeysHomeWithJitter(t *testing.T) {
	r := routerWith(t, Config{Upstreams: upstreamsN(4)})
	const keys = 100000
	atHome := 0
	var buf [8]candidate
	for k := range uint64(keys) {
		key := fmix64(k + 1)
		cands := r.plan(buf[:0], "m", nil, key, true, nil)
		require.Len(t, cands, 4)
		if cands[0].up.cfg.Name == home(r, key) {
			atHome++
		}
	}
	frac := float64(atHome) / keys
	assert.GreaterOrEqual(t, frac, 0.85, "at home %.4f", frac)
	assert.Less(t, frac, 0.90, "jitter of 12.5%% moves some: %.4f", frac)
}

func TestAffinitySpreadsKeysEvenly(t *testing.T) {
	r := routerWith(t, Config{Upstreams: upstreamsN(4), Jitter: -1})
	count := map[string]int{}
	var buf [8]candidate
	for k := range uint64(100000) {
		count[r.plan(buf[:0], "m", nil, fmix64(k+1), true, nil)[0].up.cfg.Name]++
	}
	for name, n := range count {
		assert.InDelta(t, 25000, n, 1500, name)
	}
}

func TestAffinityAddingAnUpstreamMovesOnlyItsShare(t *testing.T) {
	four := routerWith(t, Config{Upstreams: upstreamsN(4), Jitter: -1})
	five := routerWith(t, Config{Upstreams: upstreamsN(5), Jitter: -1})
	moved := 0
	const keys = 100000
	var b4, b5 [8]candidate
	for k := range uint64(keys) {
		key := fmix64(k + 1)
		a := four.plan(b4[:0], "m", nil, key, true, nil)[0].up.cfg.Name
		b := five.plan(b5[:0], "m", nil, key, true, nil)[0].up.cfg.Name
		if a != b {
			moved++
			assert.Equal(t, "region-4", b, "a key only ever moves to the new upstream")
		}
	}
	frac := float64(moved) / keys
	assert.LessOrEqual(t, frac, 0.25+0.01, "moved %.4f", frac)
	assert.Greater(t, frac, 0.15, "the new upstream takes its share: %.4f", frac)
}

func TestBoundedLoadNeverExceedsCap(t *testing.T) {
	const n, k = 4, 40
	gate := make(chan struct{})
	var mu sync.Mutex
	cur := map[string]int{}
	peak := map[string]int{}
	srv := newHandlerServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := r.Header.Get("X-Up")
		mu.Lock()
		cur[name]++
		peak[name] = max(peak[name], cur[name])
		mu.Unlock()
		<-gate
		mu.Lock()
		cur[name]--
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{}`))
	}))
	ups := upstreamsN(n)
	for i := range ups {
		ups[i].BaseURL = srv
		ups[i].Header = http.Header{"X-Up": {ups[i].Name}}
	}
	r, reps := newTestRouter(t, Config{Upstreams: ups, Strategy: StrategyBoundedLoad})
	var wg sync.WaitGroup
	var started atomic.Int32
	for range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			started.Add(1)
			// The same prompt: every request has the same home.
			_, _, err := send(t, r, chatBody("gpt-4.1", "the same prompt for all"))
			assert.NoError(t, err)
		}()
	}
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		total := 0
		for _, c := range cur {
			total += c
		}
		return total == k
	}, 10*time.Second, time.Millisecond)
	close(gate)
	wg.Wait()
	limit := int(math.Ceil(1.25 * k / n))
	for name, p := range peak {
		assert.LessOrEqual(t, p, limit, name)
	}
	assert.Len(t, peak, n, "overflow walked to every upstream")
	assert.Len(t, reps.all(), k)
}

func TestLeastLatencyAvoidsSlowUpstream(t *testing.T) {
	clock := newFakeClock()
	lat := map[string]time.Duration{"region-0": 10 * time.Millisecond, "region-1": 10 * time.Millisecond,
		"region-2": 10 * time.Millisecond, "region-3": 100 * time.Millisecond}
	base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		name := req.Header.Get("X-Up")
		clock.Advance(lat[name]) // the call takes this long on the router's clock
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
			Body: http.NoBody, Request: req}, nil
	})
	ups := upstreamsN(4)
	for i := range ups {
		ups[i].Header = http.Header{"X-Up": {ups[i].Name}}
	}
	r, _ := newTestRouter(t, Config{Upstreams: ups, Strategy: StrategyLeastLatency, Base: base, Clock: clock})
	count := map[string]int{}
	const total = 2000
	for range total {
		resp, _, err := send(t, r, chatBody("gpt-4.1", "x"))
		require.NoError(t, err)
		count[resp.Header.Get(HeaderUpstream)]++
	}
	assert.Less(t, float64(count["region-3"])/total, 0.10, "%v", count)
	assert.Positive(t, count["region-3"], "the slow one is still probed now and then: %v", count)
}

func TestWeighted(t *testing.T) {
	ups := upstreamsN(2)
	ups[0].Weight, ups[1].Weight = 1, 3
	r := routerWith(t, Config{Upstreams: ups, Strategy: StrategyWeighted})
	count := map[string]int{}
	var buf [8]candidate
	for range 40000 {
		count[r.plan(buf[:0], "m", nil, 0, true, nil)[0].up.cfg.Name]++
	}
	assert.InDelta(t, 10000, count["region-0"], 800)
	assert.InDelta(t, 30000, count["region-1"], 800)
}

// BenchmarkPlan measures candidate ordering alone for 8 upstreams, per
// strategy.
func BenchmarkPlan(b *testing.B) {
	for _, s := range []Strategy{StrategyAffinity, StrategyBoundedLoad, StrategyLeastLatency, StrategyWeighted} {
		b.Run(s.String(), func(b *testing.B) {
			r := routerWith(b, Config{Upstreams: upstreamsN(8), Strategy: s})
			var buf [8]candidate
			b.ReportAllocs()
			key := uint64(1)
			for b.Loop() {
				key = fmix64(key)
				if len(r.plan(buf[:0], "m", nil, key, true, nil)) != 8 {
					b.Fatal("short plan")
				}
			}
		})
	}
}

func TestAffinityRoutesSharedPrefixTogetherAndInjectsCacheKey(t *testing.T) {
	srvs := newServers(t, 4)
	ups := make([]Upstream, len(srvs))
	for i, s := range srvs {
		ups[i] = Upstream{Name: fmt.Sprintf("r%d", i), BaseURL: s.URL}
	}
	r, _ := newTestRouter(t, Config{Upstreams: ups, Jitter: -1, PromptCacheKey: true})
	system := strings.Repeat("You are a careful code reviewer for the payments service. ", 12)
	chatWith := func(sys, q string) string {
		return `{"model":"gpt-4.1","messages":[{"role":"system","content":"` + sys + `"},{"role":"user","content":"` + q + `"}]}`
	}
	homes := map[string]int{}
	for i := range 20 {
		resp, _, err := send(t, r, chatWith(system, fmt.Sprintf("question %d?", i)))
		require.NoError(t, err)
		homes[resp.Header.Get(HeaderUpstream)]++
	}
	assert.Len(t, homes, 1, "a shared prefix has one home: %v", homes)
	var keys []string
	for _, s := range srvs {
		for _, q := range s.Requests() {
			keys = append(keys, gjson.GetBytes(q.Body, "prompt_cache_key").Str)
		}
	}
	require.Len(t, keys, 20)
	assert.Regexp(t, `^relay-[0-9a-f]{16}$`, keys[0])
	for _, k := range keys {
		assert.Equal(t, keys[0], k)
	}
	// The caller's own key is kept.
	_, _, err := send(t, r, `{"model":"gpt-4.1","prompt_cache_key":"mine","messages":[{"role":"user","content":"x"}]}`)
	require.NoError(t, err)
	found := 0
	for _, s := range srvs {
		for _, q := range s.Requests() {
			if gjson.GetBytes(q.Body, "messages.0.content").Str == "x" {
				found++
				assert.Equal(t, "mine", gjson.GetBytes(q.Body, "prompt_cache_key").Str)
			}
		}
	}
	assert.Equal(t, 1, found)
}

// TestBoundedLoadRetryLeavesFailingUpstream: under bounded loads a retry
// ignores the cap. The home holds two requests (its cap) and the other
// upstream fails fast, so its in-flight count stays at zero: a retry held
// to the cap could only go back there, and the request would fail on every
// attempt while the home was merely busy.
func TestBoundedLoadRetryLeavesFailingUpstream(t *testing.T) {
	const body = `{"model":"gpt-4.1","messages":[{"role":"user","content":"one prompt for all"}]}`
	probe := routerWith(t, Config{Upstreams: upstreamsN(2), Strategy: StrategyBoundedLoad})
	req, _ := http.NewRequest(http.MethodPost, "http://relay/v1/chat/completions", strings.NewReader(body))
	d, err := probe.Decide(req)
	require.NoError(t, err)
	home := d.Upstreams[0]

	gate := make(chan struct{})
	var atHome atomic.Int32
	srv := newHandlerServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Up") != home {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		atHome.Add(1)
		<-gate
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{}`))
	}))
	ups := upstreamsN(2)
	for i := range ups {
		ups[i].BaseURL = srv
		ups[i].Header = http.Header{"X-Up": {ups[i].Name}}
	}
	r, reps := newTestRouter(t, Config{Upstreams: ups, Strategy: StrategyBoundedLoad,
		Retry:   RetryConfig{Backoff: func(int) time.Duration { return 0 }},
		Breaker: BreakerConfig{Failures: 100}})
	var wg sync.WaitGroup
	codes := make(chan int, 3)
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, _, err := send(t, r, body)
			if assert.NoError(t, err) {
				codes <- resp.StatusCode
			}
		}()
		// The first two fill the home's cap (⌈1.25·2/2⌉ = 2), then the third
		// overflows to the failing upstream and must come back home.
		require.Eventually(t, func() bool { return atHome.Load() == int32(min(i+1, 2)) || i == 2 }, 5*time.Second, time.Millisecond)
	}
	require.Eventually(t, func() bool { return atHome.Load() == 3 || len(codes) > 0 }, 5*time.Second, time.Millisecond)
	close(gate)
	wg.Wait()
	close(codes)
	for c := range codes {
		assert.Equal(t, http.StatusOK, c)
	}
	var retried int
	for _, rep := range reps.all() {
		if rep.Attempts > 1 {
			retried++
			assert.Equal(t, home, rep.Upstream, "the retry went home")
			assert.Equal(t, 2, rep.Attempts)
		}
	}
	assert.Equal(t, 1, retried)
}
