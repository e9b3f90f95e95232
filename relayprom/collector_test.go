package relayprom_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/internal/statetest"
	"github.com/tokenrelay/relay/relayprom"
	"github.com/tokenrelay/relay/relaytest"
)

var (
	durationBuckets = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}
	overheadBuckets = []float64{0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01}
	waitBuckets     = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
)

// TestPlainCall: a plain call counts one request, its billed tokens and its
// cost, one attempt, and one duration and overhead sample; every breaker
// is shown closed from the start.
func TestPlainCall(t *testing.T) {
	a := server(t, "a")
	h := newHarness(t, relay.Config{Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}}})
	h.compare(t, helpBreaker+breakerLines("a", "closed"), "relay_breaker_state")
	h.chat(t, chatBody("gpt-4.1", false))
	rep := h.report(t)
	require.NoError(t, rep.Err)
	require.Positive(t, rep.CostUSD)

	h.compare(t, helpRequests+`relay_requests_total{bucket="short",model="gpt-4.1",status="2xx",upstream="a"} 1
`+helpTokens+fmt.Sprintf(`relay_tokens_total{model="gpt-4.1",type="input",upstream="a"} %d
relay_tokens_total{model="gpt-4.1",type="output",upstream="a"} 8
relay_tokens_total{model="gpt-4.1",type="cache_read",upstream="a"} 0
relay_tokens_total{model="gpt-4.1",type="reasoning",upstream="a"} 0
`, rep.Usage.PromptTokens)+helpCost+fmt.Sprintf(`relay_cost_usd_total{model="gpt-4.1",upstream="a"} %v
`, rep.CostUSD)+helpAttempts+`relay_attempts_total{outcome="2xx",upstream="a"} 1
`+helpBreaker+breakerLines("a", "closed"),
		"relay_requests_total", "relay_errors_total", "relay_tokens_total", "relay_cost_usd_total",
		"relay_attempts_total", "relay_retries_total", "relay_breaker_state", "relay_breaker_transitions_total")
	assert.Equal(t, []histogram{{Labels: "model=gpt-4.1,upstream=a", Bounds: durationBuckets, Count: 1}},
		h.histograms(t, "relay_request_duration_seconds"))
	assert.Equal(t, []histogram{{Bounds: overheadBuckets, Count: 1}}, h.histograms(t, "relay_overhead_seconds"))
	assert.Empty(t, h.histograms(t, "relay_ttft_seconds"), "not a stream")
	assert.Empty(t, h.histograms(t, "relay_limiter_wait_seconds"))
}

// TestStreamedCall: a stream's time to first chunk is observed, and its
// usage (the chunk the router asked for) counted.
func TestStreamedCall(t *testing.T) {
	a := server(t, "a")
	a.Script(relaytest.Fault{CachedTokens: 4, ReasoningTokens: 3})
	h := newHarness(t, relay.Config{Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}}})
	h.chat(t, chatBody("gpt-4.1", true))
	rep := h.report(t)
	require.NoError(t, rep.Err)
	require.True(t, rep.Stream)
	assert.Equal(t, []histogram{{Labels: "model=gpt-4.1,upstream=a", Bounds: durationBuckets, Count: 1}},
		h.histograms(t, "relay_ttft_seconds"))
	h.compare(t, helpTokens+fmt.Sprintf(`relay_tokens_total{model="gpt-4.1",type="input",upstream="a"} %d
relay_tokens_total{model="gpt-4.1",type="output",upstream="a"} 8
relay_tokens_total{model="gpt-4.1",type="cache_read",upstream="a"} 4
relay_tokens_total{model="gpt-4.1",type="reasoning",upstream="a"} 3
`, rep.Usage.PromptTokens), "relay_tokens_total")
}

// TestRetriedCall: each upstream call counts with its outcome, the retry
// with the failed call's upstream and outcome; the request counts under the
// upstream that answered.
func TestRetriedCall(t *testing.T) {
	a, b := server(t, "a"), server(t, "b")
	a.Script(relaytest.Fault{Status: 503})
	h := newHarness(t, relay.Config{
		Strategy:  relay.StrategyPriority,
		Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}, {Name: "b", BaseURL: b.URL}},
	})
	h.chat(t, chatBody("gpt-4.1", false))
	require.Equal(t, "b", h.report(t).Upstream)
	h.compare(t, helpRequests+`relay_requests_total{bucket="short",model="gpt-4.1",status="2xx",upstream="b"} 1
`+helpAttempts+`relay_attempts_total{outcome="5xx",upstream="a"} 1
relay_attempts_total{outcome="2xx",upstream="b"} 1
`+helpRetries+`relay_retries_total{reason="5xx",upstream="a"} 1
`, "relay_requests_total", "relay_errors_total", "relay_attempts_total", "relay_retries_total")
}

