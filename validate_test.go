package relay

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay/relaytest"
)

// validKey is the key of the upstreams the mistakes below sit beside; no
// error may contain it, nor the bad keys.
const validKey = "sk-live-VALIDKEY-0123456789"

// TestNewRefusesMistakes: each mistake New used to let through is refused,
// and the error names the field and the bad value, and no key.
func TestNewRefusesMistakes(t *testing.T) {
	listed := func(models ...string) []Upstream {
		return []Upstream{
			{Name: "a", BaseURL: "https://a.example/v1", APIKey: validKey, Models: models},
			{Name: "b", BaseURL: "https://b.example/v1", APIKey: validKey, Models: []string{"gpt-4.1"}},
		}
	}
	daily := func(b Budget) []Budget {
		b.Name, b.Limit, b.Window = "daily", 0.000001, Window{Every: 24 * time.Hour}
		return []Budget{b}
	}
	prices := map[string]Price{"gpt-4.1": {InputPerMTok: 2, OutputPerMTok: 8}, "gpt-4.1-mini": {InputPerMTok: 0.4, OutputPerMTok: 1.6}}
	withKey := func(key string) []Upstream {
		return []Upstream{{Name: "a", BaseURL: "https://a.example/v1", APIKey: key}}
	}
	withURL := func(url string) []Upstream {
		return []Upstream{{Name: "a", BaseURL: url, APIKey: validKey}}
	}
	cases := []struct {
		name string
		cfg  Config
		want []string // each in the error
		key  string   // a bad key the error must not contain
	}{
		// A budget must be able to count what it covers.
		{"budget, empty prices", Config{Upstreams: listed("gpt-4.1"), Prices: map[string]Price{}, Budgets: daily(Budget{})},
			[]string{`Budgets[0] ("daily")`, "Prices is empty", "UnpricedPrice"}, ""},
		{"budget, model without price", Config{Upstreams: listed("my-finetune"), Prices: prices, Budgets: daily(Budget{})},
			[]string{`Budgets[0] ("daily")`, `model "my-finetune"`, "no price", "UnpricedPrice"}, ""},
		{"budget, downgrade without price", Config{Upstreams: listed("gpt-4.1", "mini-ft"), Prices: prices, Budgets: daily(Budget{Downgrade: "mini-ft"})},
			[]string{`Budgets[0] ("daily")`, `model "mini-ft"`}, ""},
		{"budget, policy model without price", Config{Upstreams: []Upstream{{Name: "a", BaseURL: "https://a.example/v1"}}, Prices: prices,
			Policy: ClusterPolicy{Cheap: "my-finetune"}, Budgets: daily(Budget{})},
			[]string{`Budgets[0] ("daily")`, `model "my-finetune"`}, ""},
		{"budget, bad unpriced price", Config{Upstreams: listed("gpt-4.1"), Prices: prices, Budgets: daily(Budget{UnpricedPrice: &Price{OutputPerMTok: -1}})},
			[]string{`Budgets[0] ("daily").UnpricedPrice`, "OutputPerMTok -1"}, ""},

		// Model names no upstream serves, while every upstream lists its models.
		{"policy fast typo", Config{Upstreams: listed("gpt-4.1-mini"), Policy: ClusterPolicy{Fast: "gpt-4.1-mnii"}},
			[]string{`Policy (ClusterPolicy).Fast "gpt-4.1-mnii"`, "served by no upstream"}, ""},
		{"policy cheap typo, pointer", Config{Upstreams: listed("gpt-4.1-mini"), Policy: &ClusterPolicy{Cheap: "gpt-41-mini"}},
			[]string{`Policy (ClusterPolicy).Cheap "gpt-41-mini"`}, ""},
		{"policy fallback typo", Config{Upstreams: listed("gpt-4.1-mini"), Policy: ClusterPolicy{Fallbacks: []string{"gpt-4.1-mini", "gpt4.1"}}},
			[]string{`Policy (ClusterPolicy).Fallbacks[1] "gpt4.1"`}, ""},
		{"downgrade typo", Config{Upstreams: listed("gpt-4.1-mini"), Prices: prices, Budgets: daily(Budget{Downgrade: "gpt-4.1-mnii", UnpricedPrice: &Price{}})},
			[]string{`Budgets[0] ("daily").Downgrade "gpt-4.1-mnii"`, "served by no upstream"}, ""},
		{"context fallback typo", Config{Upstreams: listed("gpt-4.1-mini"), ContextFallbacks: []string{"gpt-4.1", "gpt-5-typo"}},
			[]string{`ContextFallbacks[1] "gpt-5-typo"`}, ""},

		// Keys the router cannot send as meant.
		{"bearer prefix", Config{Upstreams: withKey("Bearer sk-live-BADKEY-111")},
			[]string{`upstream "a"`, "APIKey", `starts with "Bearer "`}, "sk-live-BADKEY-111"},
		{"bearer prefix, lower case", Config{Upstreams: withKey("bearer sk-live-BADKEY-222")},
			[]string{`upstream "a"`, "APIKey", `starts with "Bearer "`}, "sk-live-BADKEY-222"},
		{"key with newline", Config{Upstreams: withKey("sk-live-BADKEY-333\n")},
			[]string{`upstream "a"`, "APIKey", "white space"}, "sk-live-BADKEY-333"},
		{"key with leading space", Config{Upstreams: withKey(" sk-live-BADKEY-444")},
			[]string{`upstream "a"`, "APIKey", "white space"}, "sk-live-BADKEY-444"},
		{"key with inner control", Config{Upstreams: withKey("sk-live-BAD\x00KEY-555")},
			[]string{`upstream "a"`, "APIKey", "control character"}, "KEY-555"},
		{"header value with CRLF", Config{Upstreams: []Upstream{{Name: "a", BaseURL: "https://a.example/v1",
			Header: http.Header{"Api-Key": {"sk-live-BADKEY-666\r\n"}}}}},
			[]string{`upstream "a"`, `Header "Api-Key"`, "control character"}, "sk-live-BADKEY-666"},
		{"header name", Config{Upstreams: []Upstream{{Name: "a", BaseURL: "https://a.example/v1", Header: http.Header{"X Team": {"t"}}}}},
			[]string{`upstream "a"`, `Header name "X Team"`}, ""},

		// A BaseURL that already ends in an endpoint.
		{"base url with chat endpoint", Config{Upstreams: withURL("https://api.example.com/v1/chat/completions")},
			[]string{`upstream "a"`, `BaseURL "https://api.example.com/v1/chat/completions"`, `endpoint "/chat/completions"`, `"https://api.example.com/v1"`}, ""},
		{"base url with embeddings endpoint and slash", Config{Upstreams: withURL("https://api.example.com/v1/embeddings/")},
			[]string{`BaseURL "https://api.example.com/v1/embeddings/"`, `endpoint "/embeddings"`}, ""},
		{"base url with responses endpoint and query key", Config{Upstreams: withURL("https://x.example/openai/responses?api-key=sk-live-BADKEY-777")},
			[]string{`BaseURL "https://x.example/openai/responses?api-key=redacted"`, `endpoint "/responses"`, `"https://x.example/openai?api-key=redacted"`}, "sk-live-BADKEY-777"},

		// Only the fields that are wrong are named.
		{"negative tpm", Config{Upstreams: []Upstream{{Name: "a", BaseURL: "https://a.example/v1", TPM: -7}}},
			[]string{`upstream "a": TPM -7 is negative`}, ""},
		{"negative bucket", Config{Upstreams: withKey(validKey), Buckets: Buckets{Long: -2}},
			[]string{"Buckets.Long -2 is negative"}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(c.cfg)
			require.Error(t, err)
			msg := err.Error()
			for _, w := range c.want {
				assert.Contains(t, msg, w)
			}
			assert.NotContains(t, msg, validKey)
			if c.key != "" {
				assert.NotContains(t, msg, c.key)
			}
			for _, line := range strings.Split(msg, "\n") {
				assert.True(t, strings.HasPrefix(line, "relay: "), line)
			}
		})
	}
}

