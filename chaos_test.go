package relay

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// The chaos test drives the router through its public API only, the way
// an adversarial caller would: thousands of mixed requests from many
// goroutines against loopback upstreams that answer with a random fault
// each time, and callers that read everything, read part and close, close
// without reading, or cancel. It asserts what must hold whatever happens:
// one report per request, nothing left in flight, no path outside an
// upstream's BaseURL (dot segments refused), no goroutine or
// connection leaked, no secret in any report, error or resp.Request (the
// callers' own keys, which the router forwards, included), and the error
// bodies and finished streams a caller reads whole.

const (
	chaosKey    = "sk-chaos-SECRET-key-0001"
	chaosHeader = "hdr-SECRET-value-0002"
	chaosPass   = "pw-SECRET-0003"
)

// chaosCallerKeys are keys callers send of their own, which the router
// forwards (the upstreams' APIKey replaces only Authorization): each sets
// one on a request.
// chaosPaths are paths a hostile caller sends, each of which could take
// the upstream's key outside its BaseURL on a server that resolves dot
// segments: the router refuses them (ErrBadPath) before any call.
var chaosPaths = []string{
	"/v1/files/../../../../admin", "/v1/../../admin/secrets", "/v1/%2e%2e/%2e%2e/admin",
	"/v1/..%2f..%2fadmin", "/v1/%2E%2E%2Fadmin", "/v1/models/..%5c..%5cadmin", "/v1/chat/completions/../../../admin",
}

var chaosCallerKeys = map[string]func(*http.Request){
	"AIzaCHAOS-goog-SECRET-0004":  func(r *http.Request) { r.Header.Set("X-Goog-Api-Key", "AIzaCHAOS-goog-SECRET-0004") },
	"azCHAOSazureSECRET000000005": func(r *http.Request) { r.Header.Set("Api-Key", "azCHAOSazureSECRET000000005") },
	"AIzaCHAOS-query-SECRET-0006": func(r *http.Request) { r.URL.RawQuery = "key=AIzaCHAOS-query-SECRET-0006" },
}

// chaosFaults are what a chaos upstream may do with a call:
//   - ok, slow: an answer, at once or late
//   - 429, 429-ms, 503, 500, 400: an error status, with a retry hint for 429
//   - 503-stall, 500: an error status whose body stalls half way
//   - 400-large: a 400 whose body is 100 KiB
//   - 400-stall: a 400 whose body stalls after its first bytes
//   - drop, hang: the connection closed, or no answer, before the headers
//   - cut, stall: a stream cut, or stalled, half way
//   - error-event: a stream that carries an error event echoing the upstream's key
//   - echo-key: an error that echoes the caller's own key (a chat stream's
//     error event, a Responses response.failed event, a JSON 401 body)
//   - done-open: a stream that is finished but whose connection stays open
//   - remaining-0: an answer that says the upstream's request quota is spent
var chaosFaults = []string{
	"ok", "ok", "ok", "ok", "slow", "429", "429-ms", "503", "503-stall", "500",
	"400", "400-large", "400-stall", "drop", "hang", "cut", "stall", "error-event",
	"echo-key", "done-open", "remaining-0",
}

// Faults whose body the caller must read whole and without error: their
// answers carry X-Chaos-Fault and, for a body of known length, X-Chaos-Len.
var chaosIntact = map[string]bool{"400-large": true, "400-stall": true, "done-open": true}

// chaosUpstream answers each call with a fault drawn from its own seeded
// generator, and counts its open connections.
type chaosUpstream struct {
	*httptest.Server
	mu    sync.Mutex
	rng   *rand.Rand
	conns atomic.Int64
	json  []byte
	sse   []byte // a chat stream
	resp  []byte // a Responses stream
	large []byte // a 100 KiB error body
	// outside counts calls whose path is not under the BaseURL's /v1/ or
	// holds a dot segment, raw or encoded: a key sent outside its BaseURL.
	outside atomic.Int64
}

