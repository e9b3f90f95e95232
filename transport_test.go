package relay

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/tokenrelay/relay/internal/jsonscan"
	"github.com/tokenrelay/relay/internal/tokens"
)

// seen is what a recording upstream received.
type seen struct {
	Method, Path, RawQuery string
	Header                 http.Header
	Body                   []byte
}

// recorder is an httptest upstream that records each request and answers
// with a fixed status and body.
type recorder struct {
	*httptest.Server
	mu     sync.Mutex
	reqs   []seen
	status int
	body   []byte
	header http.Header
}

func newRecorder(t *testing.T, status int, body []byte) *recorder {
	rec := &recorder{status: status, body: body, header: http.Header{"Content-Type": {"application/json"}}}
	rec.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rec.mu.Lock()
		rec.reqs = append(rec.reqs, seen{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Clone(), b})
		status, body := rec.status, rec.body
		for k, v := range rec.header {
			w.Header()[k] = v
		}
		rec.mu.Unlock()
		w.WriteHeader(status)
		w.Write(body)
	}))
	t.Cleanup(rec.Close)
	return rec
}

func (rec *recorder) got() []seen {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]seen(nil), rec.reqs...)
}

// newTestRouter builds a router whose OnReport collects into reports. Unless
// the test sets a Strategy or a Jitter, upstreams are tried in configuration
// order (StrategyPriority), so tests can say which upstream comes first.
func newTestRouter(t *testing.T, cfg Config) (*Router, *reports) {
	t.Helper()
	if cfg.Strategy == StrategyAffinity && cfg.Jitter == 0 {
		cfg.Strategy = StrategyPriority
	}
	reps := &reports{}
	cfg.OnReport = reps.add
	r, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(r.CloseIdleConnections)
	return r, reps
}

func chatBody(model, content string) string {
	return `{"model":"` + model + `","messages":[{"role":"user","content":"` + content + `"}]}`
}

func do(t *testing.T, rt http.RoundTripper, method, url, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	resp, err := rt.RoundTrip(req)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return resp, b
}

func TestRoundTripEndpoints(t *testing.T) {
	up := newRecorder(t, 200, []byte(`{}`))
	r, _ := newTestRouter(t, Config{Upstreams: []Upstream{
		{Name: "a", BaseURL: up.URL + "/base"},
		{Name: "b", BaseURL: up.URL + "/other"},
	}})
	cases := []struct{ method, in, want string }{
		{"POST", "http://x/v1/chat/completions", "/base/chat/completions"},
		{"POST", "http://x/v1/completions", "/base/completions"},
		{"POST", "http://x/deep/api/v1/responses", "/base/responses"},
		{"POST", "http://x/embeddings", "/base/embeddings"},
		{"GET", "http://x/v1/models", "/base/models"},
		{"GET", "http://x/v1/files/file-1/content", "/base/files/file-1/content"},
		{"GET", "http://x/models", "/base/models"},
	}
	for _, c := range cases {
		t.Run(c.method+" "+c.in, func(t *testing.T) {
			n := len(up.got())
			do(t, r, c.method, c.in, "")
			got := up.got()
			require.Len(t, got, n+1)
			assert.Equal(t, c.want, got[n].Path)
		})
	}
}

