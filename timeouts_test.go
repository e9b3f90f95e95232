package relay

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay/relaytest"
)

// TestTimeoutsResolution: each candidate of a Decision shows the timeouts
// its attempt gets, field by field: the model's entry, else the
// upstream's, else the global setting; negative turns a bound off.
func TestTimeoutsResolution(t *testing.T) {
	r, _ := newTestRouter(t, Config{
		Upstreams: []Upstream{
			{Name: "fast", BaseURL: "http://fast.invalid/v1"},
			{Name: "slow", BaseURL: "http://slow.invalid/v1", Timeouts: Timeouts{Attempt: 30 * time.Second, Idle: -1}},
			{Name: "chat-only", BaseURL: "http://chat.invalid/v1", Models: []string{"gpt-4.1"}, Timeouts: Timeouts{FirstToken: 3 * time.Second}},
		},
		Policy: PolicyFunc(func(q Request) Route { return Route{Model: "gpt-4.1", Fallbacks: []string{"o3"}} }),
		Retry:  RetryConfig{AttemptTimeout: 2 * time.Second},
		Stream: StreamConfig{FirstTokenTimeout: time.Second},
		ModelTimeouts: map[string]Timeouts{
			"o3":      {Attempt: 2 * time.Minute, FirstToken: 20 * time.Second},
			"gpt-4.1": {FirstToken: -1},
		},
	})
	req, err := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "hi")))
	require.NoError(t, err)
	d, err := r.Decide(req)
	require.NoError(t, err)
	assert.Equal(t, []Candidate{
		// gpt-4.1 turns first-token failover off everywhere, even where the upstream sets it
		{Upstream: "fast", Model: "gpt-4.1", UpstreamModel: "gpt-4.1", Timeouts: Timeouts{Attempt: 2 * time.Second, Idle: 25 * time.Second}},
		{Upstream: "slow", Model: "gpt-4.1", UpstreamModel: "gpt-4.1", Timeouts: Timeouts{Attempt: 30 * time.Second}},
		{Upstream: "chat-only", Model: "gpt-4.1", UpstreamModel: "gpt-4.1", Timeouts: Timeouts{Attempt: 2 * time.Second, Idle: 25 * time.Second}},
		// o3's entry beats the upstream's Attempt; the upstream's Idle -1 still holds
		{Upstream: "fast", Model: "o3", UpstreamModel: "o3", Timeouts: Timeouts{Attempt: 2 * time.Minute, FirstToken: 20 * time.Second, Idle: 25 * time.Second}},
		{Upstream: "slow", Model: "o3", UpstreamModel: "o3", Timeouts: Timeouts{Attempt: 2 * time.Minute, FirstToken: 20 * time.Second}},
	}, d.Candidates)
	assert.Equal(t, []string{"fast", "slow", "chat-only", "fast", "slow"}, d.Upstreams)

	// Without any: no attempt or first-token bound, the default idle one;
	// an upstream's positive value beats a global "off".
	r, _ = newTestRouter(t, Config{
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.invalid/v1"}, {Name: "b", BaseURL: "http://b.invalid/v1", Timeouts: Timeouts{Idle: time.Minute}}},
		Stream:    StreamConfig{IdleTimeout: -1},
	})
	req, err = http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "hi")))
	require.NoError(t, err)
	d, err = r.Decide(req)
	require.NoError(t, err)
	assert.Equal(t, []Candidate{{Upstream: "a", Model: "gpt-4.1", UpstreamModel: "gpt-4.1", Timeouts: Timeouts{}}, {Upstream: "b", Model: "gpt-4.1", UpstreamModel: "gpt-4.1", Timeouts: Timeouts{Idle: time.Minute}}}, d.Candidates)
}

