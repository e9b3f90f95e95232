package relay

import (
	"io"
	"net/http"
	"strings"
	"testing"

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

func TestRoundTripRewritesURLKeyAndModel(t *testing.T) {
	up := newRecorder(t, 200, fixture(t, "chat_response_default.json"))
	r, reps := newTestRouter(t, Config{
		Upstreams: []Upstream{{
			Name: "eu", BaseURL: up.URL + "/openai/v1/", APIKey: "sk-secret-eu",
			Header:   http.Header{"x-extra": {"1"}},
			BodyTags: map[string]any{"x_route_region": "eu-west"},
		}},
		Policy: PolicyFunc(func(q Request) Route { return Route{Model: "gpt-4.1-mini"} }),
	})
	body := `{"messages":[{"role":"user","content":"caf\u00e9 \"q\""}],"unknown":{"b":2,"a":1},"model":"gpt-4.1","stream":false}`
	req, _ := http.NewRequest("POST", "http://caller.example/some/prefix/v1/chat/completions?api-version=2024-10-21", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer caller-key")
	req.Header.Set("OpenAI-Organization", "org-1")
	origHeader := req.Header.Clone()
	resp, err := r.RoundTrip(req)
	require.NoError(t, err)
	_, err = io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())

	got := up.got()
	require.Len(t, got, 1)
	assert.Equal(t, "/openai/v1/chat/completions", got[0].Path)
	assert.Equal(t, "api-version=2024-10-21", got[0].RawQuery)
	assert.Equal(t, "Bearer sk-secret-eu", got[0].Header.Get("Authorization"))
	assert.Equal(t, "org-1", got[0].Header.Get("OpenAI-Organization"))
	assert.Equal(t, "1", got[0].Header.Get("X-Extra"))
	want := `{"messages":[{"role":"user","content":"caf\u00e9 \"q\""}],"unknown":{"b":2,"a":1},"model":"gpt-4.1-mini","stream":false,"x_route_region":"eu-west"}`
	assert.Equal(t, want, string(got[0].Body), "every other byte survives: order, escapes, unknown fields")

	// The caller's request is untouched.
	assert.Equal(t, "caller.example", req.URL.Host)
	assert.Equal(t, "/some/prefix/v1/chat/completions", req.URL.Path)
	assert.Equal(t, origHeader, req.Header)

	assert.Equal(t, "gpt-4.1-mini", resp.Header.Get(HeaderModel))
	assert.Equal(t, "eu", resp.Header.Get(HeaderUpstream))
	assert.NotEmpty(t, resp.Header.Get(HeaderPromptTokens))

	list := reps.all()
	require.Len(t, list, 1)
	rep := list[0]
	assert.Equal(t, "gpt-4.1", rep.RequestedModel)
	assert.Equal(t, "gpt-4.1-mini", rep.Model)
	assert.Equal(t, "eu", rep.Upstream)
	assert.Equal(t, 200, rep.StatusCode)
	assert.Equal(t, 1, rep.Attempts)
	assert.NoError(t, rep.Err)
	assert.Positive(t, rep.PromptTokens)
}

func TestEditTop(t *testing.T) {
	cases := []struct {
		name, in string
		sets     []topSet
		want     string
		found    uint64
	}{
		{"replace in place", `{"a":1,"model":"x","b":{"model":"inner"}}`, []topSet{{key: "model", raw: []byte(`"y"`)}},
			`{"a":1,"model":"y","b":{"model":"inner"}}`, 1},
		{"add at the end", `{"a":1}`, []topSet{{key: "t", raw: []byte(`"v"`)}}, `{"a":1,"t":"v"}`, 0},
		{"empty object", `{}`, []topSet{{key: "t", raw: []byte(`1`)}, {key: "u", raw: []byte(`2`)}}, `{"t":1,"u":2}`, 0},
		{"whitespace kept", " {\n \"a\" : 1 ,\n \"m\" : \"x\"\n}\n", []topSet{{key: "m", raw: []byte(`"y"`)}, {key: "n", raw: []byte(`true`)}},
			" {\n \"a\" : 1 ,\n \"m\" : \"y\"\n,\"n\":true}\n", 1},
		{"if absent keeps", `{"k":"mine"}`, []topSet{{key: "k", raw: []byte(`"ours"`), ifAbsent: true}}, `{"k":"mine"}`, 1},
		{"escaped key", `{"a\"b":1}`, []topSet{{key: `a"b`, raw: []byte(`2`)}, {key: `c"d`, raw: []byte(`3`)}}, `{"a\"b":2,"c\"d":3}`, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, found := editTop([]byte(c.in), c.sets)
			assert.Equal(t, c.want, string(out))
			assert.Equal(t, c.found, found)
			assert.True(t, gjson.Valid(string(out)))
		})
	}
}

func TestEditTopRepeatedKey(t *testing.T) {
	out, found := editTop([]byte(`{"k":1,"k":2}`), []topSet{{key: "k", raw: []byte(`3`)}})
	assert.Equal(t, `{"k":3,"k":3}`, string(out))
	assert.Equal(t, uint64(1), found)
}

