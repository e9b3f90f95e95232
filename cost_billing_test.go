package relay

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// billingPrompt is the content of the requests of these tests: some 60
// tokens, as the router counts them.
var billingPrompt = strings.Repeat("word ", 60)

// billingBody is a chat request for model with max_tokens 10 and the
// billingPrompt, extra members (`"service_tier":"priority",`) first.
func billingBody(model, extra string) string {
	return `{` + extra + `"model":"` + model + `","max_tokens":10,"messages":[{"role":"user","content":"` + billingPrompt + `"}]}`
}

// billingPromptTokens is the router's count of billingBody's prompt.
func billingPromptTokens(t *testing.T, model string) int {
	t.Helper()
	r, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}}})
	require.NoError(t, err)
	req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(billingBody(model, "")))
	d, err := r.Decide(req)
	require.NoError(t, err)
	require.Greater(t, d.Request.PromptTokens, 50)
	return d.Request.PromptTokens
}

// billingRouter is a router in front of one httptest upstream answering
// answer, with prices and one all-traffic budget of limit USD a day.
func billingRouter(t *testing.T, answer string, prices map[string]Price, limit float64) (*Router, *recorder, *reports) {
	t.Helper()
	up := newRecorder(t, 200, []byte(answer))
	cfg := Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}}, Prices: prices, Retry: RetryConfig{MaxAttempts: 1}}
	if limit > 0 {
		cfg.Budgets = []Budget{{Name: "cap", Limit: limit, Window: Window{Every: time.Hour}}}
	}
	r, reps := newTestRouter(t, cfg)
	return r, up, reps
}

// A budget reserves a request whose prompt passes a long-context threshold
// at the tier's rates (LiteLLM reserved such requests at the base rates):
// with every token $1 below the tier and the tier's input $2 and output
// $3, a prompt of P tokens asking for 10 reserves 2P + 30, and settles
// at the tier too.
func TestBudgetReservesAtLongContextTier(t *testing.T) {
	p := billingPromptTokens(t, "m")
	long := func(above int) map[string]Price {
		return map[string]Price{"m": {InputPerMTok: 1e6, OutputPerMTok: 1e6,
			Tiers: []PriceTier{{AbovePromptTokens: above, InputPerMTok: 2e6, OutputPerMTok: 3e6}}}}
	}
	answer := fmt.Sprintf(`{"model":"m","usage":{"prompt_tokens":%d,"completion_tokens":10}}`, p)

	t.Run("above the threshold: refused one dollar short of the tier's worst case", func(t *testing.T) {
		r, up, _ := billingRouter(t, answer, long(p-1), float64(2*p+30-1))
		_, _, err := send(t, r, billingBody("m", ""))
		require.ErrorIs(t, err, ErrBudgetExceeded)
		assert.Empty(t, up.got(), "no upstream call")
	})
	t.Run("above the threshold: admitted at the tier's worst case, settled at the tier", func(t *testing.T) {
		r, up, reps := billingRouter(t, answer, long(p-1), float64(2*p+30))
		_, _, err := send(t, r, billingBody("m", ""))
		require.NoError(t, err)
		assert.Len(t, up.got(), 1)
		require.Len(t, reps.all(), 1)
		assert.InDelta(t, float64(2*p+30), reps.all()[0].CostUSD, 1e-6)
		spend := r.Spend()
		require.Len(t, spend, 1)
		assert.InDelta(t, float64(2*p+30), spend[0].Spent, 1e-6)
	})
	t.Run("at the threshold: base rates", func(t *testing.T) {
		r, up, _ := billingRouter(t, fmt.Sprintf(`{"model":"m","usage":{"prompt_tokens":%d,"completion_tokens":10}}`, p), long(p), float64(p+10))
		_, _, err := send(t, r, billingBody("m", ""))
		require.NoError(t, err)
		assert.Len(t, up.got(), 1)
		assert.InDelta(t, float64(p+10), r.Spend()[0].Spent, 1e-6)
	})
}

// A budget reserves at the service tier the request asks for, and settles
// at the one the response says it got.
func TestBudgetReservesAtRequestedServiceTier(t *testing.T) {
	p := billingPromptTokens(t, "m")
	prices := map[string]Price{"m": {InputPerMTok: 1e6, OutputPerMTok: 1e6,
		ServiceTiers: map[string]Price{"priority": {InputPerMTok: 2e6, OutputPerMTok: 2e6}}}}
	// Served at the standard tier: charged at base rates.
	answer := fmt.Sprintf(`{"model":"m","service_tier":"default","usage":{"prompt_tokens":%d,"completion_tokens":10}}`, p)
	priority := `"service_tier":"priority",`

	r, up, _ := billingRouter(t, answer, prices, float64(2*p+20-1))
	_, _, err := send(t, r, billingBody("m", priority))
	require.ErrorIs(t, err, ErrBudgetExceeded, "priority's worst case is 2P + 20")
	assert.Empty(t, up.got())

	r, up, reps := billingRouter(t, answer, prices, float64(2*p+20))
	_, _, err = send(t, r, billingBody("m", priority))
	require.NoError(t, err)
	assert.Len(t, up.got(), 1)
	assert.Equal(t, "default", reps.all()[0].Usage.ServiceTier)
	assert.InDelta(t, float64(p+10), r.Spend()[0].Spent, 1e-6, "settled at the tier served")

	_, _, err = send(t, r, billingBody("m", ""))
	require.NoError(t, err, "without a service tier asked for, the worst case is P + 10: it fits in what is left")
	assert.InDelta(t, float64(2*p+20), r.Spend()[0].Spent, 1e-6)
}