// TestTimeoutsValidation: New names the timeout settings it refuses.
func TestTimeoutsValidation(t *testing.T) {
	listed := []Upstream{{Name: "a", BaseURL: "http://a.invalid/v1", Models: []string{"gpt-4.1"}}}
	for _, c := range []struct {
		name string
		cfg  Config
		want string // "" when valid
	}{
		{"model served", Config{Upstreams: listed, ModelTimeouts: map[string]Timeouts{"gpt-4.1": {Attempt: time.Second}}}, ""},
		{"negative is off", Config{Upstreams: listed, ModelTimeouts: map[string]Timeouts{"gpt-4.1": {Attempt: -1, FirstToken: -1, Idle: -1}}}, ""},
		{"model served by none", Config{Upstreams: listed, ModelTimeouts: map[string]Timeouts{"o3-typo": {Attempt: time.Second}}}, `ModelTimeouts["o3-typo"] is for a model no upstream serves`},
		{"an upstream serving every model", Config{
			Upstreams:     append([]Upstream{{Name: "any", BaseURL: "http://any.invalid/v1"}}, listed...),
			ModelTimeouts: map[string]Timeouts{"o3": {Attempt: time.Second}},
		}, ""},
		{"empty model name", Config{Upstreams: listed, ModelTimeouts: map[string]Timeouts{"": {Attempt: time.Second}}}, "ModelTimeouts has an entry for the empty model name"},
		{"global attempt negative", Config{Upstreams: listed, Retry: RetryConfig{AttemptTimeout: -time.Second}}, "Retry.AttemptTimeout -1s is negative"},
		{"global first token negative", Config{Upstreams: listed, Stream: StreamConfig{FirstTokenTimeout: -time.Second}}, "Stream.FirstTokenTimeout -1s is negative"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(c.cfg)
			if c.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), "relay: "+c.want)
		})
	}
}

// sent is the outcome of a request sendAsync made: the response, its
// body as read to the end, and the error of RoundTrip or of the read.
type sent struct {
	resp *http.Response
	body []byte
	err  error
}

// sendAsync sends body to the chat endpoint, with the header X-Req: id
// (the gate of a gatedUpstream), on its own goroutine, and reads the
// answer to its end. The end of the test cancels it.
func sendAsync(t *testing.T, r http.RoundTripper, body, id string) <-chan sent {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	out := make(chan sent, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://relay/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("X-Req", id)
		resp, err := r.RoundTrip(req)
		if err != nil {
			out <- sent{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		out <- sent{resp, b, err}
	}()
	return out
}

// nextArmed is the next wait the router starts on clk, within a bound.
func nextArmed(t *testing.T, clk *fakeClock) time.Duration {
	t.Helper()
	select {
	case d := <-clk.armed:
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("no wait started")
		return 0
	}
}

// receive is the value ch yields, within a bound.
func receive[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("no result")
		var zero T
		return zero
	}
}

// TestTimeoutsAttemptPerModelAndUpstream: each attempt's timer runs for its
// own upstream and model. The first upstream holds every call until the
// test opens it: past a short timeout the request goes on to the second;
// within a long one, the first upstream's late answer is the one returned.
func TestTimeoutsAttemptPerModelAndUpstream(t *testing.T) {
	for _, c := range []struct {
		name     string
		model    string
		up       Timeouts            // the held upstream's
		models   map[string]Timeouts // ModelTimeouts
		timer    time.Duration       // the held attempt's timer; 0: none
		answered string              // the upstream that answers
	}{
		{"global", "gpt-4.1", Timeouts{}, map[string]Timeouts{"o3": {Attempt: time.Minute}}, 2 * time.Second, "b"},
		{"model's", "o3", Timeouts{}, map[string]Timeouts{"o3": {Attempt: time.Minute}}, time.Minute, "a"},
		{"upstream's", "gpt-4.1", Timeouts{Attempt: time.Minute}, nil, time.Minute, "a"},
		{"model's over upstream's", "gpt-4.1", Timeouts{Attempt: time.Minute}, map[string]Timeouts{"gpt-4.1": {Attempt: 5 * time.Second}}, 5 * time.Second, "b"},
		{"model's off", "o3", Timeouts{}, map[string]Timeouts{"o3": {Attempt: -1}}, 0, "a"},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, b := newGatedUpstream(t), newGatedUpstream(t)
			b.open("1")
			clk := newFakeClock()
			r, reps := newTestRouter(t, Config{
				Clock:         clk,
				Upstreams:     []Upstream{{Name: "a", BaseURL: a.URL, Timeouts: c.up}, {Name: "b", BaseURL: b.URL}},
				Retry:         RetryConfig{AttemptTimeout: 2 * time.Second, Backoff: func(int) time.Duration { return 0 }},
				ModelTimeouts: c.models,
			})
			done := sendAsync(t, r, chatBody(c.model, "x"), "1")
			if c.timer > 0 {
				require.Equal(t, c.timer, nextArmed(t, clk))
			}
			require.Eventually(t, func() bool { return a.Calls() == 1 }, 10*time.Second, time.Millisecond)
			if c.timer == 0 {
				assert.Empty(t, clk.armed, "no attempt timer")
			}
			// Time passes: past the global and the short timeouts, short of a minute.
			clk.Advance(30 * time.Second)
			if c.answered == "a" {
				a.open("1")
			}
			res := receive(t, done)
			require.NoError(t, res.err)
			assert.Equal(t, c.answered, res.resp.Header.Get(HeaderUpstream))
			rep := reps.all()[0]
			assert.Equal(t, c.answered, rep.Upstream)
			assert.Equal(t, map[string]int{"a": 1, "b": 2}[c.answered], rep.Attempts)
			if c.answered == "b" {
				require.Eventually(t, func() bool { return a.wasCancelled("1") }, 10*time.Second, time.Millisecond, "the timed-out call is cancelled")
			}
		})
	}
}

