package relay

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// okBase answers every request 200 with a small JSON body.
var okBase = roundTripFunc(func(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(strings.NewReader(`{"usage":{"prompt_tokens":3,"completion_tokens":1}}`)), Request: req}, nil
})

// sendWithHeader sends a chat request with header h through r and
// returns the response's X-Relay-Request-Id ("" when RoundTrip failed).
func sendWithHeader(t *testing.T, r *Router, h http.Header) string {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "hi")))
	for k, vs := range h {
		req.Header[k] = vs
	}
	resp, err := r.RoundTrip(req)
	if err != nil {
		return ""
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.Header.Get(HeaderRequestID)
}

// TestRequestIDsUnique: every request gets an ID, in its Report and in
// the response header, unique among concurrent requests; two Routers make
// different ones.
func TestRequestIDsUnique(t *testing.T) {
	r, reps := newTestRouter(t, Config{Base: okBase, Upstreams: []Upstream{{Name: "a", BaseURL: "http://up/v1"}}})
	const n = 200
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids[i] = sendWithHeader(t, r, nil)
		}()
	}
	wg.Wait()
	seen := map[string]bool{}
	for _, id := range ids {
		require.NotEmpty(t, id)
		assert.False(t, seen[id], "duplicate %s", id)
		seen[id] = true
	}
	reported := map[string]bool{}
	for _, rep := range reps.all() {
		reported[rep.RequestID] = true
	}
	assert.Equal(t, seen, reported, "each response's ID is its report's")

	r2, _ := newTestRouter(t, Config{Base: okBase, Upstreams: []Upstream{{Name: "a", BaseURL: "http://up/v1"}}})
	id2 := sendWithHeader(t, r2, nil)
	prefix := func(id string) string { return id[:strings.LastIndexByte(id, '-')] }
	assert.NotEqual(t, prefix(ids[0]), prefix(id2), "each Router draws its own prefix")
	assert.Len(t, prefix(id2), 16)
}

// TestRequestIDFromCaller: a caller's X-Relay-Request-Id, else its
// X-Request-Id, is the request's ID when it is usable; an unusable one is
// replaced.
func TestRequestIDFromCaller(t *testing.T) {
	r, reps := newTestRouter(t, Config{Base: okBase, Upstreams: []Upstream{{Name: "a", BaseURL: "http://up/v1"}}})
	cases := []struct {
		name   string
		header http.Header
		want   string // "": a made one
	}{
		{"x-request-id", http.Header{"X-Request-Id": {"req-123"}}, "req-123"},
		{"relay header first", http.Header{"X-Request-Id": {"req-123"}, HeaderRequestID: {"trace-9"}}, "trace-9"},
		{"unusable relay header falls to x-request-id", http.Header{"X-Request-Id": {"req-123"}, HeaderRequestID: {"a b"}}, "req-123"},
		{"too long", http.Header{"X-Request-Id": {strings.Repeat("x", 129)}}, ""},
		{"control character", http.Header{"X-Request-Id": {"id\x01"}}, ""},
		{"none", nil, ""},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := sendWithHeader(t, r, c.header)
			assert.Equal(t, got, reps.all()[i].RequestID)
			if c.want != "" {
				assert.Equal(t, c.want, got)
				return
			}
			assert.Regexp(t, `^[0-9a-f]{16}-[0-9]+$`, got)
		})
	}
}

// TestRequestIDWithoutResponse: a request that got no response has its
// ID in its Report.
func TestRequestIDWithoutResponse(t *testing.T) {
	r, reps := newTestRouter(t, Config{Base: okBase, Upstreams: []Upstream{{Name: "a", BaseURL: "http://up/v1", Models: []string{"gpt-4.1"}}}})
	req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("claude", "hi")))
	req.Header.Set("X-Request-Id", "req-404")
	_, err := r.RoundTrip(req)
	require.ErrorIs(t, err, ErrNoUpstream)
	require.Len(t, reps.all(), 1)
	assert.Equal(t, "req-404", reps.all()[0].RequestID)
}