// TestNewNamesOnlyWrongFields: a negative RPM is named alone, not with the
// fields beside it that are fine.
func TestNewNamesOnlyWrongFields(t *testing.T) {
	_, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "https://a.example/v1", RPM: -1, TPM: 100, Weight: 2}}})
	require.Error(t, err)
	assert.Equal(t, `relay: upstream "a": RPM -1 is negative`, err.Error())
	_, err = New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "https://a.example/v1"}}, Buckets: Buckets{Mid: -1, Long: 300}})
	require.Error(t, err)
	assert.Equal(t, "relay: Buckets.Mid -1 is negative", err.Error())
}

// TestNewAcceptsWhatIsRight: the checks refuse nothing that works.
func TestNewAcceptsWhatIsRight(t *testing.T) {
	prices := map[string]Price{"gpt-4.1": {InputPerMTok: 2, OutputPerMTok: 8}}
	day := Window{Every: 24 * time.Hour}
	cases := []struct {
		name string
		cfg  Config
	}{
		// An upstream with no Models serves every model: no name is a typo.
		{"open upstream", Config{Upstreams: []Upstream{
			{Name: "a", BaseURL: "https://a.example/v1", Models: []string{"gpt-4.1"}},
			{Name: "b", BaseURL: "https://b.example/v1"},
		}, Policy: ClusterPolicy{Fast: "anything", Cheap: "else"}, ContextFallbacks: []string{"more"}}},
		{"served names", Config{Upstreams: []Upstream{{Name: "a", BaseURL: "https://a.example/v1", Models: []string{"gpt-4.1", "gpt-4.1-mini"}}},
			Policy: &ClusterPolicy{Fast: "gpt-4.1-mini", Fallbacks: []string{"gpt-4.1"}}, ContextFallbacks: []string{"gpt-4.1"}}},
		{"budget over priced models", Config{Upstreams: []Upstream{{Name: "a", BaseURL: "https://a.example/v1", Models: []string{"gpt-4.1"}}},
			Prices: prices, Budgets: []Budget{{Name: "d", Limit: 1, Window: day}}}},
		{"budget counts unpriced as free", Config{Upstreams: []Upstream{{Name: "a", BaseURL: "https://a.example/v1", Models: []string{"my-finetune"}}},
			Prices: map[string]Price{}, Budgets: []Budget{{Name: "d", Limit: 1, Window: day, UnpricedPrice: &Price{}}}}},
		{"budget scope leaves the unpriced model out", Config{Upstreams: []Upstream{
			{Name: "a", BaseURL: "https://a.example/v1", Models: []string{"gpt-4.1"}},
			{Name: "ft", BaseURL: "https://ft.example/v1", Models: []string{"my-finetune"}},
		}, Prices: prices, Budgets: []Budget{
			{Name: "m", Limit: 1, Window: day, Scope: PerModel("gpt-4.1")},
			{Name: "u", Limit: 1, Window: day, Scope: PerUpstream("a")},
		}}},
		{"key with a prefix of its own", Config{Upstreams: []Upstream{{Name: "a", BaseURL: "https://a.example/v1", APIKey: "Bearer_is_not_a_prefix-123"}}}},
		{"base url that merely contains an endpoint word", Config{Upstreams: []Upstream{{Name: "a", BaseURL: "https://completions.example/v1/chat"}}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(c.cfg)
			assert.NoError(t, err)
		})
	}
}