func TestRoundTripContract(t *testing.T) {
	cases := []struct {
		name       string
		status     int
		body       string
		wantErr    error
		wantCalls  int
		wantStatus int
	}{
		{"ok", 200, chatBody("gpt-4.1", "hi"), nil, 1, 200},
		{"final 400 returned with err nil", 400, chatBody("gpt-4.1", "hi"), nil, 1, 400},
		{"malformed json forwarded", 200, `{"model": "gpt-4.1", "messages": [`, nil, 1, 200},
		{"not an object forwarded", 200, `[1,2,3]`, nil, 1, 200},
		{"empty messages", 200, `{"model":"gpt-4.1","messages":[]}`, nil, 1, 200},
		{"messages of wrong type", 200, `{"model":"gpt-4.1","messages":"hi"}`, nil, 1, 200},
		{"model of wrong type", 200, `{"model":42,"messages":[{"role":"user","content":"x"}]}`, nil, 1, 200},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			up := newRecorder(t, c.status, []byte(`{"error":{"message":"bad"}}`))
			r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}}})
			body := newTrackedBody(c.body)
			req, _ := http.NewRequest("POST", "http://x/v1/chat/completions", body)
			resp, err := r.RoundTrip(req)
			require.NoError(t, err)
			assert.Equal(t, c.wantStatus, resp.StatusCode)
			assert.Empty(t, reps.all(), "no report before the body is done")
			b, _ := io.ReadAll(resp.Body)
			assert.Equal(t, `{"error":{"message":"bad"}}`, string(b))
			resp.Body.Close()
			resp.Body.Close()
			assert.EqualValues(t, 1, body.closes.Load(), "request body closed once")
			got := up.got()
			require.Len(t, got, c.wantCalls)
			if !gjson.Valid(c.body) || !gjson.Parse(c.body).IsObject() {
				assert.Equal(t, c.body, string(got[0].Body), "unchanged")
			}
			require.Len(t, reps.all(), 1, "exactly one report")
			rep := reps.all()[0]
			assert.Equal(t, c.wantStatus, rep.StatusCode)
			if c.status >= 400 {
				assert.ErrorIs(t, rep.Err, ErrUpstreamStatus)
			}
		})
	}
}

func TestRoundTripMalformedBodyHasZeroTokens(t *testing.T) {
	up := newRecorder(t, 200, []byte(`{}`))
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}}})
	for _, body := range []string{`{"model":"gpt-4.1","messages":[{"role":"user","content":"x"}`, `not json`, `"str"`, `null`} {
		resp, _ := do(t, r, "POST", "http://x/v1/chat/completions", body)
		assert.Equal(t, "0", resp.Header.Get(HeaderPromptTokens), body)
	}
	for _, rep := range reps.all() {
		assert.Zero(t, rep.PromptTokens)
	}
}

func TestRoundTripBodyTooLarge(t *testing.T) {
	up := newRecorder(t, 200, []byte(`{}`))
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}}, MaxBodyBytes: 64})
	for _, known := range []bool{true, false} {
		body := newTrackedBody(chatBody("gpt-4.1", strings.Repeat("a", 100)))
		req, _ := http.NewRequest("POST", "http://x/v1/chat/completions", body)
		if !known {
			req.ContentLength = -1
		}
		resp, err := r.RoundTrip(req)
		assert.Nil(t, resp)
		assert.ErrorIs(t, err, ErrBodyTooLarge)
		assert.EqualValues(t, 1, body.closes.Load())
	}
	assert.Empty(t, up.got(), "no upstream call")
	list := reps.all()
	require.Len(t, list, 2)
	assert.ErrorIs(t, list[0].Err, ErrBodyTooLarge)

	// Exactly at the limit is fine.
	body := strings.Repeat(" ", 64)
	do(t, r, "POST", "http://x/v1/chat/completions", body)
	assert.Len(t, up.got(), 1)
}

func TestRoundTripUnreachableAndCancelled(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "dead", BaseURL: deadURL, APIKey: "sk-never-print"}}, Retry: RetryConfig{MaxAttempts: 1}})
	body := newTrackedBody(chatBody("gpt-4.1", "hi"))
	req, _ := http.NewRequest("POST", "http://x/v1/chat/completions", body)
	resp, err := r.RoundTrip(req)
	assert.Nil(t, resp)
	var rerr *Error
	require.ErrorAs(t, err, &rerr)
	assert.Equal(t, "dead", rerr.Upstream)
	assert.NotContains(t, err.Error(), "sk-never-print")
	assert.True(t, strings.HasPrefix(err.Error(), "relay: "), err.Error())
	assert.EqualValues(t, 1, body.closes.Load())

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req, _ = http.NewRequestWithContext(ctx, "POST", "http://x/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "hi")))
	_, err = r.RoundTrip(req)
	assert.ErrorIs(t, err, context.Canceled)
	assert.Len(t, reps.all(), 2)
}

