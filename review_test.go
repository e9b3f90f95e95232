package relay

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/tokenrelay/relay/relaytest"
)

func TestBodyTagsFollowTheUpstream(t *testing.T) {
	srvs := newServers(t, 2)
	srvs[0].Script(relaytest.Fault{Status: 503})
	r, _, _ := retryRouter(t, Config{}, srvs...)
	r.ups[0].tags = []bodyTag{{key: "x_route_region", raw: []byte(`"us-east"`)}}
	r.ups[1].tags = []bodyTag{{key: "x_route_region", raw: []byte(`"eu-west"`)}}
	resp, _, err := send(t, r, chatBody("gpt-4.1", "x"))
	require.NoError(t, err)
	assert.Equal(t, "u1", resp.Header.Get(HeaderUpstream))
	assert.Equal(t, "us-east", gjson.GetBytes(srvs[0].Requests()[0].Body, "x_route_region").Str)
	assert.Equal(t, "eu-west", gjson.GetBytes(srvs[1].Requests()[0].Body, "x_route_region").Str)
}

func TestBaseURLQueryKept(t *testing.T) {
	srvs := newServers(t, 1)
	r, _ := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "az", BaseURL: srvs[0].URL + "?api-version=2024-10-21"}}})
	req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions?trace=1", strings.NewReader(chatBody("gpt-4.1", "x")))
	resp, err := r.RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, "api-version=2024-10-21&trace=1", srvs[0].Requests()[0].RawQuery)
}

func TestHeaderSecretsNotPrinted(t *testing.T) {
	up := Upstream{Name: "az", BaseURL: "https://user:pa55word@az.example/v1", Header: http.Header{"Api-Key": {"az-secret-123"}}}
	cfg := Config{Upstreams: []Upstream{up}}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
		for _, v := range []any{up, cfg} {
			out := fmt.Sprintf(verb, v)
			assert.NotContains(t, out, "az-secret-123")
			assert.NotContains(t, out, "pa55word")
		}
	}
}

func TestConfigCopiedByNew(t *testing.T) {
	prices := map[string]Price{"m": {OutputPerMTok: 1}}
	hdr := http.Header{"X-A": {"1"}}
	r, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://127.0.0.1:1", Header: hdr}}, Prices: prices})
	require.NoError(t, err)
	prices["m"] = Price{OutputPerMTok: 99}
	hdr.Set("X-A", "2")
	assert.Equal(t, 1.0, r.s.prices["m"].OutputPerMTok)
	assert.Equal(t, "1", r.ups[0].cfg.Header.Get("X-A"))
}