// TestPolicyRouteToUnservedModelRefused: a Policy that routes a request to
// a model no upstream serves (every upstream lists its models) gets the
// request refused with ErrNoUpstream naming that model, rather than
// quietly served by its fallback; no upstream is called.
func TestPolicyRouteToUnservedModelRefused(t *testing.T) {
	srv := relaytest.NewServer()
	defer srv.Close()
	pol := PolicyFunc(func(q Request) Route {
		return Route{Model: "gpt-4.1-mnii", Fallbacks: []string{q.Model}}
	})
	r, reps := newTestRouter(t, Config{Policy: pol,
		Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL, Models: []string{"gpt-4.1"}}}})
	req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "hi")))
	resp, err := r.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
	}
	require.ErrorIs(t, err, ErrNoUpstream)
	assert.Contains(t, err.Error(), `"gpt-4.1-mnii"`)
	assert.Contains(t, err.Error(), "policy")
	assert.Zero(t, srv.Calls())
	require.Len(t, reps.all(), 1)
	assert.ErrorIs(t, reps.all()[0].Err, ErrNoUpstream)
	assert.Equal(t, "gpt-4.1-mnii", reps.all()[0].Model)

	// Decide says the same.
	req, _ = http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "hi")))
	_, err = r.Decide(req)
	assert.ErrorIs(t, err, ErrNoUpstream)

	// An upstream that lists no models serves every model: the route goes
	// out as the policy chose.
	r2, _ := newTestRouter(t, Config{Policy: pol, Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL}}})
	_, _ = do(t, r2, "POST", "http://relay/v1/chat/completions", chatBody("gpt-4.1", "hi"))
	require.Equal(t, 1, srv.Calls())
	assert.Equal(t, "gpt-4.1-mnii", srv.Requests()[0].Model)
}