func TestRoundTripNoUpstreamForModel(t *testing.T) {
	up := newRecorder(t, 200, []byte(`{}`))
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL, Models: []string{"gpt-4.1"}}}})
	req, _ := http.NewRequest("POST", "http://x/v1/chat/completions", strings.NewReader(chatBody("claude-sonnet-4.5", "hi")))
	_, err := r.RoundTrip(req)
	assert.ErrorIs(t, err, ErrNoUpstream)
	assert.Empty(t, up.got())
	assert.Len(t, reps.all(), 1)
}

func TestRoundTripModelsFilterRoutes(t *testing.T) {
	a := newRecorder(t, 200, []byte(`{}`))
	b := newRecorder(t, 200, []byte(`{}`))
	r, _ := newTestRouter(t, Config{Upstreams: []Upstream{
		{Name: "a", BaseURL: a.URL, Models: []string{"gpt-4.1"}},
		{Name: "b", BaseURL: b.URL, Models: []string{"deepseek-v3.2"}},
	}})
	resp, _ := do(t, r, "POST", "http://x/v1/chat/completions", chatBody("deepseek-v3.2", "hi"))
	assert.Equal(t, "b", resp.Header.Get(HeaderUpstream))
	assert.Len(t, b.got(), 1)
	assert.Empty(t, a.got())
}

func TestCloseIdleConnectionsForwarded(t *testing.T) {
	var n int
	base := &closeCounter{n: &n}
	r, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://127.0.0.1:1"}}, Base: base})
	require.NoError(t, err)
	r.CloseIdleConnections()
	assert.Equal(t, 1, n)
}

type closeCounter struct {
	http.RoundTripper
	n *int
}

func (c *closeCounter) CloseIdleConnections() { *c.n++ }

func TestRoundTripConcurrent(t *testing.T) {
	up := newRecorder(t, 200, fixture(t, "chat_response_default.json"))
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}, {Name: "b", BaseURL: up.URL}}})
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("POST", "http://x/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", strings.Repeat("word ", i*10))))
			resp, err := r.RoundTrip(req)
			if !assert.NoError(t, err) {
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
	}
	wg.Wait()
	assert.Len(t, reps.all(), 32)
	assert.Len(t, up.got(), 32)
}

func TestRoundTripMultiMegabytePrompt(t *testing.T) {
	up := newRecorder(t, 200, fixture(t, "chat_response_default.json"))
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}}})
	prompt := strings.Repeat("All work and no play makes Jack a dull boy. ", 70000) // ~3 MB
	body := chatBody("gpt-4.1", prompt)
	resp, _ := do(t, r, "POST", "http://x/v1/chat/completions", body)
	assert.Equal(t, 200, resp.StatusCode)
	got := up.got()
	require.Len(t, got, 1)
	assert.Equal(t, body, string(got[0].Body))
	rep := reps.all()[0]
	assert.Equal(t, 3+tokens.O200K.Count("user")+tokens.O200K.Count(prompt)+3, rep.PromptTokens)
	assert.Equal(t, BucketLong, rep.Bucket)
}

func FuzzEditTop(f *testing.F) {
	f.Add(`{"a":1,"model":"x"}`, "model")
	f.Add(" {\"m\" : [1,{\"model\":2}] }\n", "t")
	f.Add(`{}`, `we"ird`)
	f.Fuzz(func(t *testing.T, in, key string) {
		if !gjson.Valid(in) || !gjson.Parse(in).IsObject() || !utf8.ValidString(key) {
			return
		}
		out, _ := editTop([]byte(in), []topSet{{key: key, raw: []byte(`"relay-set"`)}})
		if !gjson.ValidBytes(out) {
			t.Fatalf("invalid output %q from %q", out, in)
		}
		got := ""
		gjson.ParseBytes(out).ForEach(func(k, v gjson.Result) bool {
			if k.Str == key {
				got = v.Str
			}
			return true
		})
		if got != "relay-set" {
			t.Fatalf("key %q not set in %q", key, out)
		}
	})
}