// TestTimeoutsFallbackModel: a retry on a fallback model runs for that
// model's attempt timeout, not the first model's.
func TestTimeoutsFallbackModel(t *testing.T) {
	a, b := newGatedUpstream(t), newGatedUpstream(t)
	clk := newFakeClock()
	r, reps := newTestRouter(t, Config{
		Clock: clk,
		Upstreams: []Upstream{
			{Name: "a", BaseURL: a.URL, Models: []string{"gpt-4.1"}},
			{Name: "b", BaseURL: b.URL, Models: []string{"o3"}},
		},
		Policy:        PolicyFunc(func(q Request) Route { return Route{Model: "gpt-4.1", Fallbacks: []string{"o3"}} }),
		Retry:         RetryConfig{AttemptTimeout: 2 * time.Second, Backoff: func(int) time.Duration { return 0 }},
		ModelTimeouts: map[string]Timeouts{"o3": {Attempt: time.Minute}},
	})
	done := sendAsync(t, r, chatBody("gpt-4.1", "x"), "1")
	require.Equal(t, 2*time.Second, nextArmed(t, clk))
	clk.Advance(2 * time.Second)
	require.Equal(t, time.Minute, nextArmed(t, clk), "the fallback's own timer")
	clk.Advance(30 * time.Second)
	b.open("1")
	res := receive(t, done)
	require.NoError(t, res.err)
	assert.Equal(t, "b", res.resp.Header.Get(HeaderUpstream))
	rep := reps.all()[0]
	assert.Equal(t, "o3", rep.Model)
	assert.Equal(t, 2, rep.Attempts)
}

// TestTimeoutsHedge: a hedge runs for its own upstream's attempt timeout.
func TestTimeoutsHedge(t *testing.T) {
	a, b := newGatedUpstream(t), newGatedUpstream(t)
	clk := newFakeClock()
	var mu sync.Mutex
	dones := map[string]AttemptDone{}
	r, reps := newTestRouter(t, Config{
		Clock: clk,
		Upstreams: []Upstream{
			{Name: "a", BaseURL: a.URL, Timeouts: Timeouts{Attempt: time.Hour}},
			{Name: "b", BaseURL: b.URL, Timeouts: Timeouts{Attempt: 3 * time.Second}},
		},
		Hedge: HedgeConfig{Delay: time.Second, Budget: 1},
		Hooks: Hooks{OnAttempt: func(_ context.Context, info AttemptInfo, _ *http.Request) func(AttemptDone) {
			return func(d AttemptDone) {
				mu.Lock()
				dones[info.Upstream] = d
				mu.Unlock()
			}
		}},
	})
	r.hedges.bal.Store(hedgeBudgetCap)
	done := sendAsync(t, r, chatBody("gpt-4.1", "x"), "1")
	// a's attempt timer and the hedge delay, in either order
	assert.ElementsMatch(t, []time.Duration{time.Hour, time.Second}, []time.Duration{nextArmed(t, clk), nextArmed(t, clk)})
	clk.Advance(time.Second)
	require.Equal(t, 3*time.Second, nextArmed(t, clk), "the hedge's own timer")
	require.Eventually(t, func() bool { return b.Calls() == 1 }, 10*time.Second, time.Millisecond)
	clk.Advance(3 * time.Second)
	require.Eventually(t, func() bool { return b.wasCancelled("1") }, 10*time.Second, time.Millisecond)
	a.open("1")
	res := receive(t, done)
	require.NoError(t, res.err)
	assert.Equal(t, "a", res.resp.Header.Get(HeaderUpstream))
	rep := reps.all()[0]
	assert.True(t, rep.Hedged)
	assert.Equal(t, 2, rep.Attempts)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(dones) == 2 }, 10*time.Second, time.Millisecond)
	assert.ErrorIs(t, dones["b"].Err, ErrAttemptTimeout)
	assert.Equal(t, 3*time.Second, dones["b"].Latency)
	assert.NoError(t, dones["a"].Err)
}