func newChaosUpstream(t *testing.T, seed uint64) *chaosUpstream {
	u := &chaosUpstream{rng: rand.New(rand.NewPCG(seed, 7)), json: fixture(t, "chat_response_default.json"),
		sse: fixture(t, "chat_stream_recorded_gpt4o_text_usage.sse"), resp: fixture(t, "responses_stream_spec_example.sse"),
		large: errorBodyOf(100<<10, "invalid_request_error")}
	u.Server = httptest.NewUnstartedServer(http.HandlerFunc(u.serve))
	u.Server.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			u.conns.Add(1)
		case http.StateClosed, http.StateHijacked:
			u.conns.Add(-1)
		}
	}
	u.Start()
	return u
}

func (u *chaosUpstream) fault() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return chaosFaults[u.rng.IntN(len(chaosFaults))]
}

func (u *chaosUpstream) serve(w http.ResponseWriter, r *http.Request) {
	if raw := strings.ToLower(r.URL.EscapedPath()); !strings.HasPrefix(raw, "/v1/") ||
		strings.Contains(raw, "/..") || strings.Contains(raw, "%2e") || strings.Contains(raw, "%2f") || strings.Contains(raw, "%5c") {
		u.outside.Add(1)
	}
	body, _ := io.ReadAll(r.Body)
	stream := bytes.Contains(body, []byte(`"stream":true`))
	ctx := r.Context()
	wait := func(d time.Duration) { // a fault's own timing, cut short when the client goes
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
	f := u.fault()
	switch f {
	case "slow":
		wait(30 * time.Millisecond)
	case "429":
		w.Header().Set("Retry-After", "0")
		http.Error(w, `{"error":{"message":"slow down","code":"rate_limit_exceeded"}}`, 429)
		return
	case "429-ms":
		w.Header().Set("Retry-After-Ms", "5")
		http.Error(w, `{"error":{"message":"slow down"}}`, 429)
		return
	case "503":
		http.Error(w, `{"error":{"message":"overloaded"}}`, 503)
		return
	case "503-stall", "500":
		w.WriteHeader(map[string]int{"503-stall": 503, "500": 500}[f])
		w.Write([]byte(`{"error":{"message":"ha`))
		w.(http.Flusher).Flush()
		wait(time.Second)
		return
	case "400":
		http.Error(w, `{"error":{"message":"bad request"}}`, 400)
		return
	case "400-large", "400-stall":
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Chaos-Fault", f)
		w.Header().Set("X-Chaos-Len", strconv.Itoa(len(u.large)))
		w.WriteHeader(400)
		if f == "400-stall" {
			w.Write(u.large[:20])
			w.(http.Flusher).Flush()
			wait(50 * time.Millisecond)
			w.Write(u.large[20:])
			return
		}
		w.Write(u.large)
		return
	case "echo-key":
		key := r.Header.Get("X-Goog-Api-Key") + r.Header.Get("Api-Key") + r.URL.Query().Get("key") // the caller's, if it sent one
		if key == "" {
			key = r.Header.Get("Authorization")
		}
		if !stream {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprintf(w, `{"error":{"message":"Incorrect API key provided: %s","code":"invalid_api_key"}}`, key)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		if strings.HasSuffix(r.URL.Path, "/responses") {
			fmt.Fprintf(w, "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\",\"error\":{\"code\":\"invalid_api_key\",\"message\":\"Incorrect API key provided: %s\"}}}\n\n", key)
			return
		}
		fmt.Fprintf(w, "data: {\"error\":{\"message\":\"Incorrect API key provided: %s\",\"code\":\"invalid_api_key\"}}\n\ndata: [DONE]\n\n", key)
		return
	case "drop":
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
		return
	case "hang":
		wait(time.Second)
		return
	case "remaining-0":
		w.Header().Set("X-Ratelimit-Remaining-Requests", "0")
		w.Header().Set("X-Ratelimit-Reset-Requests", "20ms")
	}
	if !stream {
		u.answerJSON(w, r)
		return
	}
	events := u.sse
	if strings.HasSuffix(r.URL.Path, "/responses") {
		events = u.resp
	}
	u.answerStream(w, f, events, wait)
}

func (u *chaosUpstream) answerJSON(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		zw.Write(u.json)
		zw.Close()
		return
	}
	w.Write(u.json)
}

func (u *chaosUpstream) answerStream(w http.ResponseWriter, f string, body []byte, wait func(time.Duration)) {
	w.Header().Set("Content-Type", "text/event-stream")
	if f == "done-open" {
		w.Header().Set("X-Chaos-Fault", f)
		w.Write(body)
		w.(http.Flusher).Flush()
		wait(5 * time.Second) // the stream is finished; the connection stays open, far past IdleTimeout
		return
	}
	events := bytes.SplitAfter(body, []byte("\n\n"))
	for i, ev := range events {
		switch {
		case f == "cut" && i == 3:
			panic(http.ErrAbortHandler)
		case f == "stall" && i == 3:
			w.(http.Flusher).Flush()
			wait(time.Second)
			return
		case f == "error-event" && i == 2:
			fmt.Fprintf(w, "data: {\"error\":{\"message\":\"Incorrect API key provided: %s\",\"code\":\"invalid_api_key\"}}\n\n", chaosKey)
			return
		}
		w.Write(ev)
		if i%4 == 0 {
			w.(http.Flusher).Flush()
		}
	}
}

func TestChaos(t *testing.T) {
	requests, workers := 2000, 32
	if testing.Short() {
		requests = 300
	}
	ignore := goleak.IgnoreCurrent()
	runChaos(t, requests, workers)
	goleak.VerifyNone(t, ignore)
}

func runChaos(t *testing.T, requests, workers int) {
	ups := make([]*chaosUpstream, 4)
	cfg := make([]Upstream, len(ups))
	for i := range ups {
		ups[i] = newChaosUpstream(t, uint64(i+1))
		base, _ := url.Parse(ups[i].URL + "/v1")
		base.User = url.UserPassword("relay", chaosPass)
		cfg[i] = Upstream{Name: fmt.Sprintf("u%d", i), BaseURL: base.String(), APIKey: chaosKey,
			Header: http.Header{"X-Api-Key": {chaosHeader}}, RPM: 100000, TPM: 1 << 30, MaxInFlight: 8}
	}
	base := &http.Transport{MaxIdleConnsPerHost: 16}
	var reports atomic.Int64
	secretIn := func(s string) bool {
		for k := range chaosCallerKeys {
			if strings.Contains(s, k) {
				return true
			}
		}
		return routerSecretIn(s)
	}
	r, err := New(Config{
		Upstreams: cfg, Base: base,
		Retry:   RetryConfig{MaxAttempts: 3, InitialInterval: time.Millisecond, MaxInterval: 5 * time.Millisecond, AttemptTimeout: 150 * time.Millisecond},
		Hedge:   HedgeConfig{Delay: 20 * time.Millisecond, Budget: 0.2},
		Breaker: BreakerConfig{Cooldown: 20 * time.Millisecond, MaxCooldown: 50 * time.Millisecond},
		Limits:  Limits{MaxWait: 20 * time.Millisecond},
		// (long enough that a busy host's scheduling delays are no stall)
		Stream: StreamConfig{IdleTimeout: 500 * time.Millisecond},
		OnReport: func(rep Report) {
			reports.Add(1)
			if secretIn(fmt.Sprintf("%+v %#v", rep, rep)) || (rep.Err != nil && secretIn(rep.Err.Error())) {
				t.Errorf("a secret in a report: %+v", rep)
			}
		},
	})
	require.NoError(t, err)

	var sent atomic.Int64
	var wg sync.WaitGroup
	jobs := make(chan int)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 99))
			for range jobs {
				sent.Add(1)
				chaosCall(t, r, rng, secretIn)
			}
		}()
	}
	for i := range requests {
		jobs <- i
	}
	close(jobs)
	wg.Wait()

	require.Eventually(t, func() bool { return reports.Load() == sent.Load() }, 20*time.Second, 5*time.Millisecond,
		"one report per request: %d reports for %d requests", reports.Load(), sent.Load())
	time.Sleep(10 * time.Millisecond) // a report made twice would come now
	assert.Equal(t, sent.Load(), reports.Load(), "exactly one report per request")
	for _, u := range r.ups {
		assert.Zero(t, u.inflight.Load(), "%s: requests left in flight", u.cfg.Name)
		assert.Zero(t, u.lim.slots.inUse(), "%s: in-flight slots left taken", u.cfg.Name)
	}
	r.CloseIdleConnections()
	for _, u := range ups {
		assert.Zero(t, u.outside.Load(), "calls outside the BaseURL's path")
		require.Eventually(t, func() bool { return u.conns.Load() == 0 }, 20*time.Second, 5*time.Millisecond,
			"connections left open: %d", u.conns.Load())
		u.Close()
	}
}

