package simfleet

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
	"go.uber.org/goleak"

	"github.com/tokenrelay/relay/internal/bpe"
	"github.com/tokenrelay/relay/internal/prompt"
	"github.com/tokenrelay/relay/relaytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// post sends body to the server's endpoint and returns the response with
// its body read.
func post(t *testing.T, s *relaytest.Server, endpoint, body string) (*http.Response, []byte) {
	t.Helper()
	resp, err := s.Client().Post(s.URL+endpoint, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, b
}

// sseData returns the data of each event of a stream's body, in order.
func sseData(body []byte) []string {
	var out []string
	for line := range strings.Lines(string(body)) {
		if d, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "data: "); ok {
			out = append(out, d)
		}
	}
	return out
}

// newSim starts a Fleet closed at the end of the test. Its time scale is
// tiny so service takes no noticeable time; the tests assert on counters and
// usage, never on timing.
func newSim(t *testing.T, cfg Config) *Fleet {
	t.Helper()
	if cfg.TimeScale == 0 {
		cfg.TimeScale = 1e-9
	}
	f := New(cfg)
	t.Cleanup(f.Close)
	return f
}

// simChat builds a chat body for model whose user message has words copies
// of " word" after the system prompt sys.
func simChat(model, sys string, words, maxTokens int, stream bool) string {
	msgs := []map[string]string{}
	if sys != "" {
		msgs = append(msgs, map[string]string{"role": "system", "content": sys})
	}
	msgs = append(msgs, map[string]string{"role": "user", "content": strings.TrimSpace(strings.Repeat(" word", words))})
	body := map[string]any{"model": model, "messages": msgs}
	if maxTokens > 0 {
		body["max_tokens"] = maxTokens
	}
	if stream {
		body["stream"] = true
		body["stream_options"] = map[string]any{"include_usage": true}
	}
	b, _ := json.Marshal(body)
	return string(b)
}

func simPromptTokens(body string) int { return relaytest.PromptTokens(prompt.Chat, []byte(body)) }

func shardServed(s Stats, name string) []int {
	for _, p := range s.Paths {
		if p.Name == name {
			out := make([]int, len(p.Shards))
			for i, sh := range p.Shards {
				out[i] = sh.Served
			}
			return out
		}
	}
	return nil
}

