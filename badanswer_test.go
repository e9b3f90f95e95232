package relay

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/tokenrelay/relay/relaytest"
)

const (
	chatPlainReq      = `{"model":"gpt-4o","messages":[{"role":"user","content":"Hi"}]}`
	responsesPlainReq = `{"model":"gpt-4o","input":"Hi"}`
)

// badAnswerRouter routes gpt-4o to upstream "a" and the fallback models
// gpt-4.1 and gpt-5 to "b", with BadAnswerFallbacks set to them.
func badAnswerRouter(t *testing.T, fleet *relaytest.Fleet, tee *teeBase, log *attemptLog, cfg Config) (*Router, *reports) {
	cfg.Upstreams = []Upstream{
		{Name: "a", BaseURL: fleet.Get("a").URL, Models: []string{"gpt-4o"}},
		{Name: "b", BaseURL: fleet.Get("b").URL, Models: []string{"gpt-4.1", "gpt-5"}},
	}
	if cfg.Retry.BadAnswerFallbacks == nil {
		cfg.Retry.BadAnswerFallbacks = []string{"gpt-4.1", "gpt-5"}
	}
	cfg.Base, cfg.Hooks = tee, log.hooks()
	return newTestRouter(t, cfg)
}

// TestBadAnswerFallback: a 2xx answer a content filter stopped, or with no
// output, is retried at once on the next BadAnswerFallbacks model, plain
// or streamed (before its first content); the report says why, names the
// model that answered, and bills the answer set aside. (Before, the bad
// answer was the caller's.)
func TestBadAnswerFallback(t *testing.T) {
	for _, c := range []struct {
		name, path, req string
		fault           relaytest.Fault
		want            string
	}{
		{"chat content filter", "chat/completions", chatPlainReq, relaytest.Fault{ContentFilter: true}, BadAnswerContentFilter},
		{"chat empty", "chat/completions", chatPlainReq, relaytest.Fault{Empty: true}, BadAnswerEmpty},
		{"responses content filter", "responses", responsesPlainReq, relaytest.Fault{ContentFilter: true}, BadAnswerContentFilter},
		{"responses empty", "responses", responsesPlainReq, relaytest.Fault{Empty: true}, BadAnswerEmpty},
		{"completions empty", "completions", `{"model":"gpt-4o","prompt":"Hi"}`, relaytest.Fault{Empty: true}, BadAnswerEmpty},
		{"chat stream content filter", "chat/completions", chatStreamUsageReq, relaytest.Fault{ContentFilter: true}, BadAnswerContentFilter},
		{"chat stream content filter, usage injected", "chat/completions", chatStreamReq, relaytest.Fault{ContentFilter: true}, BadAnswerContentFilter},
		{"chat stream empty", "chat/completions", chatStreamUsageReq, relaytest.Fault{Empty: true}, BadAnswerEmpty},
		{"responses stream content filter", "responses", responsesStreamReq, relaytest.Fault{ContentFilter: true}, BadAnswerContentFilter},
		{"responses stream empty", "responses", responsesStreamReq, relaytest.Fault{Empty: true}, BadAnswerEmpty},
	} {
		t.Run(c.name, func(t *testing.T) {
			run := runFleet(t, c.fault, c.path, c.req, badAnswerRouter)
			assert.Equal(t, "gpt-4.1", run.header.Get(HeaderModel))
			assert.Equal(t, run.want, run.got)
			log, fleet := run.log, run.fleet
			rep := run.reps.all()[0]
			assert.NoError(t, rep.Err)
			assert.Equal(t, c.want, rep.BadAnswer)
			assert.Equal(t, "gpt-4.1", rep.Model)
			assert.Equal(t, "b", rep.Upstream)
			assert.Equal(t, 2, rep.Attempts)
			assert.Equal(t, relaytest.DefaultCompletionTokens, rep.Usage.CompletionTokens)
			assert.Equal(t, relaytest.DefaultCompletionTokens, rep.HedgeUsage.CompletionTokens, "the answer set aside was billed")
			assert.False(t, rep.HedgeUsage.Estimated)
			infos, _ := log.all()
			require.Len(t, infos, 2)
			assert.Equal(t, c.want, infos[1].Retry)
			assert.Equal(t, "gpt-4.1", infos[1].Model)
			assert.Zero(t, infos[1].Backoff)
			assert.Equal(t, "gpt-4.1", gjson.GetBytes(fleet.Get("b").Requests()[0].Body, "model").Str)
		})
	}
}

