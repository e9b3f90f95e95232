package main

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay/relaytest"
)

// A request whose max_tokens exceeds the model's output window is the
// client's error (OpenAI: 400). (The gateway answered 502.)
func TestContextWindowIsClientError(t *testing.T) {
	f := newFixture(t, nil)
	resp, b := f.post(t, "/v1/chat/completions", `{"model":"gpt-4.1","messages":[{"role":"user","content":"hi"}],"max_tokens":100000}`)
	t.Logf("%d %s", resp.StatusCode, b)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Zero(t, f.up.Calls())
}

// /v1/chat passes an upstream error through with its status, body and a
// 429's Retry-After (which it dropped).
func TestChatKeepsRetryAfter(t *testing.T) {
	f := newFixture(t, nil)
	f.up.Script(relaytest.Fault{Status: 429, Header: http.Header{"Retry-After": {"7"}}})
	resp, b := f.post(t, "/v1/chat", `{"messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, 429, resp.StatusCode, string(b))
	assert.Equal(t, "7", resp.Header.Get("Retry-After"))
}

// Same through /v1/chat/completions (reverse proxy).
func TestCompletionsKeepsRetryAfter(t *testing.T) {
	f := newFixture(t, nil)
	f.up.Script(relaytest.Fault{Status: 429, Header: http.Header{"Retry-After": {"7"}}})
	resp, b := f.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, 429, resp.StatusCode, string(b))
	assert.Equal(t, "7", resp.Header.Get("Retry-After"))
}

// A transport error that names the URL (as an http.Client-style Base does)
// reaches the gateway's client without the query key (it had it).
func TestBaseErrorLeaksQueryKey(t *testing.T) {
	const key = "QSECRETazure0123456789"
	f := newFixture(t, func(c *config) {
		c.Upstreams[0].BaseURL += "?api-key=" + key
		c.Base = rtFunc(func(r *http.Request) (*http.Response, error) {
			return nil, &url.Error{Op: "Post", URL: r.URL.String(), Err: errors.New("connection reset by peer")}
		})
	})
	resp, b := f.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`)
	t.Logf("%d %s", resp.StatusCode, b)
	assert.NotContains(t, string(b), key)
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.reports {
		assert.NotContains(t, r.Err.Error(), key)
	}
}

type rtFunc func(*http.Request) (*http.Response, error)

func (f rtFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Other methods on a known path get 405.
// POST /metrics is a known path with another method: 405, with Allow: GET
// (it was 404).
func TestMetricsMethod(t *testing.T) {
	f := newFixture(t, nil)
	resp, b := f.post(t, "/metrics", `{}`)
	t.Logf("%d %s", resp.StatusCode, b)
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	assert.Equal(t, http.MethodGet, resp.Header.Get("Allow"))
}

// A bad -upstream value with a key in its query string is not echoed to
// stderr (it was, by the flag package and by the error).
func TestFlagErrorEchoesKey(t *testing.T) {
	const key = "QSECRETazure0123456789"
	var stderr bytes.Buffer
	code := run(context.Background(), []string{"-upstream", "az=az.example/openai?api-key=" + key}, &stderr)
	assert.Equal(t, 2, code)
	assert.NotContains(t, stderr.String(), key)
}
