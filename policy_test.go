package relay

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDecideNilURL(t *testing.T) {
	r := testRouter(t)
	_, err := r.Decide(&http.Request{Method: "POST", Header: http.Header{}})
	require.Error(t, err)
}

func TestClusterPolicy(t *testing.T) {
	busy := fakeLoad{"gpt-5.5-codex": true}
	idle := fakeLoad{}
	p := ClusterPolicy{Fast: "gemini-2.5-flash", Cheap: "deepseek-v3.2", Fallbacks: []string{"gpt-4.1"}}
	pb := p
	pb.WhenBusy = true
	cases := []struct {
		name   string
		p      ClusterPolicy
		tokens int
		bucket string
		load   Load
		want   Route
	}{
		{"window", p, 150, BucketShort, idle, Route{Model: "gemini-2.5-flash", Fallbacks: []string{"gpt-5.5-codex", "gpt-4.1"}, Bucket: BucketShort}},
		{"window edge low", p, 80, BucketShort, idle, Route{Model: "gemini-2.5-flash", Fallbacks: []string{"gpt-5.5-codex", "gpt-4.1"}, Bucket: BucketShort}},
		{"window edge high", p, 260, BucketMid, idle, Route{Model: "gemini-2.5-flash", Fallbacks: []string{"gpt-5.5-codex", "gpt-4.1"}, Bucket: BucketMid}},
		{"below window", p, 79, BucketShort, idle, Route{Model: "gpt-5.5-codex", Fallbacks: []string{"gpt-4.1"}, Bucket: BucketShort}},
		{"mid", p, 261, BucketMid, idle, Route{Model: "deepseek-v3.2", Fallbacks: []string{"gpt-5.5-codex", "gpt-4.1"}, Bucket: BucketMid}},
		{"long", p, 5000, BucketLong, idle, Route{Model: "gpt-5.5-codex", Fallbacks: []string{"gpt-4.1"}, Bucket: BucketLong}},
		{"window when busy", pb, 150, BucketShort, busy, Route{Model: "gemini-2.5-flash", Fallbacks: []string{"gpt-5.5-codex", "gpt-4.1"}, Bucket: BucketShort}},
		{"window when idle", pb, 150, BucketShort, idle, Route{Model: "gpt-5.5-codex", Fallbacks: []string{"gpt-4.1"}, Bucket: BucketShort}},
		{"window no load", pb, 150, BucketShort, nil, Route{Model: "gpt-5.5-codex", Fallbacks: []string{"gpt-4.1"}, Bucket: BucketShort}},
		{"custom window", ClusterPolicy{Fast: "f", WindowMin: 10, WindowMax: 20}, 15, BucketShort, idle, Route{Model: "f", Fallbacks: []string{"gpt-5.5-codex"}, Bucket: BucketShort}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := c.p.Route(Request{Model: "gpt-5.5-codex", PromptTokens: c.tokens, Bucket: c.bucket, Load: c.load})
			assert.Equal(t, c.want, got)
		})
	}
}

func TestDecide(t *testing.T) {
	r, err := New(Config{
		Upstreams: []Upstream{
			{Name: "flash", BaseURL: "http://127.0.0.1:1/v1", Models: []string{"gemini-2.5-flash"}},
			{Name: "codex-us", BaseURL: "http://127.0.0.1:2/v1", Models: []string{"gpt-5.5-codex"}},
			{Name: "codex-eu", BaseURL: "http://127.0.0.1:3/v1", Models: []string{"gpt-5.5-codex"}},
			{Name: "deepseek", BaseURL: "http://127.0.0.1:4/v1", Models: []string{"deepseek-v3.2"}},
		},
		Policy:   ClusterPolicy{Fast: "gemini-2.5-flash", Cheap: "deepseek-v3.2"},
		Strategy: StrategyPriority,
	})
	require.NoError(t, err)
	prompt := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 15) // ~150 tokens
	body := chatBody("gpt-5.5-codex", prompt)
	req, _ := http.NewRequest("POST", "http://x/v1/chat/completions", strings.NewReader(body))
	d, err := r.Decide(req)
	require.NoError(t, err)
	assert.Equal(t, "gemini-2.5-flash", d.Route.Model)
	assert.Equal(t, []string{"flash", "codex-us", "codex-eu"}, d.Upstreams)
	// The body is still readable.
	b := new(strings.Builder)
	_, err = fmt.Fprint(b, mustRead(t, req))
	require.NoError(t, err)
	assert.Equal(t, body, b.String())

	// GetBody is used when present, and Body is left alone.
	req, _ = http.NewRequest("POST", "http://x/v1/chat/completions", strings.NewReader(chatBody("gpt-5.5-codex", "long "+strings.Repeat("word ", 2000))))
	orig := req.Body
	d, err = r.Decide(req)
	require.NoError(t, err)
	assert.Equal(t, "gpt-5.5-codex", d.Route.Model)
	assert.Equal(t, BucketLong, d.Request.Bucket)
	assert.Equal(t, []string{"codex-us", "codex-eu"}, d.Upstreams)
	assert.True(t, orig == req.Body, "Body untouched when GetBody is set")

	// A model nobody serves.
	req, _ = http.NewRequest("POST", "http://x/v1/chat/completions", strings.NewReader(chatBody("claude-sonnet-4.5", "x")))
	_, err = r.Decide(req)
	assert.ErrorIs(t, err, ErrNoUpstream)
}

func TestDecideKeepsBodyClosable(t *testing.T) {
	r := testRouter(t)
	body := newTrackedBody(chatBody("gpt-4o", "hello"))
	req, _ := http.NewRequest("POST", "http://x/v1/chat/completions", nil)
	req.Body = body // no GetBody: Decide must read it and leave it readable
	_, err := r.Decide(req)
	require.NoError(t, err)
	assert.Equal(t, chatBody("gpt-4o", "hello"), mustRead(t, req))
	require.NoError(t, req.Body.Close())
	assert.EqualValues(t, 1, body.closes.Load(), "closing the replacement closes the caller's body")
}
