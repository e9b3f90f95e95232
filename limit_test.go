package relay

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay/relaytest"
	"github.com/tokenrelay/relay/store"
)

func TestLimiterRPMWaitsThenMovesOn(t *testing.T) {
	srvs := newServers(t, 2)
	clock := newAutoClock()
	r, reps := newTestRouter(t, Config{
		Clock:     clock,
		Upstreams: []Upstream{{Name: "a", BaseURL: srvs[0].URL, RPM: 2}, {Name: "b", BaseURL: srvs[1].URL, RPM: 1}},
		Limits:    Limits{MaxWait: time.Minute},
	})
	var ups []string
	for range 4 {
		resp, _, err := send(t, r, chatBody("gpt-4.1", "x"))
		require.NoError(t, err)
		ups = append(ups, resp.Header.Get(HeaderUpstream))
	}
	// a takes 2, b takes 1, then the 4th waits for the bucket that refills
	// first: a refills one request every 30 s, b every 60 s.
	assert.Equal(t, []string{"a", "a", "b", "a"}, ups)
	assert.Equal(t, []time.Duration{30 * time.Second}, clock.Waits())
	assert.Len(t, reps.all(), 4)
}

func TestLimiterRateLimitedWhenWaitTooLong(t *testing.T) {
	srvs := newServers(t, 1)
	clock := newAutoClock()
	r, reps := newTestRouter(t, Config{
		Clock:     clock,
		Upstreams: []Upstream{{Name: "a", BaseURL: srvs[0].URL, RPM: 1}},
	})
	_, _, err := send(t, r, chatBody("gpt-4.1", "x"))
	require.NoError(t, err)
	_, _, err = send(t, r, chatBody("gpt-4.1", "x"))
	assert.ErrorIs(t, err, ErrRateLimited)
	assert.Equal(t, 1, srvs[0].Calls(), "no upstream call")
	assert.Empty(t, clock.Waits(), "no wait beyond MaxWait")
	assert.Len(t, reps.all(), 2)
	assert.ErrorIs(t, reps.all()[1].Err, ErrRateLimited)
}

func TestLimiterTPMCharge(t *testing.T) {
	srv := relaytest.NewServer(relaytest.WithCompletionTokens(1 << 20)) // uses every token it may: nothing to settle
	t.Cleanup(srv.Close)
	clock := newAutoClock()
	r, _ := newTestRouter(t, Config{
		Clock:     clock,
		Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL, TPM: 6000}},
		Limits:    Limits{MaxWait: time.Minute},
	})
	body := `{"model":"gpt-4.1","max_tokens":2990,"messages":[{"role":"user","content":"x"}]}` // ~3000 tokens
	for range 2 {
		_, _, err := send(t, r, body)
		require.NoError(t, err)
	}
	assert.Empty(t, clock.Waits(), "two charges fit the minute's bucket")
	_, _, err := send(t, r, body)
	require.NoError(t, err)
	require.Len(t, clock.Waits(), 1)
	assert.InDelta(t, 30*time.Second, clock.Waits()[0], float64(time.Second), "waits for ~3000 of 6000/min")
	// A charge larger than the bucket is clamped to it, not refused forever.
	huge := `{"model":"gpt-4.1","max_tokens":30000,"messages":[{"role":"user","content":"x"}]}`
	_, _, err = send(t, r, huge)
	require.NoError(t, err)
}

func TestLimiterCancelDuringWaitGivesTokensBack(t *testing.T) {
	srvs := newServers(t, 1)
	clock := newFakeClock()
	r, reps := newTestRouter(t, Config{
		Clock:     clock,
		Upstreams: []Upstream{{Name: "a", BaseURL: srvs[0].URL, RPM: 1}},
		Limits:    Limits{MaxWait: 2 * time.Minute},
	})
	_, _, err := send(t, r, chatBody("gpt-4.1", "x"))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	errc := roundTripAsync(r, ctx)
	assert.Equal(t, 60*time.Second, <-clock.armed)
	cancel()
	assert.ErrorIs(t, <-errc, context.Canceled)
	// The cancelled reservation was returned: after a minute one request
	// passes without waiting.
	clock.Advance(time.Minute)
	require.NoError(t, <-roundTripAsync(r, context.Background()))
	assert.Equal(t, 2, srvs[0].Calls())
	assert.Len(t, reps.all(), 3)
}

func TestLimiterMaxInFlight(t *testing.T) {
	gate := make(chan struct{})
	var mu sync.Mutex
	peak, cur := 0, 0
	srv := newSlowUpstream(t, gate, func(d int) {
		mu.Lock()
		cur += d
		peak = max(peak, cur)
		mu.Unlock()
	})
	r, reps := newTestRouter(t, Config{
		Upstreams: []Upstream{{Name: "a", BaseURL: srv, MaxInFlight: 2}},
		Limits:    Limits{MaxWait: time.Minute},
	})
	var wg sync.WaitGroup
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, err := send(t, r, chatBody("gpt-4.1", "x"))
			assert.NoError(t, err)
		}()
	}
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return cur == 2 }, 5*time.Second, time.Millisecond)
	close(gate)
	wg.Wait()
	assert.Equal(t, 2, peak)
	assert.Len(t, reps.all(), 6)
}