// The report's cost is at the service tier the response names, else at
// the one the request asked for; streams included. (No max_tokens: the
// usage is charged as reported.)
func TestReportCostAtServiceTier(t *testing.T) {
	prices := map[string]Price{"gpt-5": DefaultPrices()["gpt-5"]}
	usage := `"usage":{"prompt_tokens":10000,"completion_tokens":1000,"prompt_tokens_details":{"cached_tokens":2000}}`
	cases := []struct {
		name, answer, extra string
		tier                string // Report.Usage.ServiceTier
		micro               float64
	}{
		// 8000·0.625 + 2000·0.0625 + 1000·5.
		{"response names flex", `{"model":"gpt-5","service_tier":"flex",` + usage + `}`, "", "flex", 10_125},
		{"request asks for flex, response names none", `{"model":"gpt-5",` + usage + `}`, `"service_tier":"flex",`, "", 10_125},
		// 8000·1.25 + 2000·0.125 + 1000·10: the response says it was served at the standard tier.
		{"request asks for priority, served at default", `{"model":"gpt-5","service_tier":"default",` + usage + `}`, `"service_tier":"priority",`, "default", 20_250},
		// 8000·2.50 + 2000·0.25 + 1000·20.
		{"response names priority", `{"model":"gpt-5","service_tier":"priority",` + usage + `}`, `"service_tier":"auto",`, "priority", 40_500},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, _, reps := billingRouter(t, c.answer, prices, 0)
			_, _, err := send(t, r, `{`+c.extra+`"model":"gpt-5","messages":[{"role":"user","content":"hi"}]}`)
			require.NoError(t, err)
			rep := reps.all()[0]
			assert.Equal(t, c.tier, rep.Usage.ServiceTier)
			assert.InDelta(t, c.micro/1e6, rep.CostUSD, 1e-12)
		})
	}

	t.Run("stream", func(t *testing.T) {
		chunk := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"gpt-5","service_tier":"priority","choices":[%s]%s}` + "\n\n"
		sse := fmt.Sprintf(chunk, `{"index":0,"delta":{"content":"hi"},"finish_reason":null}`, "") +
			fmt.Sprintf(chunk, `{"index":0,"delta":{},"finish_reason":"stop"}`, "") +
			fmt.Sprintf(chunk, "", ","+usage) + "data: [DONE]\n\n"
		up := newRecorder(t, 200, []byte(sse))
		up.mu.Lock()
		up.header = http.Header{"Content-Type": {"text/event-stream"}}
		up.mu.Unlock()
		r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}}, Prices: prices})
		_, b, err := send(t, r, `{"model":"gpt-5","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`)
		require.NoError(t, err)
		assert.Equal(t, sse, string(b))
		rep := reps.all()[0]
		assert.Equal(t, "priority", rep.Usage.ServiceTier)
		assert.InDelta(t, 0.0405, rep.CostUSD, 1e-12)
	})
}

// Cache writes an OpenAI-compatible proxy reports (LiteLLM's shape, for
// Anthropic) are charged at the cache-write rate, once.
func TestReportCostOfCacheWrites(t *testing.T) {
	answer := `{"model":"claude-sonnet-4-5","usage":{"prompt_tokens":1250,"completion_tokens":30,"total_tokens":1280,` +
		`"prompt_tokens_details":{"cached_tokens":1000,"cache_creation_tokens":200},"cache_creation_input_tokens":200,"cache_read_input_tokens":1000}}`
	r, _, reps := billingRouter(t, answer, nil, 0)
	_, _, err := send(t, r, chatBody("claude-sonnet-4-5", "hi"))
	require.NoError(t, err)
	rep := reps.all()[0]
	assert.Equal(t, Usage{PromptTokens: 1250, CompletionTokens: 30, CachedTokens: 1000, CacheWriteTokens: 200}, rep.Usage)
	// 50·3 + 1000·0.30 + 200·3.75 + 30·15 = 150 + 300 + 750 + 450.
	assert.InDelta(t, 0.00165, rep.CostUSD, 1e-12)
}
