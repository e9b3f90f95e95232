package relayotel_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relayotel"
	"github.com/tokenrelay/relay/relaytest"
)

// TestRouterName: with WithRouterName, every metric the Observer records
// and the call's span carry relay.router.
func TestRouterName(t *testing.T) {
	a, b := server(t, "a"), server(t, "b")
	a.Script(relaytest.Fault{Status: 503}, relaytest.Fault{Status: 503})
	h := newHarness(t, relay.Config{
		Strategy:  relay.StrategyPriority,
		Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}, {Name: "b", BaseURL: b.URL}},
		Breaker:   relay.BreakerConfig{Failures: 1},
		Budgets:   []relay.Budget{{Name: "team", Limit: 1000, Window: relay.Window{Every: time.Hour}}},
	}, relayotel.WithRouterName("chat"))
	for range 2 {
		h.chat(t, chatBody("gpt-4.1", false))
	}
	require.Len(t, h.reports, 2)
	for _, r := range h.reports {
		require.NoError(t, r.Err)
	}

	m := h.metrics(t)
	// What the calls made: a retry after a 503 each, a breaker that opened
	// (after two failures), a budget charged.
	assert.Equal(t, []string{
		"gen_ai.client.operation.duration", "gen_ai.client.token.usage",
		"relay.breaker.state", "relay.breaker.transitions", "relay.budget.spend",
		"relay.client.attempts", "relay.client.cost", "relay.client.overhead", "relay.client.retries",
	}, names(m))
	for name, in := range m {
		require.NotEmpty(t, in.Points, name)
		for _, p := range in.Points {
			assert.Contains(t, strings.Split(p.Attrs, ","), "relay.router=chat", "%s: %s", name, p.Attrs)
		}
	}
	var calls int
	for _, s := range h.rec.Ended() {
		if s.Name() == "chat gpt-4.1" {
			calls++
			assert.Equal(t, "chat", attrs(s)["relay.router"].AsString())
		}
	}
	assert.Equal(t, 2, calls)
}