// routerSecretIn reports whether s holds a secret of the router's
// configuration (a caller's own request holds the caller's keys).
func routerSecretIn(s string) bool {
	return strings.Contains(s, chaosKey) || strings.Contains(s, chaosHeader) || strings.Contains(s, chaosPass)
}

// chaosCall makes one request the way a random caller would and checks
// what it got back.
func chaosCall(t *testing.T, r *Router, rng *rand.Rand, secretIn func(string) bool) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	path, body := "chat/completions", chatBody("gpt-4.1", "chaos")
	switch rng.IntN(4) {
	case 0, 1:
		body = `{"model":"gpt-4.1","stream":true,"messages":[{"role":"user","content":"chaos"}]}`
	case 2:
		path, body = "responses", `{"model":"gpt-4.1","stream":true,"input":"chaos"}`
	}
	target := "http://relay/v1/" + path
	hostile := rng.IntN(10) == 0
	if hostile {
		target = "http://relay" + chaosPaths[rng.IntN(len(chaosPaths))]
	}
	req, _ := http.NewRequestWithContext(ctx, "POST", target, strings.NewReader(body))
	cancelled := false
	switch rng.IntN(6) {
	case 0:
		req.Header = nil
	case 1:
		req.Header.Set("Accept-Encoding", "gzip")
	case 2:
		cancelled = true
		time.AfterFunc(time.Duration(rng.IntN(30))*time.Millisecond, cancel) // cancelled at some point
	}
	if req.Header != nil && rng.IntN(2) == 0 {
		keys := slices.Sorted(maps.Keys(chaosCallerKeys))
		chaosCallerKeys[keys[rng.IntN(len(keys))]](req)
	}
	resp, err := r.RoundTrip(req)
	if hostile && !errors.Is(err, ErrBadPath) && !(cancelled && errors.Is(err, context.Canceled)) {
		t.Errorf("%s: %v, want ErrBadPath", target, err)
	}
	if err != nil {
		if secretIn(fmt.Sprintf("%v %+v", err, err)) {
			t.Errorf("a secret in an error: %v", err)
		}
		return
	}
	if resp.Request != req {
		t.Errorf("resp.Request is not the caller's")
	}
	if req.Header != nil { // dumping needs a Header
		if dump, derr := httputil.DumpRequestOut(resp.Request.WithContext(context.Background()), false); derr != nil || routerSecretIn(string(dump)) {
			t.Errorf("resp.Request shows a secret (%v): %s", derr, dump)
		}
	}
	switch rng.IntN(4) {
	case 0: // close without reading
	case 1: // read part
		io.ReadFull(resp.Body, make([]byte, 10))
	default:
		b, err := io.ReadAll(resp.Body)
		if f := resp.Header.Get("X-Chaos-Fault"); chaosIntact[f] && !cancelled {
			chaosCheckIntact(t, f, resp, b, err)
		}
	}
	resp.Body.Close()
}

// chaosCheckIntact checks the body a caller read of an answer that must
// reach it whole: an error body of the length the upstream sent, or a
// finished stream, up to its end.
func chaosCheckIntact(t *testing.T, fault string, resp *http.Response, b []byte, err error) {
	if err != nil {
		t.Errorf("%s: the read failed: %v", fault, err)
		return
	}
	if want := resp.Header.Get("X-Chaos-Len"); want != "" && strconv.Itoa(len(b)) != want {
		t.Errorf("%s: read %d bytes of %s", fault, len(b), want)
	}
	if fault == "done-open" && !bytes.HasSuffix(b, []byte("data: [DONE]\n\n")) && !bytes.HasSuffix(b, []byte("\"metadata\":{}}}\n\n")) {
		t.Errorf("%s: the stream read does not end with the stream's end: %q", fault, b[max(len(b)-80, 0):])
	}
}