func pathStats(t *testing.T, s Stats, name string) PathStats {
	t.Helper()
	for _, p := range s.Paths {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("no path %s", name)
	return PathStats{}
}

func TestFleetLayout(t *testing.T) {
	f := newSim(t, Config{})
	ups := f.Upstreams()
	require.Len(t, ups, 12)
	assert.Equal(t, Upstream{Name: "us-east/gpt-5.5-codex", Region: "us-east", Model: "gpt-5.5-codex", URL: ups[0].URL}, ups[0])
	assert.Equal(t, "eu-west/gemini-2.5-flash", ups[4].Name)
	u, ok := f.Upstream("sa-east", "deepseek-v3.2")
	require.True(t, ok)
	assert.Equal(t, ups[11], u)
	_, ok = f.Upstream("mars", "gpt-5.5-codex")
	assert.False(t, ok)
	cfg := f.Config()
	assert.Equal(t, 150, cfg.ClusterMin)
	assert.Equal(t, 220, cfg.ClusterMax)
	assert.Equal(t, 4, cfg.Models[0].Shards)
	assert.Equal(t, 64, cfg.Models[0].QueueLimit)

	// The answer names its path; a flash call is served by the flash path.
	resp, body := post(t, f.Server("eu-west", "gemini-2.5-flash"), "/chat/completions", simChat("gemini-2.5-flash", "", 10, 3, false))
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	assert.Equal(t, "eu-west/gemini-2.5-flash", resp.Header.Get(relaytest.NameHeader))
	assert.Equal(t, int64(3), gjson.GetBytes(body, "usage.completion_tokens").Int())
	assert.Equal(t, "stop", gjson.GetBytes(body, "choices.0.finish_reason").Str)
	st := f.Stats()
	assert.Equal(t, 1, pathStats(t, st, "eu-west/gemini-2.5-flash").Served)
	assert.Equal(t, 0, pathStats(t, st, "eu-west/gpt-5.5-codex").Served)

	assert.Panics(t, func() { f.SetDark("mars", true) })
	assert.Panics(t, func() { New(Config{Regions: []string{"a", "a"}, TimeScale: 1e-9}) })
}

func TestServiceTime(t *testing.T) {
	m := Model{Base: 100 * time.Millisecond, PrefillPerToken: time.Millisecond,
		CachedPerToken: 100 * time.Microsecond, DecodePerToken: 10 * time.Millisecond}
	assert.Equal(t, 100*time.Millisecond+200*time.Millisecond+5*10*time.Millisecond, m.ServiceTime(200, 0, 5))
	assert.Equal(t, 100*time.Millisecond+100*time.Millisecond+100*100*time.Microsecond+5*10*time.Millisecond, m.ServiceTime(200, 100, 5))
	assert.Equal(t, m.ServiceTime(200, 200, 0), m.ServiceTime(200, 500, 0), "cached clamped to the prompt")
	for _, dm := range DefaultModels() {
		assert.Less(t, dm.CachedPerToken, dm.PrefillPerToken/5, dm.Name)
	}
}

// TestSimAnswerTime: a non-streaming answer takes ServiceTime; a stream
// ends with its last content event, one decode step sooner; and a served
// call is never answered sooner than its AnswerTime.
func TestAnswerTime(t *testing.T) {
	m := Model{Base: 100 * time.Millisecond, PrefillPerToken: time.Millisecond,
		CachedPerToken: 100 * time.Microsecond, DecodePerToken: 10 * time.Millisecond}
	assert.Equal(t, m.ServiceTime(200, 50, 5), m.AnswerTime(200, 50, 5, false))
	assert.Equal(t, m.ServiceTime(200, 50, 5)-m.DecodePerToken, m.AnswerTime(200, 50, 5, true))
	assert.Equal(t, m.ServiceTime(200, 50, 0), m.AnswerTime(200, 50, 0, true), "no content event: the first token's time")

	const scale = 0.01
	f := newSim(t, Config{Regions: []string{"us-east"}, TimeScale: scale})
	srv := f.Server("us-east", "gemini-2.5-flash")
	fm, _ := f.Model("gemini-2.5-flash")
	for _, stream := range []bool{false, true} {
		body := simChat("gemini-2.5-flash", "", 40, 60, stream)
		want := time.Duration(float64(fm.AnswerTime(simPromptTokens(body), 0, 60, stream)) * scale)
		start := time.Now()
		resp, b := post(t, srv, "/chat/completions", body)
		took := time.Since(start)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
		assert.GreaterOrEqual(t, took+time.Microsecond, want, "stream %v", stream)
	}
}

// TestPrefixCacheServesAsTheFleet: a PrefixCache fed the calls a fleet's
// Server is sent reports the prompt and cached tokens the Server's answers
// report, evictions included.
func TestPrefixCacheServesAsTheFleet(t *testing.T) {
	f := newSim(t, Config{Regions: []string{"us-east"}, CacheBlocks: 12})
	srv := f.Server("us-east", "gpt-5.5-codex")
	c := NewPrefixCache(12, 0)
	sys := strings.Repeat("You answer questions about the billing system. ", 8)
	bodies := []string{
		simChat("gpt-5.5-codex", sys, 20, 1, false),
		simChat("gpt-5.5-codex", sys, 30, 1, false),
		simChat("gpt-5.5-codex", "", 60, 1, false),
		simChat("gpt-5.5-codex", sys, 20, 1, false),
		simChat("gpt-5.5-codex", strings.Repeat("Another long system prompt. ", 12), 5, 1, false),
		simChat("gpt-5.5-codex", sys, 20, 1, false),
	}
	hits := 0
	for i, body := range bodies {
		resp, b := post(t, srv, "/chat/completions", body)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
		p, cached := c.Serve(prompt.Chat, []byte(body))
		assert.Equal(t, gjson.GetBytes(b, "usage.prompt_tokens").Int(), int64(p), "call %d", i)
		assert.Equal(t, gjson.GetBytes(b, "usage.prompt_tokens_details.cached_tokens").Int(), int64(cached), "call %d", i)
		if cached > 0 {
			hits++
		}
		assert.LessOrEqual(t, c.Len(), 12)
	}
	assert.Equal(t, 12, c.Len(), "full")
	assert.Equal(t, pathStats(t, f.Stats(), "us-east/gpt-5.5-codex").CacheHits, hits)
	assert.Positive(t, hits)
}

func TestClusteringPins(t *testing.T) {
	f := newSim(t, Config{Regions: []string{"us-east"}})
	srv := f.Server("us-east", "gpt-5.5-codex")
	window := simChat("gpt-5.5-codex", "", 175, 2, false)
	require.InDelta(t, 185, simPromptTokens(window), 35, "inside 150-220")
	outside := simChat("gpt-5.5-codex", "", 40, 2, false)
	require.Less(t, simPromptTokens(outside), 150)

	for range 8 {
		resp, body := post(t, srv, "/chat/completions", window)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	}
	assert.Equal(t, []int{8, 0, 0, 0}, shardServed(f.Stats(), "us-east/gpt-5.5-codex"), "window prompts pinned to shard 0")

	for range 8 {
		post(t, srv, "/chat/completions", outside)
	}
	served := shardServed(f.Stats(), "us-east/gpt-5.5-codex")
	for i, n := range served[1:] {
		assert.GreaterOrEqual(t, n, 1, "shard %d takes prompts outside the window", i+1)
	}

	f.SetClustering(false)
	before := served
	for range 8 {
		post(t, srv, "/chat/completions", window)
	}
	served = shardServed(f.Stats(), "us-east/gpt-5.5-codex")
	for i := range served {
		assert.Greater(t, served[i], before[i], "with clustering off, shard %d takes window prompts too", i)
	}
}

func TestPrefixCache(t *testing.T) {
	f := newSim(t, Config{Regions: []string{"us-east", "eu-west"}})
	sys := strings.Repeat("You index source files and answer with one line of JSON. ", 12) // ~700 bytes
	first := simChat("gpt-5.5-codex", sys, 30, 2, false)
	other := strings.ReplaceAll(first, "word", "item") // same system prompt, another user text

	cachedOf := func(srv *relaytest.Server, body string) int {
		t.Helper()
		resp, b := post(t, srv, "/chat/completions", body)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
		return int(gjson.GetBytes(b, "usage.prompt_tokens_details.cached_tokens").Int())
	}
	us := f.Server("us-east", "gpt-5.5-codex")
	assert.Equal(t, 0, cachedOf(us, first), "cold cache")
	again := cachedOf(us, first)
	prompt := simPromptTokens(first)
	assert.Greater(t, again, prompt/2, "the same prompt again: most of it cached")
	assert.LessOrEqual(t, again, prompt)
	shared := cachedOf(us, other)
	assert.Greater(t, shared, 50, "the shared system prompt is cached")
	assert.Less(t, shared, again, "the new user text is not")
	assert.Equal(t, 0, cachedOf(f.Server("eu-west", "gpt-5.5-codex"), first), "another region has its own cache")
	assert.Equal(t, 0, cachedOf(f.Server("us-east", "gemini-2.5-flash"), simChat("gemini-2.5-flash", sys, 30, 2, false)), "another model has its own cache")

	st := pathStats(t, f.Stats(), "us-east/gpt-5.5-codex")
	assert.Equal(t, 2, st.CacheHits)
	assert.Equal(t, again+shared, st.CachedTokens)
	assert.Equal(t, 3, st.Served)

	// A stream reports its cached tokens in the usage chunk.
	resp, b := post(t, us, "/chat/completions", simChat("gpt-5.5-codex", sys, 30, 4, true))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	evs := sseData(b)
	require.GreaterOrEqual(t, len(evs), 3)
	assert.Equal(t, "[DONE]", evs[len(evs)-1])
	u := gjson.Get(evs[len(evs)-2], "usage")
	assert.Equal(t, int64(4), u.Get("completion_tokens").Int())
	assert.Greater(t, u.Get("prompt_tokens_details.cached_tokens").Int(), int64(0))
	var content strings.Builder
	for _, ev := range evs {
		content.WriteString(gjson.Get(ev, "choices.0.delta.content").Str)
	}
	assert.Equal(t, "Hello from relaytest.", content.String(), "4 pieces")
}

func TestPrefixCacheLRU(t *testing.T) {
	c := newPrefixCache(4)
	a := strings.Repeat("a", 16) + strings.Repeat("b", 16) + "tail"
	assert.Equal(t, 0, c.touch(a, 16))
	assert.Equal(t, 2, c.len(), "only full blocks")
	assert.Equal(t, 32, c.touch(a, 16))
	// Same second block after another first block: chained, no match.
	assert.Equal(t, 0, c.touch(strings.Repeat("c", 16)+strings.Repeat("b", 16), 16))
	assert.Equal(t, 4, c.len())
	assert.Equal(t, 0, c.touch(strings.Repeat("d", 32), 16), "evicts the oldest blocks")
	assert.Equal(t, 4, c.len())
	assert.Equal(t, 0, c.touch(a, 16), "a's blocks were evicted")
}

func TestDarkRegion(t *testing.T) {
	f := newSim(t, Config{Regions: []string{"us-east", "eu-west"}})
	body := simChat("gpt-5.5-codex", "", 10, 2, false)
	eu := f.Server("eu-west", "gpt-5.5-codex")
	f.SetDark("eu-west", true)
	_, err := eu.Client().Post(eu.URL+"/chat/completions", "application/json", strings.NewReader(body))
	assert.Error(t, err, "a dark region closes the connection")
	resp, _ := post(t, f.Server("us-east", "gpt-5.5-codex"), "/chat/completions", body)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "other regions serve")
	f.SetDark("eu-west", false)
	resp, _ = post(t, eu, "/chat/completions", body)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "back")
	st := pathStats(t, f.Stats(), "eu-west/gpt-5.5-codex")
	assert.Equal(t, 1, st.Refused)
	assert.Equal(t, 1, st.Served)

	g := newSim(t, Config{Regions: []string{"us-east"}, DarkStatus: http.StatusServiceUnavailable})
	g.SetDark("us-east", true)
	resp, _ = post(t, g.Server("us-east", "deepseek-v3.2"), "/chat/completions", body)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
}