// TestBadAnswerOffByDefault: without BadAnswerFallbacks, a bad answer is
// the caller's, and not looked into.
func TestBadAnswerOffByDefault(t *testing.T) {
	fleet := relaytest.NewFleet([]string{"a", "b"})
	defer fleet.Close()
	fleet.Get("a").Script(relaytest.Fault{ContentFilter: true}, relaytest.Fault{ContentFilter: true})
	tee, log := newTeeBase(t), &attemptLog{}
	r, reps := badAnswerRouter(t, fleet, tee, log, Config{Retry: RetryConfig{BadAnswerFallbacks: []string{}}})
	for _, req := range []string{chatPlainReq, chatStreamUsageReq} {
		got, err := stream(t, r, "chat/completions", req)
		require.NoError(t, err)
		assert.Contains(t, string(got), "content_filter")
	}
	for _, rep := range reps.all() {
		assert.Equal(t, 1, rep.Attempts)
		assert.Empty(t, rep.BadAnswer)
	}
	assert.Equal(t, 0, fleet.Get("b").Calls())
}

// TestBadAnswerChain: each bad answer moves to the model after the one that
// answered; the last one's bad answer is the caller's.
func TestBadAnswerChain(t *testing.T) {
	fleet := relaytest.NewFleet([]string{"a", "b"})
	defer fleet.Close()
	fleet.Get("a").Script(relaytest.Fault{Empty: true})
	fleet.Get("b").Script(relaytest.Fault{ContentFilter: true}, relaytest.Fault{ContentFilter: true})
	tee, log := newTeeBase(t), &attemptLog{}
	r, reps := badAnswerRouter(t, fleet, tee, log, Config{})
	got, err := stream(t, r, "chat/completions", chatPlainReq)
	require.NoError(t, err)
	assert.Equal(t, tee.body(2), string(got))
	rep := reps.all()[0]
	assert.Equal(t, "gpt-5", rep.Model)
	assert.Equal(t, BadAnswerEmpty, rep.BadAnswer, "the first answer set aside")
	assert.Equal(t, 3, rep.Attempts)
	assert.Equal(t, 2*relaytest.DefaultCompletionTokens, rep.HedgeUsage.CompletionTokens)
	infos, _ := log.all()
	assert.Equal(t, []string{"gpt-4o", "gpt-4.1", "gpt-5"}, []string{infos[0].Model, infos[1].Model, infos[2].Model})
}

// TestBadAnswerKeptWhenFallbackFails: when the fallback model fails, the
// bad answer set aside is returned, whole, and only it is billed.
func TestBadAnswerKeptWhenFallbackFails(t *testing.T) {
	for _, req := range []string{chatPlainReq, chatStreamUsageReq} {
		fleet := relaytest.NewFleet([]string{"a", "b"})
		fleet.Get("a").Script(relaytest.Fault{ContentFilter: true})
		fleet.Get("b").SetDefault(relaytest.Fault{Status: 503})
		tee, log := newTeeBase(t), &attemptLog{}
		r, reps := badAnswerRouter(t, fleet, tee, log, Config{Retry: RetryConfig{Backoff: func(int) time.Duration { return 0 }}})
		got, err := stream(t, r, "chat/completions", req)
		require.NoError(t, err)
		assert.Equal(t, tee.body(0), string(got))
		rep := reps.all()[0]
		assert.NoError(t, rep.Err)
		assert.Equal(t, 200, rep.StatusCode)
		assert.Equal(t, "gpt-4o", rep.Model)
		assert.Equal(t, BadAnswerContentFilter, rep.BadAnswer)
		assert.Equal(t, 3, rep.Attempts)
		assert.Equal(t, relaytest.DefaultCompletionTokens, rep.Usage.CompletionTokens)
		assert.Zero(t, rep.HedgeUsage)
		fleet.Close()
	}
}