func TestReportBodyCloseDuringRead(t *testing.T) {
	gate := make(chan struct{})
	srv := newHandlerServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"choices":[`))
		w.(http.Flusher).Flush()
		select {
		case <-gate:
		case <-r.Context().Done():
		}
	}))
	defer close(gate)
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: srv}}})
	req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
	resp, err := r.RoundTrip(req)
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		io.Copy(io.Discard, resp.Body) // blocks until Close
	}()
	resp.Body.Close() // before, during or after the reader's Read: one report either way
	wg.Wait()
	assert.Len(t, reps.all(), 1)
}

func TestCallerDeadlineDoesNotTripBreaker(t *testing.T) {
	srvs := newServers(t, 1)
	srvs[0].SetDefault(relaytest.Fault{Hang: true})
	r, _ := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: srvs[0].URL}}, Breaker: BreakerConfig{Failures: 1}})
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
		_, err := r.RoundTrip(req)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
	}
	assert.Equal(t, StateClosed, r.ups[0].br.stateAt(r.s.clock.Now()), "the caller's own deadline is not the upstream's failure")
}

func TestHedgeKeepsResponseOverLaterError(t *testing.T) {
	a, b := newGatedUpstream(t), newGatedUpstream(t)
	// a answers 503 once its gate opens; b fails at the connection level.
	dead := newHandlerServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		b.mu.Lock()
		b.calls++
		gate := b.gate("1")
		b.mu.Unlock()
		<-gate
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
	}))
	failing := newHandlerServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		a.mu.Lock()
		a.calls++
		gate := a.gate("1")
		a.mu.Unlock()
		<-gate
		w.WriteHeader(503)
		w.Write([]byte(`{"error":{"message":"busy"}}`))
	}))
	clock := newFakeClock()
	r, reps := newTestRouter(t, Config{
		Clock: clock, Hedge: HedgeConfig{Delay: 100 * time.Millisecond}, Retry: RetryConfig{MaxAttempts: 1},
		Upstreams: []Upstream{{Name: "a", BaseURL: failing}, {Name: "b", BaseURL: dead}},
	})
	r.hedges.bal.Store(hedgeBudgetCap)
	done := sendWithID(t, r, "1")
	<-clock.armed
	require.Eventually(t, func() bool { return a.Calls() == 1 }, 5*time.Second, time.Millisecond)
	clock.Advance(100 * time.Millisecond)
	require.Eventually(t, func() bool { return b.Calls() == 1 }, 5*time.Second, time.Millisecond)
	// Whichever of a's 503 and b's dropped connection the router sees
	// first, the 503 is what the caller gets.
	a.open("1")
	b.open("1")
	resp := <-done
	require.NotNil(t, resp, "a response was obtained: err must be nil")
	assert.Equal(t, 503, resp.StatusCode)
	assert.True(t, reps.all()[0].Hedged)
	// Each attempt was observed exactly once by its own upstream.
	st := r.Stats()
	assert.Equal(t, uint64(1), st[0].Requests)
	assert.Equal(t, uint64(1), st[0].Failures)
	assert.Equal(t, uint64(1), st[1].Requests)
	assert.Equal(t, uint64(1), st[1].Failures)
}

func TestReportCarriesRequestContext(t *testing.T) {
	srvs := newServers(t, 1)
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: srvs[0].URL}}})
	type key struct{}
	for _, body := range []string{chatBody("gpt-4.1", "x"), strings.Repeat("x", 10)} {
		ctx := context.WithValue(context.Background(), key{}, body)
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://relay/v1/chat/completions", strings.NewReader(body))
		resp, err := r.RoundTrip(req)
		require.NoError(t, err)
		resp.Body.Close()
	}
	ctx := context.WithValue(context.Background(), key{}, "too large")
	r.s.maxBody = 4
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://relay/v1/chat/completions", strings.NewReader("12345"))
	_, err := r.RoundTrip(req)
	require.ErrorIs(t, err, ErrBodyTooLarge)
	list := reps.all()
	require.Len(t, list, 3)
	assert.Equal(t, chatBody("gpt-4.1", "x"), list[0].Context.Value(key{}))
	assert.Equal(t, "too large", list[2].Context.Value(key{}))
}

func TestNilURL(t *testing.T) {
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://127.0.0.1:1"}}})
	body := newTrackedBody("{}")
	_, err := r.RoundTrip(&http.Request{Method: "POST", Body: body, Header: http.Header{}})
	require.Error(t, err)
	assert.EqualValues(t, 1, body.closes.Load())
	assert.Len(t, reps.all(), 1)
}

func TestReservedBodyTagsRejected(t *testing.T) {
	for _, k := range []string{"model", "stream_options", "prompt_cache_key"} {
		_, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://127.0.0.1:1", BodyTags: map[string]any{k: "x"}}}})
		require.Error(t, err, k)
		assert.Contains(t, err.Error(), `body tag "`+k+`"`)
	}
	out, _ := editTop([]byte(`{"model":"a"}`), []topSet{{key: "model", raw: []byte(`"b"`)}, {key: "model", raw: []byte(`"c"`)}, {key: "n", raw: []byte(`1`)}, {key: "n", raw: []byte(`2`)}})
	assert.Equal(t, `{"model":"b","n":1}`, string(out), "a key set twice: the first set wins")
}

func TestDecideNilURL(t *testing.T) {
	r := testRouter(t)
	_, err := r.Decide(&http.Request{Method: "POST", Header: http.Header{}})
	require.Error(t, err)
}