func TestBurst429(t *testing.T) {
	f := newSim(t, Config{Regions: []string{"us-east"}, TimeScale: 0.01})
	f.Burst429("us-east", 2, 500*time.Millisecond)
	srv := f.Server("us-east", "gemini-2.5-flash")
	body := simChat("gemini-2.5-flash", "", 5, 1, false)
	for range 2 {
		resp, _ := post(t, srv, "/chat/completions", body)
		assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
		assert.Equal(t, "5", resp.Header.Get("Retry-After-Ms"), "the hint is scaled like service times")
	}
	resp, _ := post(t, srv, "/chat/completions", body)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, 2, pathStats(t, f.Stats(), "us-east/gemini-2.5-flash").Throttled)
	// Models and embeddings are not scheduled.
	resp, _ = post(t, srv, "/embeddings", `{"model":"x","input":"hi"}`)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

func TestShardQueue(t *testing.T) {
	sh := &simShard{limit: 1}
	never := make(chan struct{})
	require.True(t, sh.enqueue(context.Background(), never), "idle: served at once")

	got := make(chan bool)
	go func() { got <- sh.enqueue(context.Background(), never) }()
	waitFor(t, func() bool { return sh.load() == 2 })
	assert.False(t, sh.enqueue(context.Background(), never), "queue full")

	sh.release(true, time.Millisecond)
	assert.True(t, <-got, "FIFO hand-off")
	assert.Equal(t, 1, sh.load())

	// A waiter whose client goes away leaves the queue.
	ctx, cancel := context.WithCancel(context.Background())
	aborted := make(chan any)
	go func() {
		defer func() { aborted <- recover() }()
		sh.enqueue(ctx, never)
	}()
	waitFor(t, func() bool { return sh.load() == 2 })
	cancel()
	assert.Equal(t, http.ErrAbortHandler, <-aborted)
	assert.Equal(t, 1, sh.load())
	sh.release(true, time.Millisecond)
	assert.Equal(t, 0, sh.load())
	sh.mu.Lock()
	defer sh.mu.Unlock()
	assert.Equal(t, 2, sh.served)
	assert.Equal(t, 1, sh.maxQueue)
}

