package relay

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ctlValues are names a header must never carry.
var ctlValues = []string{"gpt-4o\r\nX-Injected: yes", "gpt-4o\x00evil", "gpt-4o\nX-Injected: yes", "gpt-4o\rx", "gpt-4o\x7f"}

// A body's model with CR, LF, NUL or another control character is refused
// before the policy or any upstream sees it: it would go out in the
// X-Relay-Model response header.
func TestBodyModelWithControlCharacterRefused(t *testing.T) {
	up := newRecorder(t, 200, []byte(`{}`))
	var routed atomic.Int32
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL + "/v1"}},
		Policy: PolicyFunc(func(q Request) Route { routed.Add(1); return Route{Model: "gpt-4o-mini"} })})
	for i, m := range ctlValues {
		t.Run(m, func(t *testing.T) {
			model, _ := json.Marshal(m)
			body := `{"model":` + string(model) + `,"messages":[{"role":"user","content":"hi"}]}`
			req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(body))
			resp, err := r.RoundTrip(req)
			require.Nil(t, resp)
			require.ErrorIs(t, err, ErrBadName)
			assert.Contains(t, err.Error(), `the body's "model"`)
			assert.True(t, strings.HasPrefix(err.Error(), "relay: "), err.Error())
			assert.Empty(t, up.got(), "no upstream call")
			assert.Zero(t, routed.Load(), "the policy never saw it")
			require.Len(t, reps.all(), i+1)
			assert.ErrorIs(t, reps.all()[i].Err, ErrBadName)
		})
	}
}

// A Policy whose route carries a control character in its model, a
// fallback or its bucket is refused per request, with the field named;
// Decide says so too.
func TestRouteWithControlCharacterRefused(t *testing.T) {
	up := newRecorder(t, 200, []byte(`{}`))
	for _, c := range []struct {
		field string
		route Route
	}{
		{"Route.Model", Route{Model: "gpt-4o\r\nX-Injected: yes"}},
		{"Route.Model", Route{Model: "gpt-4o\x00evil"}},
		{"Route.Fallbacks[1]", Route{Model: "gpt-4o", Fallbacks: []string{"gpt-4o-mini", "gpt-4.1\nX: y"}}},
		{"Route.Bucket", Route{Model: "gpt-4o", Bucket: "short\r\nX: y"}},
	} {
		t.Run(c.field, func(t *testing.T) {
			r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL + "/v1"}},
				Policy: PolicyFunc(func(Request) Route { return c.route })})
			req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4o", "hi")))
			_, derr := r.Decide(req)
			require.ErrorIs(t, derr, ErrBadName)
			resp, err := r.RoundTrip(req)
			require.Nil(t, resp)
			require.ErrorIs(t, err, ErrBadName)
			assert.Contains(t, err.Error(), c.field)
			var e *Error
			require.True(t, errors.As(err, &e))
			assert.Empty(t, e.Model, "the bad name is quoted in the cause, not printed raw")
			assert.Empty(t, up.got(), "no upstream call")
			require.Len(t, reps.all(), 1)
		})
	}
}

// Every header value the router writes on a response is free of control
// characters, whichever model, fallback or upstream answered.
func TestResponseHeadersHaveNoControlCharacters(t *testing.T) {
	fail := newRecorder(t, 500, []byte(`{}`))
	ok := newRecorder(t, 200, []byte(`{"usage":{"prompt_tokens":3,"completion_tokens":1}}`))
	r, _ := newTestRouter(t, Config{Clock: newAutoClock(),
		Upstreams: []Upstream{{Name: "first", BaseURL: fail.URL + "/v1", Models: []string{"gpt-4o"}}, {Name: "second", BaseURL: ok.URL + "/v1", Models: []string{"gpt-4o-mini"}}},
		Policy:    PolicyFunc(func(Request) Route { return Route{Model: "gpt-4o", Fallbacks: []string{"gpt-4o-mini"}, Bucket: "b"} })})
	resp, _ := do(t, r, "POST", "http://relay/v1/chat/completions", chatBody("gpt-4o", "hi"))
	assert.Equal(t, "gpt-4o-mini", resp.Header.Get(HeaderModel))
	assert.Equal(t, "second", resp.Header.Get(HeaderUpstream))
	for k, vs := range resp.Header {
		for _, v := range vs {
			assert.False(t, hasCtl(v), "%s: %q", k, v)
		}
	}
}

// New refuses configured values the router would write into a request or
// a header with a control character, naming the field but never printing
// a key or a header value.
func TestNewRefusesControlCharactersInWrittenValues(t *testing.T) {
	const secret = "sk-secret-0123456789"
	base := func() Config {
		return Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}}}
	}
	cases := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"upstream name", func(c *Config) { c.Upstreams[0].Name = "a\r\nX-Injected: yes" }, "Name has a control character"},
		{"api key", func(c *Config) { c.Upstreams[0].APIKey = secret + "\r\nX-Injected: yes" }, "APIKey has a control character"},
		{"api key NUL", func(c *Config) { c.Upstreams[0].APIKey = secret + "\x00" }, "APIKey has a control character"},
		{"header value", func(c *Config) { c.Upstreams[0].Header = http.Header{"Api-Key": {secret + "\r\nX-Injected: yes"}} }, `Header "Api-Key" has a value with a control character`},
		{"header value NUL", func(c *Config) { c.Upstreams[0].Header = http.Header{"X-Tenant": {"t\x00" + secret}} }, `Header "X-Tenant" has a value`},
		{"header name", func(c *Config) { c.Upstreams[0].Header = http.Header{"X-Bad\r\nX-Injected": {"v"}} }, "is not a valid header field name"},
		{"header name space", func(c *Config) { c.Upstreams[0].Header = http.Header{"X Bad": {"v"}} }, "is not a valid header field name"},
		{"context fallback", func(c *Config) { c.ContextFallbacks = []string{"gpt-4.1", "gpt-4o\nx"} }, "ContextFallbacks[1]"},
		{"budget downgrade", func(c *Config) {
			c.Budgets = []Budget{{Name: "b", Limit: 1, Window: Window{Every: time.Hour}, Downgrade: "gpt-4o-mini\r\nX: y"}}
		}, `budget "b": Downgrade`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := base()
			c.edit(&cfg)
			_, err := New(cfg)
			require.ErrorContains(t, err, c.want)
			assert.NotContains(t, err.Error(), secret)
			assert.NotContains(t, err.Error(), "\r\n")
		})
	}
	cfg := base()
	cfg.Upstreams[0].Header = http.Header{"X-Tags": {"a\tb"}} // a tab is valid in a header value
	_, err := New(cfg)
	assert.NoError(t, err)
}