// TestFailedCall: an error answer counts under its status class and error
// type; the breaker that opens shows in relay_breaker_state and
// relay_breaker_transitions_total; a call that got no response counts with
// status "none".
func TestFailedCall(t *testing.T) {
	a := server(t, "a")
	a.Script(relaytest.Fault{Status: 500}, relaytest.Fault{Status: 500})
	gone := relaytest.NewServer()
	gone.Close()
	h := newHarness(t, relay.Config{
		Strategy:  relay.StrategyPriority,
		Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}, {Name: "gone", BaseURL: gone.URL, Models: []string{"gpt-4o"}}},
		Retry:     relay.RetryConfig{MaxAttempts: 1},
		Breaker:   relay.BreakerConfig{Failures: 1},
	})
	for range 2 {
		require.Equal(t, 500, h.chat(t, chatBody("gpt-4.1", false)).StatusCode)
	}
	_, err := h.do(t, http.MethodPost, "chat/completions", chatBody("gpt-4o", false))
	require.Error(t, err)

	h.compare(t, helpRequests+`relay_requests_total{bucket="short",model="gpt-4.1",status="5xx",upstream="a"} 2
relay_requests_total{bucket="short",model="gpt-4o",status="none",upstream="gone"} 1
`+helpErrors+`relay_errors_total{model="gpt-4.1",type="500",upstream="a"} 2
relay_errors_total{model="gpt-4o",type="connection",upstream="gone"} 1
`+helpAttempts+`relay_attempts_total{outcome="5xx",upstream="a"} 2
relay_attempts_total{outcome="connection",upstream="gone"} 1
`+helpBreaker+breakerLines("a", "open")+breakerLines("gone", "closed")+helpTransitions+`relay_breaker_transitions_total{state="open",upstream="a"} 1
`, "relay_requests_total", "relay_errors_total", "relay_attempts_total",
		"relay_breaker_state", "relay_breaker_transitions_total")
}

// TestHedgedCall: a hedge that wins counts as won; the cancelled loser's
// call counts with outcome "canceled"; a hedge is not a retry.
func TestHedgedCall(t *testing.T) {
	slow, fast := server(t, "slow"), server(t, "fast")
	slow.Script(relaytest.Fault{Delay: 10 * time.Second}) // cancelled when the hedge wins
	h := newHarness(t, relay.Config{
		Strategy:  relay.StrategyPriority,
		Upstreams: []relay.Upstream{{Name: "slow", BaseURL: slow.URL}, {Name: "fast", BaseURL: fast.URL}},
		Hedge:     relay.HedgeConfig{Delay: 20 * time.Millisecond, Budget: 1},
	})
	h.chat(t, chatBody("gpt-4.1", false))
	rep := h.report(t)
	require.True(t, rep.HedgeWon)
	expected := helpHedges + `relay_hedges_total{result="lost"} 0
relay_hedges_total{result="won"} 1
` + helpAttempts + `relay_attempts_total{outcome="2xx",upstream="fast"} 1
relay_attempts_total{outcome="canceled",upstream="slow"} 1
`
	require.Eventually(t, func() bool {
		return testutil.CollectAndCompare(h.c, strings.NewReader(expected), "relay_hedges_total", "relay_attempts_total") == nil
	}, 10*time.Second, time.Millisecond, "the loser counts when its cancelled call returns")
	h.compare(t, expected, "relay_hedges_total", "relay_attempts_total", "relay_retries_total")
}

// TestLimiterWait: a wait for an upstream's limits (here the hold of its
// retry-after-ms) is observed by upstream and reason.
func TestLimiterWait(t *testing.T) {
	a := server(t, "a")
	a.Script(relaytest.Fault{Status: 429, Header: http.Header{"Retry-After-Ms": {"60"}}})
	h := newHarness(t, relay.Config{
		Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}},
		Retry:     relay.RetryConfig{MaxAttempts: 1},
	})
	require.Equal(t, 429, h.chat(t, chatBody("gpt-4.1", false)).StatusCode)
	require.Equal(t, 200, h.chat(t, chatBody("gpt-4.1", false)).StatusCode)
	assert.Equal(t, []histogram{{Labels: "reason=rate,upstream=a", Bounds: waitBuckets, Count: 1}},
		h.histograms(t, "relay_limiter_wait_seconds"))
}