// newSlowUpstream answers only once gate is closed and reports concurrency
// changes to track.
func newSlowUpstream(t *testing.T, gate chan struct{}, track func(int)) string {
	srv := relaytest.NewServer()
	t.Cleanup(srv.Close)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		track(1)
		defer track(-1)
		<-gate
		resp, err := http.Post(srv.URL+"/chat/completions", "application/json", r.Body)
		if err != nil {
			w.WriteHeader(502)
			return
		}
		defer resp.Body.Close()
		w.Header().Set("Content-Type", "application/json")
		io.Copy(w, resp.Body)
	})
	front := newHandlerServer(t, h)
	return front
}

func TestLimiterHoldsFromHeaders(t *testing.T) {
	cases := []struct {
		name string
		f    relaytest.Fault
		hold time.Duration
	}{
		{"429 retry-after", relaytest.Fault{Status: 429, Header: http.Header{"Retry-After": {"20"}}}, 20 * time.Second},
		{"429 without hint", relaytest.Fault{Status: 429}, time.Second},
		{"remaining requests 0", relaytest.Fault{Header: http.Header{"X-Ratelimit-Remaining-Requests": {"0"}, "X-Ratelimit-Reset-Requests": {"6m0s"}}}, 6 * time.Minute},
		{"remaining tokens 0", relaytest.Fault{Header: http.Header{"X-Ratelimit-Remaining-Tokens": {"0"}, "X-Ratelimit-Reset-Tokens": {"120ms"}}}, 120 * time.Millisecond},
		{"remaining non-zero", relaytest.Fault{Header: http.Header{"X-Ratelimit-Remaining-Requests": {"5"}, "X-Ratelimit-Reset-Requests": {"1s"}}}, 0},
		{"garbage reset", relaytest.Fault{Header: http.Header{"X-Ratelimit-Remaining-Requests": {"0"}, "X-Ratelimit-Reset-Requests": {"soon"}}}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srvs := newServers(t, 2)
			srvs[0].Script(c.f)
			clock := newAutoClock()
			r, _ := newTestRouter(t, Config{
				Clock:     clock,
				Upstreams: []Upstream{{Name: "a", BaseURL: srvs[0].URL}, {Name: "b", BaseURL: srvs[1].URL}},
				Retry:     RetryConfig{MaxAttempts: 1},
			})
			send(t, r, chatBody("gpt-4.1", "x"))
			now := clock.Now()
			assert.Equal(t, c.hold, holdLeft(t, r, "a", now))
			assert.Zero(t, holdLeft(t, r, "b", now), "the other upstream is not held")
			if c.hold > 0 {
				resp, _, err := send(t, r, chatBody("gpt-4.1", "x"))
				require.NoError(t, err)
				assert.Equal(t, "b", resp.Header.Get(HeaderUpstream), "a held upstream is passed over")
			}
		})
	}
}

func TestParseReset(t *testing.T) {
	for in, want := range map[string]time.Duration{"1s": time.Second, "6m0s": 6 * time.Minute, "120ms": 120 * time.Millisecond, "0": 0, "2.5": 2500 * time.Millisecond, "100h": time.Hour} {
		d, ok := parseReset(in)
		assert.True(t, ok, in)
		assert.Equal(t, want, d, in)
	}
	for _, in := range []string{"", "-1s", "soon", "NaN"} {
		_, ok := parseReset(in)
		assert.False(t, ok, in)
	}
}