// TestDeeplyNestedBodyIsNotFatal sends bodies nested far deeper than any
// real request: gjson's recursive validator would overflow the stack (a
// fatal error, not a panic), so the router treats them as not JSON and
// forwards them unchanged.
func TestDeeplyNestedBodyIsNotFatal(t *testing.T) {
	up := newRecorder(t, 200, []byte(`{"usage":{"prompt_tokens":1,"completion_tokens":1}}`))
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}}})
	const n = 8 << 20
	deep := `{"model":"gpt-4.1","messages":` + strings.Repeat("[", n) + strings.Repeat("]", n) + `}`
	resp, _ := do(t, r, "POST", "http://x/v1/chat/completions", deep)
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "0", resp.Header.Get(HeaderPromptTokens))
	assert.Len(t, up.got()[0].Body, len(deep), "forwarded unchanged")
	assert.Len(t, reps.all(), 1)

	// Brackets inside strings do not count, and ordinary nesting is fine.
	assert.Equal(t, 2, jsonscan.Depth(`{"a":["[[[[{{{{"]}`))
	assert.True(t, jsonscan.Valid(`{"a":"`+strings.Repeat("[", 2000)+`"}`))
	assert.False(t, jsonscan.Valid(strings.Repeat("[", 600)+strings.Repeat("]", 600)))
}

func TestNilURL(t *testing.T) {
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://127.0.0.1:1"}}})
	body := newTrackedBody("{}")
	_, err := r.RoundTrip(&http.Request{Method: "POST", Body: body, Header: http.Header{}})
	require.Error(t, err)
	assert.EqualValues(t, 1, body.closes.Load())
	assert.Len(t, reps.all(), 1)
}

// TestDiscardedBodyNeverDelaysFailover: a retryable answer whose body stalls
// (a 503 and half an error body, then nothing) does not hold the request:
// the next upstream is tried after the backoff alone.
func TestDiscardedBodyNeverDelaysFailover(t *testing.T) {
	stalled := newHandlerServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"error":{"message":"over`))
		w.(http.Flusher).Flush()
		<-r.Context().Done() // until the router lets go of it
	}))
	good := newRecorder(t, 200, fixture(t, "chat_response_default.json"))
	r, reps := newTestRouter(t, Config{Clock: newAutoClock(), Upstreams: []Upstream{{Name: "stalled", BaseURL: stalled}, {Name: "good", BaseURL: good.URL}}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
	resp, err := r.RoundTrip(req)
	require.NoError(t, err, "the stalled body held the request until its deadline")
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "good", reps.all()[0].Upstream)
	assert.NoError(t, ctx.Err())
}

// TestKeptBodyReturnedWhenNothingBetterCame: when every attempt fails, the
// first answer, read in the background, is returned with its body intact.
func TestKeptBodyReturnedWhenNothingBetterCame(t *testing.T) {
	body := `{"error":{"message":"overloaded","type":"server_error"}}`
	busy := newRecorder(t, 503, []byte(body))
	r, reps := newTestRouter(t, Config{Clock: newAutoClock(), Upstreams: []Upstream{{Name: "busy", BaseURL: busy.URL}, {Name: "dead", BaseURL: "http://127.0.0.1:1"}}})
	resp, b, err := send(t, r, chatBody("gpt-4.1", "x"))
	require.NoError(t, err)
	assert.Equal(t, 503, resp.StatusCode)
	assert.Equal(t, body, string(b))
	assert.Equal(t, "busy", reps.all()[0].Upstream)
}