// TestRouterNameTwoObservers: two routers' Observers on one MeterProvider,
// named, report apart: each its breakers and its costs.
func TestRouterNameTwoObservers(t *testing.T) {
	reader, mp := meterProvider(t)
	a := relay.Upstream{Name: "a", BaseURL: "http://a.test/v1"}
	chat := relayotel.New(relayotel.WithMeterProvider(mp), relayotel.WithUpstreams(a), relayotel.WithRouterName("chat"))
	embed := relayotel.New(relayotel.WithMeterProvider(mp), relayotel.WithUpstreams(a), relayotel.WithRouterName("embed"))
	chat.Hooks().OnBreaker(relay.BreakerEvent{Upstream: "a", From: relay.StateClosed, To: relay.StateOpen})
	assert.Equal(t, map[string]int64{
		"relay.breaker.state=closed,relay.router=chat,relay.upstream=a":     0,
		"relay.breaker.state=half_open,relay.router=chat,relay.upstream=a":  0,
		"relay.breaker.state=open,relay.router=chat,relay.upstream=a":       1,
		"relay.breaker.state=closed,relay.router=embed,relay.upstream=a":    1,
		"relay.breaker.state=half_open,relay.router=embed,relay.upstream=a": 0,
		"relay.breaker.state=open,relay.router=embed,relay.upstream=a":      0,
	}, observed(t, reader, "relay.breaker.state"))

	report := func(o *relayotel.Observer, ep, model string) {
		o.Hooks().OnReport(relay.Report{Endpoint: ep, RequestedModel: model, Model: model, Upstream: "a",
			Bucket: "short", Attempts: 1, StatusCode: 200, Priced: true, CostUSD: 0.5})
	}
	report(chat, "chat/completions", "gpt-4.1")
	report(chat, "chat/completions", "gpt-4.1")
	report(embed, "embeddings", "text-embedding-3-small")
	got := map[string]float64{}
	for _, p := range collect(t, reader)["relay.client.cost"].Points {
		got[p.Attrs] = p.Value
	}
	assert.Equal(t, map[string]float64{
		set("gen_ai.operation.name=chat", "gen_ai.request.model=gpt-4.1", "gen_ai.response.model=gpt-4.1",
			"relay.bucket=short", "relay.router=chat", "relay.upstream=a"): 1,
		set("gen_ai.operation.name=embeddings", "gen_ai.request.model=text-embedding-3-small", "gen_ai.response.model=text-embedding-3-small",
			"relay.bucket=short", "relay.router=embed", "relay.upstream=a"): 0.5,
	}, got)

	// The rest of the metrics, through the hooks that record them.
	hooks := embed.Hooks()
	hooks.OnWait(relay.WaitEvent{Upstream: "a", Reason: "rate", Wait: time.Millisecond})
	hooks.OnStateFallback(relay.StateFallbackEvent{Op: "admit", Err: context.DeadlineExceeded})
	hooks.OnSpend(relay.SpendEvent{Budget: "team", Amount: 1, Currency: "USD"})
	hooks.OnReport(relay.Report{Endpoint: "chat/completions", RequestedModel: "gpt-4.1", Model: "gpt-4.1", Upstream: "a",
		StatusCode: 200, Stream: true, TTFT: time.Millisecond, Hedged: true, HedgeWon: true, Usage: relay.Usage{PromptTokens: 10, CompletionTokens: 2}})
	hooks.OnReport(relay.Report{Endpoint: "chat/completions", RequestedModel: "gpt-4.1", Budget: "team", Err: relay.ErrBudgetExceeded})
	m := collect(t, reader)
	assert.Len(t, m, 12, "%v", names(m)) // all but relay.client.attempts and relay.client.retries, made by a router's attempts
	for name, in := range m {
		for _, p := range in.Points {
			attrs := strings.Split(p.Attrs, ",")
			assert.True(t, slices.Contains(attrs, "relay.router=chat") || slices.Contains(attrs, "relay.router=embed"), "%s: %s", name, p.Attrs)
		}
	}
}

// TestClose: an Observer closed (its router replaced, as on a
// configuration reload) no longer reports its breakers; its cost and
// attempt totals stay, so that those counters never go backwards (see
// TestCloseKeepsCountersMonotonic). Closing again does nothing.
func TestClose(t *testing.T) {
	reader, mp := meterProvider(t)
	a := relay.Upstream{Name: "a", BaseURL: "http://a.test/v1"}
	old := relayotel.New(relayotel.WithMeterProvider(mp), relayotel.WithUpstreams(a), relayotel.WithRouterName("old"))
	cur := relayotel.New(relayotel.WithMeterProvider(mp), relayotel.WithUpstreams(a), relayotel.WithRouterName("new"))
	for _, o := range []*relayotel.Observer{old, cur} {
		o.Hooks().OnReport(relay.Report{Endpoint: "chat/completions", RequestedModel: "gpt-4.1", Model: "gpt-4.1", Upstream: "a",
			Bucket: "short", Attempts: 1, StatusCode: 200, Priced: true, CostUSD: 0.5})
	}
	routers := func(name string) []string {
		var out []string
		for _, p := range collect(t, reader)[name].Points {
			for _, kv := range strings.Split(p.Attrs, ",") {
				if r, ok := strings.CutPrefix(kv, "relay.router="); ok && !slices.Contains(out, r) {
					out = append(out, r)
				}
			}
		}
		slices.Sort(out)
		return out
	}
	for _, name := range []string{"relay.breaker.state", "relay.client.cost"} {
		assert.Equal(t, []string{"new", "old"}, routers(name), name)
	}
	require.NoError(t, old.Close())
	assert.Equal(t, []string{"new"}, routers("relay.breaker.state"), "breakers after the old Observer's Close")
	assert.Equal(t, []string{"new", "old"}, routers("relay.client.cost"), "cost totals after the old Observer's Close")
	assert.NoError(t, old.Close(), "a second Close")
}