// TestCardinality: upstreams, models and buckets not given to New are
// "other" (with no model learned); a missing model is "none".
func TestCardinality(t *testing.T) {
	known, unknown := server(t, "known"), server(t, "unknown")
	h := &harness{c: relayprom.New(relayprom.WithUpstreams(relay.Upstream{Name: "known", Models: []string{"gpt-4o-mini"}}),
		relayprom.WithModels("gpt-4o"), relayprom.WithBuckets("vip"), relayprom.WithModelLimit(0))}
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	r, err := relay.New(relay.Config{
		Strategy: relay.StrategyPriority,
		Upstreams: []relay.Upstream{
			{Name: "known", BaseURL: known.URL, Models: []string{"gpt-4o-mini", "gpt-4o"}},
			{Name: "unknown", BaseURL: unknown.URL},
		},
		Policy: relay.PolicyFunc(func(r relay.Request) relay.Route {
			switch r.Model {
			case "gpt-4o-mini":
				return relay.Route{Model: r.Model, Bucket: "vip"}
			case "gpt-4o":
				return relay.Route{Model: r.Model, Bucket: "batch"}
			}
			return relay.Route{Model: r.Model}
		}),
		Hooks: h.c.Hooks(),
		Base:  tr,
	})
	require.NoError(t, err)
	h.router = r
	for _, model := range []string{"gpt-4o-mini", "gpt-4o", "gpt-5", "o3-unheard-of"} {
		h.chat(t, chatBody(model, false))
	}
	_, err = h.do(t, http.MethodPost, "chat/completions", `{"messages":[{"role":"user","content":"no model"}]}`)
	require.NoError(t, err)
	h.compare(t, helpRequests+`relay_requests_total{bucket="vip",model="gpt-4o-mini",status="2xx",upstream="known"} 1
relay_requests_total{bucket="other",model="gpt-4o",status="2xx",upstream="known"} 1
relay_requests_total{bucket="short",model="other",status="2xx",upstream="other"} 2
relay_requests_total{bucket="short",model="none",status="2xx",upstream="known"} 1
`, "relay_requests_total")
	h.compare(t, helpBreaker+breakerLines("known", "closed"), "relay_breaker_state")
}

// TestReportExposition: the whole exposition of two reports, histograms
// included, fed to the hooks directly so that every duration is known.
func TestReportExposition(t *testing.T) {
	c := relayprom.New(relayprom.WithUpstreams(relay.Upstream{Name: "eu"}), relayprom.WithModels("gpt-4.1"))
	hooks := c.Hooks()
	hooks.OnReport(relay.Report{
		RequestedModel: "gpt-4.1", Model: "gpt-4.1", Upstream: "eu", Bucket: "mid", Endpoint: "chat/completions",
		Usage:   relay.Usage{PromptTokens: 300, CompletionTokens: 40, CachedTokens: 100, ReasoningTokens: 10},
		CostUSD: 0.00075, Priced: true, Latency: 1500 * time.Millisecond, TTFT: 300 * time.Millisecond,
		Attempts: 2, Hedged: true, HedgeWon: true, Overhead: 40 * time.Microsecond, StatusCode: 200, Stream: true,
	})
	hooks.OnReport(relay.Report{
		RequestedModel: "gpt-4.1", Model: "gpt-4.1", Upstream: "eu", Bucket: "mid", Endpoint: "chat/completions",
		Latency: 30 * time.Millisecond, Attempts: 1, Overhead: 7 * time.Microsecond, StatusCode: 429,
		Err: &relay.Error{Op: "send", Upstream: "eu", StatusCode: 429, Err: relay.ErrUpstreamStatus},
	})
	hooks.OnBreaker(relay.BreakerEvent{Upstream: "eu", From: relay.StateClosed, To: relay.StateOpen})
	hooks.OnBreaker(relay.BreakerEvent{Upstream: "eu", From: relay.StateOpen, To: relay.StateHalfOpen})
	hooks.OnWait(relay.WaitEvent{Upstream: "eu", Reason: "slot", Wait: 200 * time.Millisecond})

	expected := helpRequests + `relay_requests_total{bucket="mid",model="gpt-4.1",status="2xx",upstream="eu"} 1
relay_requests_total{bucket="mid",model="gpt-4.1",status="4xx",upstream="eu"} 1
` + helpErrors + `relay_errors_total{model="gpt-4.1",type="429",upstream="eu"} 1
` + helpTokens + `relay_tokens_total{model="gpt-4.1",type="input",upstream="eu"} 300
relay_tokens_total{model="gpt-4.1",type="output",upstream="eu"} 40
relay_tokens_total{model="gpt-4.1",type="cache_read",upstream="eu"} 100
relay_tokens_total{model="gpt-4.1",type="reasoning",upstream="eu"} 10
` + helpCost + `relay_cost_usd_total{model="gpt-4.1",upstream="eu"} 0.00075
` + helpHedges + `relay_hedges_total{result="lost"} 0
relay_hedges_total{result="won"} 1
` + helpBreaker + breakerLines("eu", "half_open") + helpTransitions + `relay_breaker_transitions_total{state="open",upstream="eu"} 1
relay_breaker_transitions_total{state="half_open",upstream="eu"} 1
# HELP relay_request_duration_seconds Duration of the calls, from RoundTrip to the end of the body.
# TYPE relay_request_duration_seconds histogram
` + buckets("relay_request_duration_seconds", `model="gpt-4.1",upstream="eu"`, durationBuckets, 1.5, 0.03) + `# HELP relay_ttft_seconds Time to the first content chunk of the streams.
# TYPE relay_ttft_seconds histogram
` + buckets("relay_ttft_seconds", `model="gpt-4.1",upstream="eu"`, durationBuckets, 0.3) + `# HELP relay_overhead_seconds Time a call spent in the router itself, upstream calls and waits excluded.
# TYPE relay_overhead_seconds histogram
` + buckets("relay_overhead_seconds", "", overheadBuckets, 40e-6, 7e-6) + `# HELP relay_limiter_wait_seconds Waits for an upstream's rate limits or in-flight slot.
# TYPE relay_limiter_wait_seconds histogram
` + buckets("relay_limiter_wait_seconds", `reason="slot",upstream="eu"`, waitBuckets, 0.2)
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(expected)))
}