// TestResponseRequestIsTheCallers: the response handed back carries the
// caller's request, never the outgoing copy with the upstream's key,
// headers and URL password.
func TestResponseRequestIsTheCallers(t *testing.T) {
	up := newRecorder(t, 200, fixture(t, "chat_response_default.json"))
	u, _ := url.Parse(up.URL)
	u.User = url.UserPassword("user", "url-password-secret")
	r, _ := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: u.String() + "/v1", APIKey: "sk-upstream-secret-key",
		Header: http.Header{"Api-Key": {"header-secret-value"}}}}})
	client := &http.Client{Transport: r}
	req, _ := http.NewRequest("POST", "http://caller.example/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
	req.Header.Set("Authorization", "Bearer callers-own")
	resp, err := client.Do(req)
	require.NoError(t, err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Same(t, req, resp.Request)
	dump, err := httputil.DumpRequestOut(resp.Request, false)
	require.NoError(t, err)
	for _, secret := range []string{"sk-upstream-secret-key", "header-secret-value", "url-password-secret"} {
		assert.NotContains(t, string(dump), secret)
	}
	assert.Equal(t, "Bearer sk-upstream-secret-key", up.got()[0].Header.Get("Authorization"), "the upstream still gets its key")
}

// TestNonModelPathSkipsOpenCircuit: a path that is not a model endpoint
// (GET /models) goes to the first upstream whose circuit is not open.
func TestNonModelPathSkipsOpenCircuit(t *testing.T) {
	first, second := newRecorder(t, 200, []byte(`{"data":[]}`)), newRecorder(t, 200, []byte(`{"data":[]}`))
	clock := newFakeClock()
	r, _ := newTestRouter(t, Config{Clock: clock, Upstreams: []Upstream{{Name: "first", BaseURL: first.URL}, {Name: "second", BaseURL: second.URL}}})
	u := r.byName["first"]
	failures(r, u, 6, clock.Now())
	require.Equal(t, StateOpen, stateOf(r, u, clock.Now()))
	resp, _ := do(t, r, "GET", "http://relay/v1/models", "")
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "second", resp.Header.Get(HeaderUpstream))
	assert.Empty(t, first.got())

	// Every circuit open: the soonest to recover is still tried.
	failures(r, r.byName["second"], 6, clock.Now())
	resp, _ = do(t, r, "GET", "http://relay/v1/models", "")
	assert.Equal(t, 200, resp.StatusCode)
}

// TestNilHeaderDoesNotPanic: a request with a nil Header is an empty one,
// also when the router sets a key and headers.
func TestNilHeaderDoesNotPanic(t *testing.T) {
	up := newRecorder(t, 200, fixture(t, "chat_response_default.json"))
	r, _ := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL, APIKey: "sk-key-123456", Header: http.Header{"X-Tag": {"t"}}}}})
	req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
	req.Header = nil
	resp, err := r.RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	got := up.got()[0]
	assert.Equal(t, "Bearer sk-key-123456", got.Header.Get("Authorization"))
	assert.Equal(t, "t", got.Header.Get("X-Tag"))
}

// oneByteReader returns its text a byte at a time, and (0, nil) between
// bytes, as io.Reader allows.
type oneByteReader struct {
	s    string
	idle bool
}

func (o *oneByteReader) Read(p []byte) (int, error) {
	if o.idle = !o.idle; o.idle {
		return 0, nil
	}
	if o.s == "" {
		return 0, io.EOF
	}
	p[0], o.s = o.s[0], o.s[1:]
	return 1, nil
}

func TestReadBodyAgainstItsContentLength(t *testing.T) {
	r, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}}, MaxBodyBytes: 8})
	require.NoError(t, err)
	boom := errors.New("boom")
	for _, c := range []struct {
		name     string
		body     io.Reader
		declared int64
		want     string
		err      error
	}{
		{"exact", strings.NewReader("abcd"), 4, "abcd", nil},
		{"unknown length", strings.NewReader("abcd"), -1, "abcd", nil},
		{"shorter than declared", strings.NewReader("ab"), 4, "ab", nil},
		{"longer than declared", strings.NewReader("abcdef"), 4, "abcdef", nil},
		{"longer than declared, past the limit", strings.NewReader("abcdefghi"), 4, "", ErrBodyTooLarge},
		{"unknown length, past the limit", strings.NewReader("abcdefghi"), -1, "", ErrBodyTooLarge},
		{"declared past the limit", strings.NewReader("abcd"), 9, "", ErrBodyTooLarge},
		{"a reader that pauses", &oneByteReader{s: "abcdefg"}, 4, "abcdefg", nil},
		{"a failing reader", io.MultiReader(strings.NewReader("ab"), iotest.ErrReader(boom)), 4, "", boom},
		{"failing after its declared length", io.MultiReader(strings.NewReader("abcd"), iotest.ErrReader(boom)), 4, "", boom},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest("POST", "http://x/v1/chat/completions", io.NopCloser(c.body))
			req.ContentLength = c.declared
			got, err := r.readBody(req)
			if c.err != nil {
				assert.ErrorIs(t, err, c.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.want, string(got))
		})
	}
}