func newHandlerServer(t *testing.T, h http.Handler) string {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestCancelledContextSpendsNoQuota: requests whose context is already
// cancelled make no call and take no rate-limit tokens.
func TestCancelledContextSpendsNoQuota(t *testing.T) {
	up := newRecorder(t, 200, fixture(t, "chat_response_default.json"))
	r, reps := newTestRouter(t, Config{Clock: newFakeClock(), Upstreams: []Upstream{{Name: "a", BaseURL: up.URL, RPM: 3, TPM: 100000}}})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 3 {
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
		_, err := r.RoundTrip(req)
		require.ErrorIs(t, err, context.Canceled)
	}
	assert.Empty(t, up.got())
	resp, _, err := send(t, r, chatBody("gpt-4.1", "x"))
	require.NoError(t, err, "the quota is still there")
	assert.Equal(t, 200, resp.StatusCode)
	assert.Len(t, reps.all(), 4)
}

// holdLeft returns how long the hold the router's store has on upstream
// name keeps it out at now.
func holdLeft(t *testing.T, r *Router, name string, now time.Time) time.Duration {
	v, err := r.st.Admit(context.Background(), store.Limits{Name: name}, store.Ask{Force: true}, now)
	require.NoError(t, err)
	return v.Wait
}

// TestCircuitOpenedDuringSlotWaitStillTries: a request that waited for an
// in-flight slot while the only upstream's circuit opened is still tried
// once, as the next request would be.
func TestCircuitOpenedDuringSlotWaitStillTries(t *testing.T) {
	a := newGatedUpstream(t)
	clock := newFakeClock()
	r, reps := newTestRouter(t, Config{Clock: clock, Upstreams: []Upstream{{Name: "a", BaseURL: a.URL, MaxInFlight: 1}}})
	first := sendWithID(t, r, "1")
	require.Eventually(t, func() bool { return a.Calls() == 1 }, 5*time.Second, time.Millisecond)
	second := sendWithID(t, r, "2")
	<-clock.armed // the second waits for the slot
	u := r.byName["a"]
	failures(r, u, 6, clock.Now())
	require.Equal(t, StateOpen, stateOf(r, u, clock.Now()))
	a.open("2")
	a.open("1")
	require.NotNil(t, <-first)
	resp := <-second
	require.NotNil(t, resp, "ErrCircuitOpen without a try")
	assert.Equal(t, 200, resp.StatusCode)
	assert.Len(t, reps.all(), 2)
}

// TestLimiterTPMSettles: the part of a TPM charge (prompt plus max output
// tokens) a request did not use goes back to the bucket when its usage is
// known.
func TestLimiterTPMSettles(t *testing.T) {
	srv := relaytest.NewServer() // answers 8 completion tokens
	t.Cleanup(srv.Close)
	clock := newAutoClock()
	r, _ := newTestRouter(t, Config{Clock: clock, Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL, TPM: 6000}}, Limits: Limits{MaxWait: time.Minute}})
	body := `{"model":"gpt-4.1","max_tokens":2990,"messages":[{"role":"user","content":"x"}]}`
	for range 10 {
		_, _, err := send(t, r, body)
		require.NoError(t, err)
	}
	assert.Empty(t, clock.Waits(), "each request gives back what it did not use")
}

// TestWaitGoesWhereTheQueueIsShorter: waiting requests take their tokens
// when their turn comes, so an upstream's bucket alone does not show who
// waits for it. a's next token comes in 1 s and b's in 2 s (tokens a second
// after that on both); of four requests that must wait, the first two wait
// for a (the second ties with b: a comes first), the third counts two
// ahead of it at a and waits for b, the fourth ties again. All are served
// within 3 s, where waiting by the buckets alone puts all four behind a,
// the last served in 4 s.
func TestWaitGoesWhereTheQueueIsShorter(t *testing.T) {
	clock := newFakeClock()
	var mu sync.Mutex
	served := map[string]time.Duration{}
	hosts := map[string]int{}
	start := clock.Now()
	base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		mu.Lock()
		served[req.Header.Get("X-Id")] = clock.Now().Sub(start)
		hosts[req.URL.Host]++
		mu.Unlock()
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody}, nil
	})
	r, _ := newTestRouter(t, Config{Clock: clock, Base: base, Strategy: StrategyPriority, Limits: Limits{MaxWait: time.Minute},
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1", RPM: 60}, {Name: "b", BaseURL: "http://b.test/v1", RPM: 60}}})
	a, b := &r.ups[0].lim, &r.ups[1].lim
	spend(t, r, r.ups[0], 60, clock.Now())                  // a's minute is spent: a token a second from now
	spend(t, r, r.ups[1], 60, clock.Now().Add(time.Second)) // and b's as of a second from now: its next token in 2 s
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
			req.Header.Set("X-Id", itoa(i))
			resp, err := r.RoundTrip(req)
			if assert.NoError(t, err) {
				resp.Body.Close()
			}
		})
		require.Eventually(t, func() bool { return int(a.turns.n.Load()+b.turns.n.Load()) == i+1 }, 5*time.Second, time.Millisecond)
	}
	for len(served) < 4 {
		clock.Advance(time.Second)
		// Every waiter due has left its queue and called the upstream.
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			now := clock.Now()
			return len(served)+int(a.turns.n.Load()+b.turns.n.Load()) == 4 && a.turns.settled(now) && b.turns.settled(now)
		}, 5*time.Second, time.Millisecond)
	}
	wg.Wait()
	assert.Equal(t, map[string]int{"a.test": 3, "b.test": 1}, hosts)
	assert.Equal(t, map[string]time.Duration{"0": time.Second, "1": 2 * time.Second, "2": 2 * time.Second, "3": 3 * time.Second}, served)
}