// buckets writes a histogram series of the given observations, in the
// order observed, in exposition format.
func buckets(name, labels string, bounds []float64, obs ...float64) string {
	var b strings.Builder
	sum := 0.0
	for _, o := range obs {
		sum += o
	}
	sep := ""
	if labels != "" {
		sep = ","
	}
	for _, le := range append(bounds, -1) {
		n := 0
		for _, o := range obs {
			if le < 0 || o <= le {
				n++
			}
		}
		les := fmt.Sprint(le)
		if le < 0 {
			les = "+Inf"
		}
		fmt.Fprintf(&b, "%s_bucket{%s%sle=%q} %d\n", name, labels, sep, les, n)
	}
	if labels != "" {
		labels = "{" + labels + "}"
	}
	fmt.Fprintf(&b, "%s_sum%s %v\n%s_count%s %d\n", name, labels, sum, name, labels, len(obs))
	return b.String()
}

// TestBudgetSpendAndRefusals: a settled call's cost counts under each
// budget that covers it, in the billing currency (a budget not given to
// New as "other"); a refused call counts under the budget that refused it.
func TestBudgetSpendAndRefusals(t *testing.T) {
	a := server(t, "a")
	budgets := []relay.Budget{
		{Name: "team", Limit: 1000, Window: relay.Window{Every: time.Hour}},
		{Name: "unlisted", Limit: 1000, Window: relay.Window{Every: time.Hour}},
	}
	h := newHarness(t, relay.Config{Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}},
		Currency: relay.Currency{Code: "EUR", PerUSD: 0.5}, Budgets: budgets}, relayprom.WithBudgets(budgets[0]))
	h.chat(t, chatBody("gpt-4.1", false))
	rep := h.report(t)
	require.Positive(t, rep.Cost)
	h.compare(t, helpSpend+fmt.Sprintf(`relay_budget_spend_total{budget="other",currency="EUR"} %v
relay_budget_spend_total{budget="team",currency="EUR"} %v
`, rep.Cost, rep.Cost), "relay_budget_spend_total", "relay_budget_refusals_total")

	tight := []relay.Budget{{Name: "team", Limit: 1e-9, Window: relay.Window{Every: time.Hour}}}
	h = newHarness(t, relay.Config{Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}}, Budgets: tight}, relayprom.WithBudgets(tight...))
	_, err := h.do(t, http.MethodPost, "chat/completions", chatBody("gpt-4.1", false))
	require.ErrorIs(t, err, relay.ErrBudgetExceeded)
	h.compare(t, helpRefusals+`relay_budget_refusals_total{budget="team"} 1
`, "relay_budget_spend_total", "relay_budget_refusals_total")
}