// TestBadAnswerNotJudgedUnlessWhole: a plain answer is judged only when its
// body came whole within 1 MiB: a longer one passes as it is, unread by
// the router before the caller reads it.
func TestBadAnswerNotJudgedUnlessWhole(t *testing.T) {
	long := `{"choices":[{"index":0,"message":{"role":"assistant","content":""},"finish_reason":"content_filter"}],"pad":"` + strings.Repeat("x", badAnswerMax) + `"}`
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, long)
	}))
	defer up.Close()
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL + "/v1"}},
		Retry: RetryConfig{BadAnswerFallbacks: []string{"gpt-4.1"}}})
	got, err := stream(t, r, "chat/completions", chatPlainReq)
	require.NoError(t, err)
	assert.Equal(t, long, string(got))
	assert.Equal(t, 1, reps.all()[0].Attempts)
	assert.Empty(t, reps.all()[0].BadAnswer)
}

// TestBadJSON: what makes a whole JSON answer bad.
func TestBadJSON(t *testing.T) {
	for _, c := range []struct {
		endpoint, body string
		want           badReason
	}{
		{EndpointChat, `{"choices":[{"message":{"content":"Hi"},"finish_reason":"stop"}]}`, badNone},
		{EndpointChat, `{"choices":[{"message":{"content":"partial"},"finish_reason":"content_filter"}]}`, badFilter},
		{EndpointChat, `{"choices":[{"message":{"content":null},"finish_reason":"content_filter"}]}`, badFilter},
		{EndpointChat, `{"choices":[{"message":{"content":""},"finish_reason":"stop"}]}`, badEmpty},
		{EndpointChat, `{"choices":[]}`, badEmpty},
		{EndpointChat, `{"choices":[{"message":{"content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}`, badNone},
		{EndpointChat, `{"choices":[{"message":{"content":null,"refusal":"I can't."},"finish_reason":"stop"}]}`, badNone},
		{EndpointChat, `{"choices":[{"message":{"content":""}},{"message":{"content":"x"}}]}`, badNone},
		{EndpointChat, `not json`, badNone},
		{EndpointChat, `[1,2]`, badNone},
		{EndpointCompletions, `{"choices":[{"text":"","finish_reason":"stop"}]}`, badEmpty},
		{EndpointCompletions, `{"choices":[{"text":"x","finish_reason":"content_filter"}]}`, badFilter},
		{EndpointResponses, `{"status":"incomplete","incomplete_details":{"reason":"content_filter"},"output":[]}`, badFilter},
		{EndpointResponses, `{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[{"type":"reasoning","summary":[]}]}`, badEmpty},
		{EndpointResponses, `{"status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"Hi"}]}]}`, badNone},
		{EndpointResponses, `{"status":"completed","output":[{"type":"function_call","name":"f","arguments":"{}"}]}`, badNone},
		{EndpointResponses, `{"status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":""}]}]}`, badEmpty},
	} {
		assert.Equal(t, c.want, badJSON(c.endpoint, []byte(c.body)), "%s %s", c.endpoint, c.body)
	}
}

// TestBadAnswerFallbacksChecked: New refuses a BadAnswerFallbacks model no
// upstream serves, and an empty name.
func TestBadAnswerFallbacksChecked(t *testing.T) {
	_, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.invalid", Models: []string{"gpt-4o"}}},
		Retry: RetryConfig{BadAnswerFallbacks: []string{"gpt-4.1", ""}}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `Retry.BadAnswerFallbacks[0] "gpt-4.1" is served by no upstream`)
	assert.Contains(t, err.Error(), `Retry.BadAnswerFallbacks[1] "" is empty`)
}