// heldStreamUpstream answers every call with an event stream's headers at
// once and its events (body) once release is called; a call whose client
// goes away first ends.
func heldStreamUpstream(t *testing.T, body []byte) (url string, release func()) {
	ch := make(chan struct{})
	var once sync.Once
	url = newHandlerServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.(http.Flusher).Flush()
		select {
		case <-ch:
			w.Write(body)
		case <-r.Context().Done():
		}
	}))
	release = func() { once.Do(func() { close(ch) }) }
	t.Cleanup(release)
	return url, release
}

func chatStreamBody(model string) string {
	return `{"model":"` + model + `","stream":true,"messages":[{"role":"user","content":"Hi"}]}`
}

// TestTimeoutsFirstTokenPerModel: first-token failover waits for the
// model's first-token timeout: the fast model's stream fails over past its
// own, the slow model's first token may come later than that; the retry
// runs for its own upstream's timeout.
func TestTimeoutsFirstTokenPerModel(t *testing.T) {
	body := fixture(t, "chat_stream_recorded_gpt4o_text_usage.sse")
	for _, c := range []struct {
		model    string
		timer    time.Duration
		answered string
	}{
		{"gpt-4.1", 2 * time.Second, "b"},
		{"o3", time.Minute, "a"},
	} {
		t.Run(c.model, func(t *testing.T) {
			heldURL, release := heldStreamUpstream(t, body)
			b := relaytest.NewServer()
			t.Cleanup(b.Close)
			clk := newFakeClock()
			r, reps := newTestRouter(t, Config{
				Clock:         clk,
				Upstreams:     []Upstream{{Name: "a", BaseURL: heldURL}, {Name: "b", BaseURL: b.URL, Timeouts: Timeouts{FirstToken: 7 * time.Second}}},
				Retry:         RetryConfig{Backoff: func(int) time.Duration { return 0 }},
				Stream:        StreamConfig{FirstTokenTimeout: 2 * time.Second},
				ModelTimeouts: map[string]Timeouts{"o3": {FirstToken: time.Minute}},
			})
			done := sendAsync(t, r, chatStreamBody(c.model), "")
			require.Equal(t, c.timer, nextArmed(t, clk), "a's first-token timer")
			clk.Advance(30 * time.Second)
			if c.answered == "b" {
				require.Equal(t, 7*time.Second, nextArmed(t, clk), "b's own first-token timer")
			}
			release()
			res := receive(t, done)
			require.NoError(t, res.err)
			assert.Contains(t, string(res.body), "data: [DONE]")
			rep := reps.all()[0]
			assert.NoError(t, rep.Err)
			assert.Equal(t, c.answered, rep.Upstream)
			assert.Equal(t, map[string]int{"a": 1, "b": 2}[c.answered], rep.Attempts)
		})
	}
}

