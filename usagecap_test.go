package relay

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// capRouter is a router whose Base answers with usage, at prices of $1 a
// token in and out, with a budget so that each request's charge shows in
// Spend.
func capRouter(t *testing.T, base http.RoundTripper) (*Router, *reports) {
	return newTestRouter(t, Config{Base: base, Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
		Prices:  map[string]Price{"m": {InputPerMTok: 1e6, OutputPerMTok: 1e6}},
		Budgets: []Budget{{Name: "all", Limit: 1e9, Window: Window{Every: time.Hour}}}})
}

// usageAnswer is a Base answering every call with a JSON body whose usage
// is the one given.
func usageAnswer(usage string) roundTripFunc {
	return func(req *http.Request) (*http.Response, error) {
		io.Copy(io.Discard, req.Body)
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
			Body: io.NopCloser(strings.NewReader(`{"choices":[],"usage":` + usage + `}`)), Request: req}, nil
	}
}

// One usage report of 1e30 completion tokens, for a request that allowed
// max_tokens × n: the costs and the budget are charged the bound, the
// report keeps the upstream's figure (clamped) and says it was capped.
func TestImplausibleUsageChargedAtTheBound(t *testing.T) {
	cases := []struct {
		name       string
		fields     string // the request's max tokens and choices
		usage      string
		completion int // billed
		capped     bool
	}{
		{"1e30 over max_tokens", `"max_tokens":10`, `{"prompt_tokens":8,"completion_tokens":1e30}`, 10, true},
		{"over max_completion_tokens", `"max_completion_tokens":10`, `{"prompt_tokens":8,"completion_tokens":11}`, 10, true},
		{"at the bound", `"max_tokens":10`, `{"prompt_tokens":8,"completion_tokens":10}`, 10, false},
		{"n choices", `"max_tokens":10,"n":3`, `{"prompt_tokens":8,"completion_tokens":30}`, 30, false},
		{"over n choices", `"max_tokens":10,"n":3`, `{"prompt_tokens":8,"completion_tokens":31}`, 30, true},
		{"reasoning over", `"max_completion_tokens":10`, `{"prompt_tokens":8,"completion_tokens":500,"completion_tokens_details":{"reasoning_tokens":400}}`, 10, true},
		{"no max tokens", ``, `{"prompt_tokens":8,"completion_tokens":1e30}`, maxUsageTokens, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, reps := capRouter(t, usageAnswer(c.usage))
			body := `{"model":"m",` + c.fields + `,"messages":[{"role":"user","content":"hi"}]}`
			if c.fields == "" {
				body = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
			}
			resp, _ := do(t, r, "POST", "http://relay/v1/chat/completions", body)
			require.Equal(t, 200, resp.StatusCode)
			rep := reps.all()[0]
			assert.Equal(t, c.capped, rep.UsageCapped)
			assert.InDelta(t, float64(8+c.completion), rep.CostUSD, 1e-6, "billed: 8 prompt tokens and %d completion tokens", c.completion)
			assert.InDelta(t, rep.CostUSD, rep.ListCostUSD, 1e-9)
			want, _ := parseUsage([]byte(`{"usage":` + c.usage + `}`))
			assert.Equal(t, want, rep.Usage, "the report keeps the upstream's figures")
			spend := r.Spend()
			require.Len(t, spend, 1)
			assert.InDelta(t, float64(8+c.completion), spend[0].Spent, 1e-6, "the budget is charged what the report costs")
		})
	}
}

// A stream's usage chunk is capped the same way.
func TestImplausibleStreamUsageChargedAtTheBound(t *testing.T) {
	stream := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":8,\"completion_tokens\":100000000}}\n\n" +
		"data: [DONE]\n\n"
	r, reps := bodyRouter(t, Config{Prices: map[string]Price{"m": {InputPerMTok: 1e6, OutputPerMTok: 1e6}}},
		func() io.Reader { return strings.NewReader(stream) })
	resp, _ := do(t, r, "POST", "http://relay/v1/chat/completions",
		`{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":10,"messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, 200, resp.StatusCode)
	rep := reps.all()[0]
	assert.True(t, rep.UsageCapped)
	assert.Equal(t, 100000000, rep.Usage.CompletionTokens, "as reported")
	assert.InDelta(t, 18.0, rep.CostUSD, 1e-6)
}

// A completions request with best_of makes and bills best_of completions:
// its bound is max_tokens × best_of.
func TestBestOfRaisesTheBound(t *testing.T) {
	for _, c := range []struct {
		completion int
		capped     bool
	}{{50, false}, {51, true}} {
		r, reps := capRouter(t, usageAnswer(fmt.Sprintf(`{"prompt_tokens":8,"completion_tokens":%d}`, c.completion)))
		do(t, r, "POST", "http://relay/v1/completions", `{"model":"m","prompt":"hi","max_tokens":10,"n":2,"best_of":5}`)
		rep := reps.all()[0]
		assert.Equal(t, c.capped, rep.UsageCapped, "completion %d", c.completion)
		assert.InDelta(t, float64(8+min(c.completion, 50)), rep.CostUSD, 1e-6)
	}
}

// A hedge's losing answer with implausible usage is billed at the
// request's bound too, and flagged.
func TestImplausibleHedgeLoserUsageCapped(t *testing.T) {
	h := newRaceHarness(t)
	h.tr.c.req = Request{Endpoint: EndpointChat, Model: "m", MaxTokens: 10, Header: http.Header{}, Budget: noBudgets{}}
	js := func() http.Header { return http.Header{"Content-Type": {"application/json"}} }
	h.race(t, answered(h.r.ups[0], 200, js(), io.NopCloser(strings.NewReader(`{"usage":{"prompt_tokens":3,"completion_tokens":4}}`)), 0),
		answered(h.r.ups[1], 200, js(), io.NopCloser(strings.NewReader(`{"usage":{"prompt_tokens":3,"completion_tokens":1e30}}`)), 1))
	rep := h.report(t)
	assert.True(t, rep.UsageCapped)
	assert.Equal(t, maxUsageTokens, rep.HedgeUsage.CompletionTokens, "as reported (clamped)")
	assert.InDelta(t, 7.0+13.0, rep.ListCostUSD, 1e-6, "the winner's 7 tokens and the loser's 3 + 10")
}