func TestQueueFull(t *testing.T) {
	models := DefaultModels()[:1]
	models[0].Shards, models[0].QueueLimit = 1, 1
	f := newSim(t, Config{Regions: []string{"us-east"}, Models: models, TimeScale: 0.01})
	p := f.paths[0]
	// Hold the only shard and fill its queue, then call.
	require.True(t, p.shards[0].enqueue(context.Background(), nil))
	p.shards[0].mu.Lock()
	p.shards[0].queue = append(p.shards[0].queue, make(chan struct{}))
	p.shards[0].mu.Unlock()
	f.SetStalls(Stalls{Slow: 1}) // every call is drawn slow
	resp, _ := post(t, p.srv, "/chat/completions", simChat("gpt-5.5-codex", "", 5, 1, false))
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "10", resp.Header.Get("Retry-After-Ms"), "FullRetryAfter 1 s, scaled")
	st := pathStats(t, f.Stats(), "us-east/gpt-5.5-codex")
	assert.Equal(t, 1, st.Rejected)
	// Slowed counts calls a slow shard served, not one the full queue
	// refused (it counted it).
	assert.Zero(t, st.Slowed, "a call the full queue refused met no slow shard")
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestSimCacheKeysOnRouterCanonical checks that the prefix cache hashes the
// router's canonical prompt (internal/prompt): a chat request and the
// Responses request with the same instructions and input have the same
// canonical prompt, so the second finds the first one's blocks, and the
// cached tokens are those of the canonical text's leading full blocks.
func TestCacheKeysOnRouterCanonical(t *testing.T) {
	f := newSim(t, Config{Regions: []string{"us-east"}})
	srv := f.Server("us-east", "gpt-5.5-codex")
	sys := strings.Repeat("You answer questions about the billing system. ", 20)
	q := strings.TrimSpace(strings.Repeat(" word", 60))
	chat := simChat("gpt-5.5-codex", sys, 60, 2, false)
	resp, _ := post(t, srv, "/chat/completions", chat)
	require.Equal(t, http.StatusOK, resp.StatusCode)

	body, _ := json.Marshal(map[string]any{"model": "gpt-5.5-codex", "instructions": sys, "input": q, "max_output_tokens": 2})
	resp, b := post(t, srv, "/responses", string(body))
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	canon := string(prompt.AppendCanonical(nil, prompt.Responses, string(body), math.MaxInt))
	require.Equal(t, canon, string(prompt.AppendCanonical(nil, prompt.Chat, chat, math.MaxInt)), "one canonical prompt")
	full := len(canon) / 64 * 64
	assert.Equal(t, int64(min(bpe.O200K().Count(canon[:full]), relaytest.PromptTokens(prompt.Responses, body))),
		gjson.GetBytes(b, "usage.input_tokens_details.cached_tokens").Int(), "every full block of the chat call's prompt is cached")
}

