package relay

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay/relaytest"
)

func TestLimiterRPMWaitsThenMovesOn(t *testing.T) {
	srvs := newServers(t, 2)
	clock := newAutoClock()
	r, reps := newTestRouter(t, Config{
		Clock:     clock,
		Upstreams: []Upstream{{Name: "a", BaseURL: srvs[0].URL, RPM: 2}, {Name: "b", BaseURL: srvs[1].URL, RPM: 1}},
		Limits:    LimitConfig{MaxWait: time.Minute},
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
	srvs := newServers(t, 1)
	clock := newAutoClock()
	r, _ := newTestRouter(t, Config{
		Clock:     clock,
		Upstreams: []Upstream{{Name: "a", BaseURL: srvs[0].URL, TPM: 6000}},
		Limits:    LimitConfig{MaxWait: time.Minute},
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
	huge := `{"model":"gpt-4.1","max_tokens":1000000,"messages":[{"role":"user","content":"x"}]}`
	_, _, err = send(t, r, huge)
	require.NoError(t, err)
}

func TestLimiterCancelDuringWaitGivesTokensBack(t *testing.T) {
	srvs := newServers(t, 1)
	clock := newFakeClock()
	r, reps := newTestRouter(t, Config{
		Clock:     clock,
		Upstreams: []Upstream{{Name: "a", BaseURL: srvs[0].URL, RPM: 1}},
		Limits:    LimitConfig{MaxWait: 2 * time.Minute},
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
		Limits:    LimitConfig{MaxWait: time.Minute},
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
			assert.Equal(t, c.hold, r.byName["a"].lim.delay(now, 0))
			assert.Zero(t, r.byName["b"].lim.delay(now, 0), "the other upstream is not held")
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