// TestBudgetUnpricedModel: a budget refuses a request to a model without
// a price unless it has an UnpricedPrice, at which it reserves and charges
// it then; &Price{} lets it through uncounted.
func TestBudgetUnpricedModel(t *testing.T) {
	srv := relaytest.NewServer(relaytest.WithCompletionTokens(10))
	defer srv.Close()
	prices := map[string]Price{"gpt-4.1": {InputPerMTok: 2, OutputPerMTok: 8}}
	var reps *reports
	router := func(unpriced *Price) *Router {
		var r *Router
		r, reps = newTestRouter(t, Config{Prices: prices, Retry: RetryConfig{MaxAttempts: 1},
			Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL}}, // every model: New cannot list them
			Budgets:   []Budget{{Name: "daily", Limit: 10000, Window: Window{Every: 24 * time.Hour}, UnpricedPrice: unpriced}}})
		return r
	}
	send := func(r *Router) error {
		req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("my-finetune", "hi")))
		resp, err := r.RoundTrip(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return err
	}

	// No UnpricedPrice: refused, naming the model, no upstream called.
	err := send(router(nil))
	require.ErrorIs(t, err, ErrBudgetExceeded)
	var e *Error
	require.True(t, errors.As(err, &e))
	assert.Equal(t, "daily", e.Budget)
	assert.Contains(t, err.Error(), `model "my-finetune" has no price`)
	assert.Zero(t, srv.Calls())

	// An UnpricedPrice of $1 per token is charged for the usage.
	r := router(&Price{InputPerMTok: 1e6, OutputPerMTok: 1e6})
	require.NoError(t, send(r))
	require.Equal(t, 1, srv.Calls())
	spend := r.Spend()
	require.Len(t, spend, 1)
	rep := reps.all()[0]
	assert.Equal(t, 10, rep.Usage.CompletionTokens)
	assert.InDelta(t, float64(rep.Usage.PromptTokens+rep.Usage.CompletionTokens), spend[0].Spent, 1e-6, "each token at $1")
	assert.Zero(t, spend[0].Reserved)
	assert.False(t, rep.Priced)
	assert.Zero(t, rep.CostUSD, "the report does not guess the model's price")

	// &Price{}: through, uncounted.
	r = router(&Price{})
	require.NoError(t, send(r))
	assert.Zero(t, r.Spend()[0].Spent)
}

// TestUnsendableHeaderNotRetried: a caller's header that HTTP cannot carry
// (a key read with its newline) fails at once, as ErrInvalidHeader, without
// the retries and backoffs of an error that can never succeed.
func TestUnsendableHeaderNotRetried(t *testing.T) {
	srv := relaytest.NewServer()
	defer srv.Close()
	clock := newAutoClock()
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	r, reps := newTestRouter(t, Config{Base: base, Clock: clock, Upstreams: []Upstream{
		{Name: "a", BaseURL: srv.URL}, {Name: "b", BaseURL: srv.URL},
	}})
	req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "hi")))
	req.Header["Authorization"] = []string{"Bearer sk-live-CALLERKEY-42\n"}
	resp, err := r.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
	}
	require.ErrorIs(t, err, ErrInvalidHeader)
	assert.Contains(t, err.Error(), `"Authorization"`)
	assert.NotContains(t, err.Error(), "CALLERKEY")
	assert.Empty(t, clock.Waits(), "no backoff")
	require.Len(t, reps.all(), 1)
	assert.Equal(t, 1, reps.all()[0].Attempts)
	assert.Zero(t, srv.Calls())
	assert.False(t, DefaultShouldRetry(nil, err))
}