func TestStalls(t *testing.T) {
	f := newSim(t, Config{Regions: []string{"us-east"}, TimeScale: 0.001})
	srv := f.Server("us-east", "gemini-2.5-flash")
	body := simChat("gemini-2.5-flash", "", 5, 10, false)
	m, _ := f.Model("gemini-2.5-flash")
	normal := time.Duration(float64(m.ServiceTime(simPromptTokens(body), 0, 10)) * 0.001)

	// Every call slowed 20 times: the answer takes at least 20 service times.
	f.SetStalls(Stalls{Slow: 1, SlowMin: 20, SlowMax: 20})
	start := time.Now()
	resp, _ := post(t, srv, "/chat/completions", body)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.GreaterOrEqual(t, time.Since(start), 20*normal)

	// Every call hangs until the client gives up; no shard is taken.
	f.SetStalls(Stalls{Hang: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	_, err = srv.Client().Do(req)
	assert.ErrorIs(t, err, context.DeadlineExceeded)

	// The zero Stalls ends them.
	f.SetStalls(Stalls{})
	resp, _ = post(t, srv, "/chat/completions", body)
	assert.Equal(t, http.StatusOK, resp.StatusCode)

	st := pathStats(t, f.Stats(), "us-east/gemini-2.5-flash")
	assert.Equal(t, 1, st.Slowed)
	assert.Equal(t, 1, st.Hung)
	assert.Equal(t, 2, st.Served)

	// A share draws about that share of calls, reproducibly for a seed.
	draw := func(seed uint64) (hung, slow int) {
		f.SetStalls(Stalls{Slow: 0.1, Hang: 0.05, Seed: seed})
		for range 2000 {
			h, factor := f.stall()
			switch {
			case h:
				hung++
			case factor != 1:
				slow++
				assert.True(t, factor >= 10 && factor <= 50, factor)
			}
		}
		return hung, slow
	}
	h1, s1 := draw(3)
	assert.InDelta(t, 100, h1, 40)
	assert.InDelta(t, 200, s1, 60)
	h2, s2 := draw(3)
	assert.Equal(t, []int{h1, s1}, []int{h2, s2})

	for _, bad := range []Stalls{{Slow: -0.1}, {Slow: 0.6, Hang: 0.5}, {Slow: 0.1, SlowMin: 0.5, SlowMax: 2}, {SlowMin: 5, SlowMax: 4}} {
		assert.Panics(t, func() { f.SetStalls(bad) }, "%+v", bad)
	}
}

// TestServedCountsAnswersOnly: Served counts answers given after service,
// not a call whose client went away in the middle of it (a hedge's loser,
// an attempt past its timeout, a stream given up on), which it did; the
// example's "hottest shard" share is computed from these counts.
func TestServedCountsAnswersOnly(t *testing.T) {
	models := DefaultModels()[:1]
	models[0].Shards = 1
	f := newSim(t, Config{Regions: []string{"us-east"}, Models: models, TimeScale: 0.01})
	srv := f.Server("us-east", "gpt-5.5-codex")
	// A long stream: its headers come when it takes the shard; the client
	// then gives up (1000 tokens would take 250 ms).
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/chat/completions",
		strings.NewReader(simChat("gpt-5.5-codex", "", 5, 1000, true)))
	require.NoError(t, err)
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	cancel()
	resp.Body.Close()
	// The next call has the shard once the abandoned one let it go.
	resp2, _ := post(t, srv, "/chat/completions", simChat("gpt-5.5-codex", "", 5, 1, false))
	require.Equal(t, http.StatusOK, resp2.StatusCode)
	waitFor(t, func() bool { return f.paths[0].shards[0].load() == 0 }) // its handler has ended
	assert.Equal(t, 1, pathStats(t, f.Stats(), "us-east/gpt-5.5-codex").Served, "one answer was given")
}

// A fault scripted on a fleet's Server (Script, or SetDefault) is answered
// as a plain Server answers it, and a scripted one is used up.
func TestScriptedFaultOnFleetServer(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script func(s *relaytest.Server)
		status int
	}{
		{"Script", func(s *relaytest.Server) { s.Script(relaytest.Fault{Status: 500}) }, 500},
		{"SetDefault", func(s *relaytest.Server) { s.SetDefault(relaytest.Fault{Status: 503}) }, 503},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newSim(t, Config{Regions: []string{"r"}, Models: []Model{{Name: "m"}}})
			s := f.Server("r", "m")
			require.NotNil(t, s)
			tc.script(s)
			resp, b := post(t, s, "/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
			assert.Equal(t, tc.status, resp.StatusCode, string(b))
			assert.Equal(t, 0, s.Pending())
		})
	}
}