// TestTimeoutsIdlePerModelAndUpstream: a stream that stalls fails with
// ErrStreamStalled after its own model's or upstream's idle timeout.
func TestTimeoutsIdlePerModelAndUpstream(t *testing.T) {
	for _, c := range []struct {
		name  string
		model string
		up    Timeouts
		want  time.Duration
	}{
		{"global", "gpt-4.1", Timeouts{}, 3 * time.Second},
		{"model's", "o3", Timeouts{}, time.Minute},
		{"upstream's", "gpt-4.1", Timeouts{Idle: 10 * time.Second}, 10 * time.Second},
		{"model's over upstream's", "o3", Timeouts{Idle: 10 * time.Second}, time.Minute},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := relaytest.NewServer()
			t.Cleanup(srv.Close)
			srv.SetDefault(relaytest.Fault{StallAfter: 2})
			clk := newFakeClock()
			r, reps := newTestRouter(t, Config{
				Clock:         clk,
				Upstreams:     []Upstream{{Name: "a", BaseURL: srv.URL, Timeouts: c.up}},
				Stream:        StreamConfig{IdleTimeout: 3 * time.Second},
				ModelTimeouts: map[string]Timeouts{"o3": {Idle: time.Minute}},
			})
			done := sendAsync(t, r, chatStreamBody(c.model), "")
			first := nextArmed(t, clk)
			assert.Equal(t, c.want, first, "the idle timer")
			passed := first
			clk.Advance(first)
			for stalled := false; !stalled; {
				select {
				case res := <-done:
					require.ErrorIs(t, res.err, ErrStreamStalled)
					stalled = true
				case d := <-clk.armed: // re-armed for the rest of the period
					passed += d
					clk.Advance(d)
				case <-time.After(10 * time.Second):
					t.Fatal("stall not detected")
				}
			}
			assert.GreaterOrEqual(t, passed, c.want, "not stalled before its idle timeout")
			assert.ErrorIs(t, reps.all()[0].Err, ErrStreamStalled)
		})
	}
}

// TestTimeoutsProbeTTL: the claim on the fleet's half-open probe lasts the
// probing attempt's own attempt timeout (10 s without one), at most the
// cooldown.
func TestTimeoutsProbeTTL(t *testing.T) {
	r, _ := newTestRouter(t, Config{
		Upstreams: []Upstream{
			{Name: "a", BaseURL: "http://a.invalid/v1"},
			{Name: "b", BaseURL: "http://b.invalid/v1", Timeouts: Timeouts{Attempt: 20 * time.Second}},
		},
		Retry:         RetryConfig{AttemptTimeout: 2 * time.Second},
		Breaker:       BreakerConfig{Cooldown: 30 * time.Second},
		ModelTimeouts: map[string]Timeouts{"o3": {Attempt: time.Minute}, "o4-mini": {Attempt: -1}},
	})
	for _, c := range []struct {
		up, model string
		want      time.Duration
	}{
		{"a", "gpt-4.1", 2 * time.Second},
		{"b", "gpt-4.1", 20 * time.Second},
		{"b", "o3", 30 * time.Second},
		{"a", "o4-mini", 10 * time.Second},
	} {
		assert.Equal(t, c.want, r.probeTTL(&candidate{up: r.byName[c.up], model: c.model}), "%s on %s", c.model, c.up)
	}
}

// TestAttemptTimeoutBeforeTheCallGoesOut: an attempt whose timer fires
// after it was armed but before its call went out (here, while
// Hooks.OnAttempt runs) timed out: it is retried on the next upstream,
// not ended as if the caller had cancelled.
func TestAttemptTimeoutBeforeTheCallGoesOut(t *testing.T) {
	clk := newFakeClock()
	ok := func(name string) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"choices":[{"message":{"content":"`+name+`"},"finish_reason":"stop"}]}`)
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	a, b := ok("a"), ok("b")
	var calls atomic.Int32
	r, reps := newTestRouter(t, Config{
		Clock:     clk,
		Upstreams: []Upstream{{Name: "a", BaseURL: a.URL}, {Name: "b", BaseURL: b.URL}},
		Strategy:  StrategyPriority,
		Retry:     RetryConfig{AttemptTimeout: time.Second, Backoff: func(int) time.Duration { return 0 }},
		Hooks: Hooks{OnAttempt: func(ctx context.Context, info AttemptInfo, _ *http.Request) func(AttemptDone) {
			if calls.Add(1) == 1 {
				clk.Advance(time.Second) // the first attempt's timer fires before its call
			}
			return nil
		}},
	})
	resp, _, err := send(t, r, chatBody("gpt-4.1", "x"))
	require.NoError(t, err)
	assert.Equal(t, "b", resp.Header.Get(HeaderUpstream))
	rep := reps.all()[0]
	assert.Equal(t, 2, rep.Attempts)
	assert.NoError(t, rep.Err)
}