func TestInjectCacheKey(t *testing.T) {
	r, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://127.0.0.1:1"}}, PromptCacheKey: true})
	require.NoError(t, err)
	inject := func(in string, key uint64) string {
		tr := &trip{r: r, body: []byte(in), key: key}
		tr.c = r.classify("POST", "/v1/chat/completions", nil, tr.body)
		return string(tr.bodyFor(candidate{up: r.ups[0], model: tr.c.req.Model}).b)
	}
	body := `{"model":"gpt-4o","messages":[]}`
	assert.Equal(t, `{"model":"gpt-4o","messages":[],"prompt_cache_key":"relay-0123456789abcdef"}`, inject(body, 0x0123456789abcdef))
	assert.Contains(t, inject(`{"model":"x"}`, 1), `"relay-0000000000000001"`)
	for _, in := range []string{
		`{"model":"gpt-4o","prompt_cache_key":"mine"}`,
		`{"prompt_cache_key":null}`,
		`not json`,
		`{"model":`,
		`[1,2,3]`,
		`"string"`,
		``,
	} {
		assert.Equal(t, in, inject(in, 42), in)
	}
	assert.Equal(t, `{"model":"x"}`, inject(`{"model":"x"}`, 0), "no key, no field")
}

func TestInjectStreamUsage(t *testing.T) {
	r, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.invalid/v1"}}})
	require.NoError(t, err)
	for _, c := range []struct {
		path, body string
		inject     bool
	}{
		{"/v1/chat/completions", chatStreamReq, true},
		{"/v1/chat/completions", `{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":false},"messages":[]}`, true},
		{"/v1/chat/completions", `{"model":"gpt-4o","stream":true,"stream_options":null,"messages":[]}`, true},
		{"/v1/chat/completions", chatStreamUsageReq, false},
		{"/v1/completions", `{"model":"gpt-3.5-turbo-instruct","stream":true,"prompt":"x"}`, true},
		{"/v1/responses", responsesStreamReq, false},
	} {
		tr := &trip{r: r}
		tr.c = r.classify("POST", c.path, http.Header{}, []byte(c.body))
		got, ok := tr.injectStreamUsage([]byte(c.body))
		assert.Equal(t, c.inject, ok, c.body)
		if c.inject {
			assert.True(t, gjson.GetBytes(got, "stream_options.include_usage").Bool())
			assert.Equal(t, gjson.Get(c.body, "messages").Raw, gjson.GetBytes(got, "messages").Raw)
		} else {
			assert.Equal(t, c.body, string(got))
		}
	}
}

func TestOutHeader(t *testing.T) {
	r, err := New(Config{Upstreams: []Upstream{
		{Name: "keyed", BaseURL: "http://a.test/v1", APIKey: "sk-up", Header: http.Header{"x-extra": {"1", "2"}, "Openai-Organization": {"org-up"}}},
		{Name: "open", BaseURL: "http://b.test/v1"},
	}})
	require.NoError(t, err)
	in := http.Header{
		"Authorization":       {"Bearer caller"},
		"Accept-Encoding":     {"gzip"},
		"Openai-Organization": {"org-caller"},
		"X-Trace":             {"t1", "t2"},
		"X-Empty":             nil,
	}
	orig := in.Clone()
	keyed := outHeader(in, r.ups[0])
	assert.Equal(t, http.Header{
		"Authorization":       {"Bearer sk-up"},
		"Openai-Organization": {"org-up"},
		"X-Extra":             {"1", "2"},
		"X-Trace":             {"t1", "t2"},
		"X-Empty":             nil,
	}, keyed)
	open := outHeader(in, r.ups[1])
	assert.Equal(t, http.Header{
		"Authorization":       {"Bearer caller"}, // no key: the caller's
		"Openai-Organization": {"org-caller"},
		"X-Trace":             {"t1", "t2"},
		"X-Empty":             nil,
	}, open)
	// A Base that adds values touches neither the caller's header, nor the
	// upstream's configuration, nor the header's other keys.
	for _, h := range []http.Header{keyed, open} {
		for k := range h {
			h.Add(k, "added")
		}
	}
	assert.Equal(t, orig, in)
	assert.Equal(t, []string{"1", "2"}, r.ups[0].cfg.Header["X-Extra"])
	assert.Equal(t, []string{"t1", "t2", "added"}, keyed["X-Trace"])
	assert.Equal(t, []string{"Bearer sk-up", "added"}, keyed["Authorization"])
	assert.Nil(t, outHeader(nil, r.ups[1])["Authorization"])
	assert.Empty(t, outHeader(nil, r.ups[1]))
}

func TestOutgoingBodyRereads(t *testing.T) {
	rb := &reqBody{b: []byte("abc")}
	rb.Reset(rb.b)
	got, err := io.ReadAll(rb)
	require.NoError(t, err)
	assert.Equal(t, "abc", string(got))
	again, err := rb.again()
	require.NoError(t, err)
	got, err = io.ReadAll(again)
	require.NoError(t, err)
	assert.Equal(t, "abc", string(got), "GetBody starts over")
	assert.NoError(t, again.Close())
}

func TestResponseHeaderNamesAreCanonical(t *testing.T) {
	// finalize sets them without canonicalizing.
	for _, k := range []string{HeaderModel, HeaderUpstream, HeaderPromptTokens} {
		assert.Equal(t, http.CanonicalHeaderKey(k), k)
	}
}
