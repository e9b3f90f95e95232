package relay

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A caller's own key, forwarded to an upstream that has no APIKey of its
// own, never comes back in an error or a report when the upstream echoes
// it, whatever its format and wherever it travelled.

// callerKey is one way a caller sends its key: set puts it on the request;
// secret is what must never show (the bearer token without its scheme).
type callerKey struct {
	name   string
	set    func(*http.Request)
	secret string
}

var callerKeys = []callerKey{
	{"authorization", func(r *http.Request) { r.Header.Set("Authorization", "Bearer AIzaCALLERsecret0123456789abcdefXYZ") }, "AIzaCALLERsecret0123456789abcdefXYZ"},
	{"api-key", func(r *http.Request) { r.Header.Set("Api-Key", "0f1e2d3c4b5a69788796a5b4c3d2e1f0") }, "0f1e2d3c4b5a69788796a5b4c3d2e1f0"},
	{"x-api-key", func(r *http.Request) { r.Header.Set("X-Api-Key", "ak-CALLER-anthropic-0123456789") }, "ak-CALLER-anthropic-0123456789"},
	{"x-goog-api-key", func(r *http.Request) { r.Header.Set("X-Goog-Api-Key", "AIzaGOOGcaller9876543210zyxw") }, "AIzaGOOGcaller9876543210zyxw"},
	{"query", func(r *http.Request) { r.URL.RawQuery = "key=AIzaQUERY%2Fcaller0123456789" }, "AIzaQUERY/caller0123456789"},
}

// sentKey returns the key an upstream received, as it would echo it: the
// whole Authorization value ("Bearer ..."), else the first of the other
// places that carries one.
func sentKey(r *http.Request) string {
	for _, h := range []string{"Authorization", "Api-Key", "X-Api-Key", "X-Goog-Api-Key"} {
		if v := r.Header.Get(h); v != "" {
			return v
		}
	}
	return r.URL.Query().Get("key")
}

// echoes are the ways an upstream echoes the key it got.
var echoes = []struct {
	name, path, body string
	answer           func(w http.ResponseWriter, key string)
}{
	{"chat-sse-error", "chat/completions", chatStreamReq, func(w http.ResponseWriter, key string) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: {\"error\":{\"message\":\"Incorrect API key provided: %s. You can find your API key at https://platform.openai.com/account/api-keys.\",\"type\":\"invalid_request_error\",\"code\":\"invalid_api_key\"}}\n\n", key)
	}},
	{"response.failed", "responses", responsesStreamReq, func(w http.ResponseWriter, key string) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\"}}\n\n"+
			"event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"id\":\"resp_1\",\"status\":\"failed\",\"error\":{\"code\":\"invalid_api_key\",\"message\":\"Incorrect API key provided: %s\"}}}\n\n", key)
	}},
	{"sse-json-body", "chat/completions", chatStreamReq, func(w http.ResponseWriter, key string) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "{\"error\":{\"message\":\"Incorrect API key provided: %s\",\"code\":\"invalid_api_key\"}}\n", key)
	}},
	{"json-401", "chat/completions", chatBody("gpt-4o", "Hi"), func(w http.ResponseWriter, key string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprintf(w, "{\"error\":{\"message\":\"Incorrect API key provided: %s\",\"code\":\"invalid_api_key\"}}\n", key)
	}},
}

func TestCallerKeyEchoedIsRedacted(t *testing.T) {
	for _, e := range echoes {
		for _, k := range callerKeys {
			t.Run(e.name+"/"+k.name, func(t *testing.T) {
				got := ""
				url := newHandlerServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					io.Copy(io.Discard, r.Body)
					got = sentKey(r)
					e.answer(w, got)
				}))
				r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: url + "/v1"}}})
				req, _ := http.NewRequest("POST", "http://relay/v1/"+e.path, strings.NewReader(e.body))
				k.set(req)
				resp, err := r.RoundTrip(req)
				require.NoError(t, err)
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				require.Contains(t, got, k.secret, "the upstream got the caller's key")
				require.Contains(t, string(b), k.secret, "the caller reads the upstream's bytes as they were")
				all := reps.all()
				require.Len(t, all, 1)
				require.Error(t, all[0].Err)
				assertNoKey(t, k.secret, all[0].Err.Error(), fmt.Sprintf("%+v", all[0]))
				if e.name != "json-401" {
					assert.ErrorIs(t, all[0].Err, ErrStreamError)
					assert.Contains(t, all[0].Err.Error(), "Incorrect API key provided: [redacted]")
				}
			})
		}
	}
}

// TestCallerKeyInURLRedactedFromTransportError: a transport error that
// names the URL it was sent to (a *url.Error, as an http.Client-based Base
// returns) carries the caller's query key; the router's errors do not.
func TestCallerKeyInURLRedactedFromTransportError(t *testing.T) {
	const secret = "AIzaQUERYcaller0123456789/+="
	base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		return nil, &url.Error{Op: "Post", URL: req.URL.String(), Err: errors.New("connection refused")}
	})
	r, reps := newTestRouter(t, Config{Clock: newAutoClock(), Base: base, Upstreams: []Upstream{{Name: "dead", BaseURL: "http://127.0.0.1:1/v1"}}})
	req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions?key="+url.QueryEscape(secret), strings.NewReader(chatBody("gpt-4o", "x")))
	_, err := r.RoundTrip(req)
	require.Error(t, err)
	require.Len(t, reps.all(), 1)
	assert.Contains(t, err.Error(), "key=", "the error names the URL")
	var ue *url.Error
	assert.ErrorAs(t, err, &ue, "the cause is still the transport's error")
	assertNoKey(t, secret, err.Error(), fmt.Sprintf("%+v", err), reps.all()[0].Err.Error())
	assertNoKey(t, url.QueryEscape(secret), err.Error(), reps.all()[0].Err.Error())
}

func assertNoKey(t *testing.T, secret string, texts ...string) {
	t.Helper()
	for _, s := range texts {
		assert.NotContains(t, s, secret)
	}
}

func TestSentSecrets(t *testing.T) {
	req, _ := http.NewRequest("POST", "https://api.example.com/v1/chat?api-version=2024-10-21&key=qk-0123456789&sig=abcdefghij", nil)
	req.Header.Set("Authorization", "Bearer tok-0123456789")
	req.Header.Set("X-Goog-Api-Key", "goog-0123456789")
	req.Header.Set("Ocp-Apim-Subscription-Key", "apim-0123456789")
	req.Header.Set("X-Request-Id", "req-0123456789")
	req.Header.Set("Api-Key", "short")
	got := sentSecrets(req)
	for _, want := range []string{"Bearer tok-0123456789", "tok-0123456789", "goog-0123456789", "apim-0123456789", "qk-0123456789", "abcdefghij"} {
		assert.Contains(t, got, want)
	}
	for _, not := range []string{"req-0123456789", "2024-10-21", "short"} {
		assert.NotContains(t, got, not)
	}
	var s secrets
	assert.Equal(t, "got [redacted] and [redacted], not req-0123456789",
		s.redact("got Bearer tok-0123456789 and goog-0123456789, not req-0123456789", got...))
}