// TestStateFallbacks: each failed shared-state call counts by operation,
// as many as the router counts.
func TestStateFallbacks(t *testing.T) {
	a := server(t, "a")
	h := newHarness(t, relay.Config{Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL, RPM: 100}},
		State: statetest.DownState(), Replicas: 2})
	h.chat(t, chatBody("gpt-4.1", false))
	require.True(t, h.report(t).StateFallback)
	require.EqualValues(t, 1, h.router.StateFallbacks())
	h.compare(t, helpFallbacks+`relay_state_fallbacks_total{operation="admit"} 1
`, "relay_state_fallbacks_total")

	// Every operation the router names is counted as itself ("usage",
	// reading a budget's spend, was "other").
	h = newHarness(t, relay.Config{Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}}})
	want := helpFallbacks
	ops := relay.StateFallbackOps()
	slices.Sort(ops)
	for _, op := range ops {
		h.c.Hooks().OnStateFallback(relay.StateFallbackEvent{Op: op, Err: context.DeadlineExceeded})
		want += `relay_state_fallbacks_total{operation="` + op + `"} 1` + "\n"
	}
	h.compare(t, want, "relay_state_fallbacks_total")
}

// TestAttemptsByUpstream: attempts are counted by upstream label and
// outcome, answered ones (2xx) as the others, concurrently: an upstream
// given as itself, one not given as other, none as none; a retry names the
// failed attempt's upstream label. No attempt series shows before its
// first attempt.
func TestAttemptsByUpstream(t *testing.T) {
	c := relayprom.New(relayprom.WithUpstreams(relay.Upstream{Name: "a"}))
	require.Zero(t, testutil.CollectAndCount(c, "relay_attempts_total"))
	hooks := c.Hooks()
	attempt := func(ctx context.Context, up string, n int, status int) {
		hooks.OnAttempt(ctx, relay.AttemptInfo{Upstream: up, N: n}, nil)(relay.AttemptDone{StatusCode: status})
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, up := range []string{"a", "a", "b", ""} {
				attempt(context.Background(), up, 1, 200)
			}
		}()
	}
	wg.Wait()
	ctx := hooks.OnRequest(context.Background(), nil)
	attempt(ctx, "b", 1, 503)
	attempt(ctx, "a", 2, 200)
	expected := helpAttempts + `relay_attempts_total{outcome="2xx",upstream="a"} 17
relay_attempts_total{outcome="2xx",upstream="none"} 8
relay_attempts_total{outcome="2xx",upstream="other"} 8
relay_attempts_total{outcome="5xx",upstream="other"} 1
` + helpRetries + `relay_retries_total{reason="5xx",upstream="other"} 1
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(expected), "relay_attempts_total", "relay_retries_total"))
}

// TestModelsLearnedByDefault: with no model given, the models a service
// uses label its metrics by name, as relayotel's do: each one an upstream
// answered, up to 32; a name an upstream does not know (404) or no
// upstream was called with stays "other".
func TestModelsLearnedByDefault(t *testing.T) {
	srv := server(t, "a")
	h := &harness{c: relayprom.New(relayprom.WithUpstreams(relay.Upstream{Name: "a"}))}
	r, err := relay.New(relay.Config{Upstreams: []relay.Upstream{
		{Name: "a", BaseURL: srv.URL, Models: []string{"gpt-4.1", "made-up"}},
	}, Hooks: h.c.Hooks(), Retry: relay.RetryConfig{MaxAttempts: 1}})
	require.NoError(t, err)
	t.Cleanup(r.CloseIdleConnections)
	h.router = r
	h.chat(t, chatBody("gpt-4.1", false))
	srv.Script(relaytest.Fault{Status: http.StatusNotFound})
	h.chat(t, chatBody("made-up", false))
	_, err = h.do(t, http.MethodPost, "chat/completions", chatBody("served-by-none", false))
	require.ErrorIs(t, err, relay.ErrNoUpstream)
	h.compare(t, helpRequests+`relay_requests_total{bucket="short",model="gpt-4.1",status="2xx",upstream="a"} 1
relay_requests_total{bucket="short",model="other",status="4xx",upstream="a"} 1
relay_requests_total{bucket="short",model="other",status="none",upstream="none"} 1
`, "relay_requests_total")

	// The 33rd model is "other".
	c := relayprom.New()
	hooks := c.Hooks()
	for i := range 33 {
		hooks.OnReport(relay.Report{Model: fmt.Sprintf("m%02d", i), Upstream: "a", Bucket: "short", Attempts: 1, StatusCode: 200})
	}
	h = &harness{c: c}
	h.compare(t, helpRequests+`relay_requests_total{bucket="short",model="other",status="2xx",upstream="other"} 1
`+func() string {
		var b strings.Builder
		for i := range 32 {
			fmt.Fprintf(&b, "relay_requests_total{bucket=\"short\",model=\"m%02d\",status=\"2xx\",upstream=\"other\"} 1\n", i)
		}
		return b.String()
	}(), "relay_requests_total")
}
