package relayotel_test

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/internal/statetest"
	"github.com/tokenrelay/relay/relayotel"
	"github.com/tokenrelay/relay/relaytest"
)

// The bucket boundaries the GenAI conventions recommend.
var (
	durationBounds = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}
	tokenBounds    = []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864}
	overheadBounds = []float64{0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01}
	waitBounds     = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
)

// set writes an attribute set as the harness encodes it: "k=v" pairs
// sorted by key.
func set(pairs ...string) string {
	slices.Sort(pairs)
	return strings.Join(pairs, ",")
}

func itoa(n int) string { return strconv.Itoa(n) }

func ftoa(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

func names(m map[string]instrument) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// genAI is the attribute set the GenAI metrics share for a chat call of
// model answered by srv.
func genAI(t *testing.T, model string, srv *relaytest.Server, extra ...string) []string {
	host, port := hostPort(t, srv)
	return append([]string{"gen_ai.operation.name=chat", "gen_ai.provider.name=openai",
		"gen_ai.request.model=" + model, "gen_ai.response.model=" + model,
		"server.address=" + host, "server.port=" + port}, extra...)
}

// sorted sorts points as the harness does.
func sorted(ps []point) []point {
	slices.SortFunc(ps, func(a, b point) int { return strings.Compare(a.Attrs, b.Attrs) })
	return ps
}

func breakerPoints(up string, state string) []point {
	var ps []point
	for _, s := range []string{"closed", "half_open", "open"} {
		v := 0.0
		if s == state {
			v = 1
		}
		ps = append(ps, point{Attrs: set("relay.breaker.state="+s, "relay.upstream="+up), Value: v})
	}
	return sorted(ps)
}

// TestPlainCall: a plain chat call is one client span with a child span for
// its upstream call, whose context reaches the upstream; the GenAI metrics
// carry the convention's names, units, bucket boundaries and attributes.
func TestPlainCall(t *testing.T) {
	a := server(t, "a")
	h := newHarness(t, relay.Config{Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}}})
	h.chat(t, chatBody("gpt-4.1", false))
	rep := h.report(t)
	require.NoError(t, rep.Err)
	require.True(t, rep.Priced)
	require.False(t, rep.Usage.Estimated)
	host, port := hostPort(t, a)

	spans := h.spans(t)
	require.Len(t, spans, 2)
	call, att := spans["chat gpt-4.1"], spans["relay.attempt"]
	require.NotNil(t, call)
	require.NotNil(t, att)
	assert.Equal(t, trace.SpanKindClient, call.SpanKind())
	assert.Equal(t, trace.SpanKindClient, att.SpanKind())
	assert.Equal(t, codes.Unset, call.Status().Code)
	assert.Equal(t, call.SpanContext().SpanID(), att.Parent().SpanID())
	assert.False(t, call.Parent().IsValid(), "a root span: the request had none")
	assert.Equal(t, map[string]string{
		"gen_ai.operation.name":      "chat",
		"gen_ai.provider.name":       "openai",
		"openai.api.type":            "chat_completions",
		"gen_ai.request.model":       "gpt-4.1",
		"gen_ai.response.model":      "gpt-4.1",
		"gen_ai.usage.input_tokens":  itoa(rep.Usage.PromptTokens),
		"gen_ai.usage.output_tokens": "8",
		"server.address":             host,
		"server.port":                port,
		"http.response.status_code":  "200",
		"relay.upstream":             "a",
		"relay.bucket":               "short",
		"relay.attempts":             "1",
		"relay.hedged":               "false",
		"relay.cost_usd":             ftoa(rep.CostUSD),
	}, kvs(attrs(call)))
	assert.Equal(t, map[string]string{
		"relay.upstream":            "a",
		"gen_ai.request.model":      "gpt-4.1",
		"relay.attempt.number":      "1",
		"relay.attempt.hedge":       "false",
		"server.address":            host,
		"server.port":               port,
		"http.response.status_code": "200",
	}, kvs(attrs(att)))
	assert.Equal(t, "00-"+att.SpanContext().TraceID().String()+"-"+att.SpanContext().SpanID().String()+"-01",
		a.Requests()[0].Header.Get("Traceparent"), "the attempt's context reaches the upstream")

	m := h.metrics(t)
	assert.Equal(t, []string{
		"gen_ai.client.operation.duration", "gen_ai.client.token.usage",
		"relay.breaker.state", "relay.client.attempts", "relay.client.cost", "relay.client.overhead",
	}, names(m))
	assert.Equal(t, instrument{Unit: "s", Kind: "histogram", Bounds: durationBounds,
		Points: []point{{Attrs: set(genAI(t, "gpt-4.1", a)...), Count: 1, Value: 1}},
	}, timed(m["gen_ai.client.operation.duration"]))
	assert.Equal(t, instrument{Unit: "{token}", Kind: "histogram", Bounds: tokenBounds, Points: []point{
		{Attrs: set(genAI(t, "gpt-4.1", a, "gen_ai.token.type=input")...), Count: 1, Value: float64(rep.Usage.PromptTokens)},
		{Attrs: set(genAI(t, "gpt-4.1", a, "gen_ai.token.type=output")...), Count: 1, Value: 8},
	}}, m["gen_ai.client.token.usage"])
	cost := m["relay.client.cost"]
	require.Len(t, cost.Points, 1)
	assert.InDelta(t, rep.CostUSD, cost.Points[0].Value, 1e-12)
	assert.Positive(t, rep.CostUSD)
	cost.Points[0].Value = 0
	assert.Equal(t, instrument{Unit: "{USD}", Kind: "counter", Points: []point{{Attrs: set(
		"gen_ai.operation.name=chat", "gen_ai.request.model=gpt-4.1", "gen_ai.response.model=gpt-4.1",
		"relay.upstream=a", "relay.bucket=short")}}}, cost)
	assert.Equal(t, instrument{Unit: "{attempt}", Kind: "counter", Points: []point{
		{Attrs: set("relay.attempt.hedge=false", "relay.attempt.outcome=2xx", "relay.upstream=a"), Value: 1},
	}}, m["relay.client.attempts"])
	assert.Equal(t, instrument{Unit: "s", Kind: "histogram", Bounds: overheadBounds,
		Points: []point{{Attrs: "gen_ai.operation.name=chat", Count: 1, Value: 1}},
	}, timed(m["relay.client.overhead"]))
	assert.Equal(t, instrument{Unit: "1", Kind: "updowncounter", Points: breakerPoints("a", "closed")}, m["relay.breaker.state"])
}

// TestStreamedCall: a stream's span ends when its body ends, not when its
// headers arrive, and carries the time to the first chunk, also recorded in
// gen_ai.client.operation.time_to_first_chunk.
func TestStreamedCall(t *testing.T) {
	a := server(t, "a")
	h := newHarness(t, relay.Config{Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}}})
	req, err := http.NewRequest(http.MethodPost, "http://relay.test/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", true)))
	require.NoError(t, err)
	resp, err := h.router.RoundTrip(req)
	require.NoError(t, err)
	ended := h.rec.Ended()
	require.Len(t, ended, 1, "only the attempt has ended: the body is unread")
	assert.Equal(t, "relay.attempt", ended[0].Name())
	_, err = io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())

	rep := h.report(t)
	require.NoError(t, rep.Err)
	require.True(t, rep.Stream)
	require.Positive(t, rep.TTFT)
	call := h.spans(t)["chat gpt-4.1"]
	require.NotNil(t, call)
	got := kvs(attrs(call))
	assert.Equal(t, "true", got["gen_ai.request.stream"])
	assert.Equal(t, ftoa(rep.TTFT.Seconds()), got["gen_ai.response.time_to_first_chunk"])
	assert.Equal(t, "8", got["gen_ai.usage.output_tokens"], "the usage chunk the router asked for")

	m := h.metrics(t)
	assert.Equal(t, instrument{Unit: "s", Kind: "histogram", Bounds: durationBounds,
		Points: []point{{Attrs: set(genAI(t, "gpt-4.1", a)...), Count: 1, Value: 1}},
	}, timed(m["gen_ai.client.operation.time_to_first_chunk"]))
	ttfc := m["gen_ai.client.operation.time_to_first_chunk"].Points[0].Value
	assert.InDelta(t, rep.TTFT.Seconds(), ttfc, 1e-9)
	assert.Len(t, m["gen_ai.client.token.usage"].Points, 2)
}

// TestRetriedCall: each upstream call is a span of its own, with its own
// context sent upstream; the retry is counted with the failed call's
// outcome, and the call's span and metrics name the upstream that answered.
func TestRetriedCall(t *testing.T) {
	a, b := server(t, "a"), server(t, "b")
	a.Script(relaytest.Fault{Status: 503})
	h := newHarness(t, relay.Config{
		Strategy:  relay.StrategyPriority,
		Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}, {Name: "b", BaseURL: b.URL}},
	})
	h.chat(t, chatBody("gpt-4.1", false))
	rep := h.report(t)
	require.NoError(t, rep.Err)
	require.Equal(t, "b", rep.Upstream)
	require.Equal(t, 2, rep.Attempts)

	atts := h.attempts()
	require.Len(t, atts, 2)
	aHost, aPort := hostPort(t, a)
	assert.Equal(t, map[string]string{
		"relay.upstream": "a", "gen_ai.request.model": "gpt-4.1", "relay.attempt.number": "1",
		"relay.attempt.hedge": "false", "server.address": aHost, "server.port": aPort,
		"http.response.status_code": "503", "error.type": "503",
	}, kvs(attrs(atts[0])))
	assert.Equal(t, codes.Error, atts[0].Status().Code)
	assert.Equal(t, "b", attrs(atts[1])["relay.upstream"].AsString())
	assert.Equal(t, "2", attrs(atts[1])["relay.attempt.number"].Emit())
	assert.Equal(t, codes.Unset, atts[1].Status().Code)
	for i, srv := range []*relaytest.Server{a, b} {
		sc := atts[i].SpanContext()
		assert.Equal(t, "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01", srv.Requests()[0].Header.Get("Traceparent"))
	}

	call := h.spans(t)["chat gpt-4.1"]
	require.NotNil(t, call)
	got := kvs(attrs(call))
	bHost, bPort := hostPort(t, b)
	assert.Equal(t, "b", got["relay.upstream"])
	assert.Equal(t, "2", got["relay.attempts"])
	assert.Equal(t, bHost, got["server.address"])
	assert.Equal(t, bPort, got["server.port"])
	assert.Equal(t, codes.Unset, call.Status().Code)
	for _, s := range atts {
		assert.Equal(t, call.SpanContext().SpanID(), s.Parent().SpanID())
	}

	m := h.metrics(t)
	assert.Equal(t, instrument{Unit: "{attempt}", Kind: "counter", Points: sorted([]point{
		{Attrs: set("relay.attempt.hedge=false", "relay.attempt.outcome=5xx", "relay.upstream=a"), Value: 1},
		{Attrs: set("relay.attempt.hedge=false", "relay.attempt.outcome=2xx", "relay.upstream=b"), Value: 1},
	})}, m["relay.client.attempts"])
	assert.Equal(t, instrument{Unit: "{retry}", Kind: "counter", Points: []point{
		{Attrs: set("relay.retry.reason=5xx", "relay.upstream=a"), Value: 1},
	}}, m["relay.client.retries"])
	assert.Equal(t, []point{{Attrs: set(genAI(t, "gpt-4.1", b)...), Count: 1, Value: 1}},
		timed(m["gen_ai.client.operation.duration"]).Points)
	assert.Equal(t, sorted(append(breakerPoints("a", "closed"), breakerPoints("b", "closed")...)), m["relay.breaker.state"].Points)
}

// TestFailedCall: an error answer sets the span's status and error.type, on
// the span and on the duration; it records no tokens; a breaker that opens
// shows in relay.breaker.state and relay.breaker.transitions.
func TestFailedCall(t *testing.T) {
	a := server(t, "a")
	a.Script(relaytest.Fault{Status: 500}, relaytest.Fault{Status: 500})
	h := newHarness(t, relay.Config{
		Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}},
		Retry:     relay.RetryConfig{MaxAttempts: 1},
		Breaker:   relay.BreakerConfig{Failures: 1},
	})
	for range 2 {
		resp := h.chat(t, chatBody("gpt-4.1", false))
		require.Equal(t, 500, resp.StatusCode)
	}
	require.Len(t, h.reports, 2)
	for _, rep := range h.reports {
		require.ErrorIs(t, rep.Err, relay.ErrUpstreamStatus)
	}

	var calls []sdktrace.ReadOnlySpan
	for _, s := range h.rec.Ended() {
		if s.Name() == "chat gpt-4.1" {
			calls = append(calls, s)
		}
	}
	require.Len(t, calls, 2)
	for _, call := range calls {
		assert.Equal(t, codes.Error, call.Status().Code)
		assert.Contains(t, call.Status().Description, "status 500")
		got := kvs(attrs(call))
		assert.Equal(t, "500", got["error.type"])
		assert.Equal(t, "500", got["http.response.status_code"])
		assert.NotContains(t, got, "gen_ai.usage.input_tokens")
	}

	m := h.metrics(t)
	assert.Equal(t, []point{{Attrs: set(genAI(t, "gpt-4.1", a, "error.type=500")...), Count: 2, Value: 1}},
		timed(m["gen_ai.client.operation.duration"]).Points)
	assert.NotContains(t, m, "gen_ai.client.token.usage")
	assert.NotContains(t, m, "relay.client.retries")
	assert.Equal(t, []point{{Attrs: set("relay.attempt.hedge=false", "relay.attempt.outcome=5xx", "relay.upstream=a"), Value: 2}},
		m["relay.client.attempts"].Points)
	assert.Equal(t, instrument{Unit: "1", Kind: "updowncounter", Points: breakerPoints("a", "open")}, m["relay.breaker.state"])
	assert.Equal(t, instrument{Unit: "{transition}", Kind: "counter", Points: []point{
		{Attrs: set("relay.breaker.state=open", "relay.upstream=a"), Value: 1},
	}}, m["relay.breaker.transitions"])
}

// TestConnectionError: a call that got no response at all fails with
// error.type "connection" on its span, its attempt and its duration.
func TestConnectionError(t *testing.T) {
	gone := relaytest.NewServer()
	gone.Close()
	h := newHarness(t, relay.Config{
		Upstreams: []relay.Upstream{{Name: "gone", BaseURL: gone.URL}},
		Retry:     relay.RetryConfig{MaxAttempts: 1},
	})
	_, err := h.do(t, context.Background(), http.MethodPost, "chat/completions", chatBody("gpt-4.1", false))
	require.Error(t, err)

	spans := h.spans(t)
	call, att := spans["chat gpt-4.1"], spans["relay.attempt"]
	require.NotNil(t, call)
	require.NotNil(t, att)
	assert.Equal(t, codes.Error, call.Status().Code)
	assert.Equal(t, "connection", attrs(call)["error.type"].AsString())
	assert.Equal(t, codes.Error, att.Status().Code)
	assert.Equal(t, "connection", attrs(att)["error.type"].AsString())
	assert.NotContains(t, attrs(att), "http.response.status_code")

	m := h.metrics(t)
	assert.Equal(t, []point{{Attrs: set(genAI(t, "gpt-4.1", gone, "error.type=connection")...), Count: 1, Value: 1}},
		timed(m["gen_ai.client.operation.duration"]).Points)
	assert.Equal(t, []point{{Attrs: set("relay.attempt.hedge=false", "relay.attempt.outcome=connection", "relay.upstream=gone"), Value: 1}},
		m["relay.client.attempts"].Points)
}

// TestHedgedCall: a hedge is an attempt span of its own (relay.attempt.hedge),
// the cancelled loser's span ends with error.type "canceled", and
// relay.client.hedges counts the hedge as won.
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
	require.NoError(t, rep.Err)
	require.True(t, rep.Hedged)
	require.True(t, rep.HedgeWon)
	require.Equal(t, "fast", rep.Upstream)
	require.Eventually(t, func() bool { return len(h.attempts()) == 2 }, 10*time.Second, time.Millisecond,
		"the loser's span ends when its cancelled call returns")

	atts := h.attempts()
	assert.Equal(t, "slow", attrs(atts[0])["relay.upstream"].AsString())
	assert.Equal(t, "false", attrs(atts[0])["relay.attempt.hedge"].Emit())
	assert.Equal(t, "canceled", attrs(atts[0])["error.type"].AsString())
	assert.Equal(t, codes.Error, atts[0].Status().Code)
	assert.Equal(t, "fast", attrs(atts[1])["relay.upstream"].AsString())
	assert.Equal(t, "true", attrs(atts[1])["relay.attempt.hedge"].Emit())
	assert.Equal(t, "2", attrs(atts[1])["relay.attempt.number"].Emit())
	assert.Equal(t, codes.Unset, atts[1].Status().Code)
	assert.NotEmpty(t, fast.Requests()[0].Header.Get("Traceparent"))

	call := h.spans(t)["chat gpt-4.1"]
	require.NotNil(t, call)
	got := kvs(attrs(call))
	assert.Equal(t, "true", got["relay.hedged"])
	assert.Equal(t, "true", got["relay.hedge_won"])
	assert.Equal(t, "fast", got["relay.upstream"])

	m := h.metrics(t)
	assert.Equal(t, instrument{Unit: "{hedge}", Kind: "counter", Points: []point{
		{Attrs: "relay.hedge.result=won", Value: 1},
	}}, m["relay.client.hedges"])
	assert.Equal(t, sorted([]point{
		{Attrs: set("relay.attempt.hedge=true", "relay.attempt.outcome=2xx", "relay.upstream=fast"), Value: 1},
		{Attrs: set("relay.attempt.hedge=false", "relay.attempt.outcome=canceled", "relay.upstream=slow"), Value: 1},
	}), m["relay.client.attempts"].Points)
	assert.NotContains(t, m, "relay.client.retries", "a hedge is not a retry")
}

// TestLimiterWait: a wait for an upstream's limits (here the hold of its
// retry-after-ms) is recorded in relay.limiter.wait and noted on the span
// of the upstream call that followed it.
func TestLimiterWait(t *testing.T) {
	a := server(t, "a")
	a.Script(relaytest.Fault{Status: 429, Header: http.Header{"Retry-After-Ms": {"60"}}})
	h := newHarness(t, relay.Config{
		Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}},
		Retry:     relay.RetryConfig{MaxAttempts: 1},
	})
	require.Equal(t, 429, h.chat(t, chatBody("gpt-4.1", false)).StatusCode)
	h.rec.Reset()
	require.Equal(t, 200, h.chat(t, chatBody("gpt-4.1", false)).StatusCode)

	att := h.spans(t)["relay.attempt"]
	require.NotNil(t, att)
	got := attrs(att)
	assert.Equal(t, "rate", got["relay.wait.reason"].AsString())
	assert.Greater(t, got["relay.wait.duration"].AsFloat64(), 0.01)

	m := h.metrics(t)
	wait := m["relay.limiter.wait"]
	require.Len(t, wait.Points, 1)
	assert.InDelta(t, got["relay.wait.duration"].AsFloat64(), wait.Points[0].Value, 1e-9)
	assert.Equal(t, instrument{Unit: "s", Kind: "histogram", Bounds: waitBounds, Points: []point{
		{Attrs: set("relay.upstream=a", "relay.wait.reason=rate"), Count: 1, Value: 1},
	}}, timed(wait))
}

// TestOperations: the operation name follows the endpoint (the Responses
// API is a chat), openai.api.type is set for the "openai" provider only,
// and embeddings record input tokens only.
func TestOperations(t *testing.T) {
	cases := []struct {
		endpoint, body, provider string
		span, op, api            string
		tokenTypes               []string
	}{
		{"chat/completions", chatBody("gpt-4.1", false), "", "chat gpt-4.1", "chat", "chat_completions", []string{"input", "output"}},
		{"responses", `{"model":"gpt-4.1","input":"Say hello."}`, "", "chat gpt-4.1", "chat", "responses", []string{"input", "output"}},
		{"completions", `{"model":"gpt-4.1","prompt":"Say hello."}`, "", "text_completion gpt-4.1", "text_completion", "", []string{"input", "output"}},
		{"embeddings", `{"model":"text-embedding-3-small","input":"Say hello."}`, "", "embeddings text-embedding-3-small", "embeddings", "", []string{"input"}},
		{"chat/completions", chatBody("gpt-4.1", false), "azure.ai.openai", "chat gpt-4.1", "chat", "", []string{"input", "output"}},
	}
	for _, c := range cases {
		t.Run(c.endpoint+"/"+c.provider, func(t *testing.T) {
			a := server(t, "a")
			var opts []relayotel.Option
			provider := "openai"
			if c.provider != "" {
				opts, provider = append(opts, relayotel.WithProviderName(c.provider)), c.provider
			}
			h := newHarness(t, relay.Config{Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}}}, opts...)
			_, err := h.do(t, context.Background(), http.MethodPost, c.endpoint, c.body)
			require.NoError(t, err)
			require.NoError(t, h.report(t).Err)
			call := h.spans(t)[c.span]
			require.NotNil(t, call, "span %q", c.span)
			got := kvs(attrs(call))
			assert.Equal(t, c.op, got["gen_ai.operation.name"])
			assert.Equal(t, provider, got["gen_ai.provider.name"])
			if c.api == "" {
				assert.NotContains(t, got, "openai.api.type")
			} else {
				assert.Equal(t, c.api, got["openai.api.type"])
			}
			var types []string
			for _, p := range h.metrics(t)["gen_ai.client.token.usage"].Points {
				assert.Contains(t, p.Attrs, "gen_ai.operation.name="+c.op+",gen_ai.provider.name="+provider+",")
				for _, kv := range strings.Split(p.Attrs, ",") {
					if v, ok := strings.CutPrefix(kv, "gen_ai.token.type="); ok {
						types = append(types, v)
					}
				}
			}
			assert.Equal(t, c.tokenTypes, types)
		})
	}
}

// TestUnroutedPath: a path relay does not route by model gets a span named
// by its method and no GenAI metrics.
func TestUnroutedPath(t *testing.T) {
	a := server(t, "a")
	h := newHarness(t, relay.Config{Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}}})
	_, err := h.do(t, context.Background(), http.MethodGet, "models", "")
	require.NoError(t, err)
	call := h.spans(t)["GET"]
	require.NotNil(t, call)
	got := kvs(attrs(call))
	assert.Equal(t, "a", got["relay.upstream"])
	assert.Equal(t, "200", got["http.response.status_code"])
	assert.NotContains(t, got, "gen_ai.operation.name")
	m := h.metrics(t)
	assert.NotContains(t, m, "gen_ai.client.operation.duration")
	assert.Equal(t, []point{{Count: 1, Value: 1}}, timed(m["relay.client.overhead"]).Points)
}

// TestParentSpan: the call's span is a child of the span in the request's
// context, and the upstream sees that trace.
func TestParentSpan(t *testing.T) {
	a := server(t, "a")
	h := newHarness(t, relay.Config{Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}}})
	ctx, parent := h.tp.Tracer("test").Start(context.Background(), "handler")
	_, err := h.do(t, ctx, http.MethodPost, "chat/completions", chatBody("gpt-4.1", false))
	require.NoError(t, err)
	parent.End()
	call := h.spans(t)["chat gpt-4.1"]
	require.NotNil(t, call)
	assert.Equal(t, parent.SpanContext().SpanID(), call.Parent().SpanID())
	assert.Equal(t, parent.SpanContext().TraceID(), call.SpanContext().TraceID())
	assert.True(t, strings.HasPrefix(a.Requests()[0].Header.Get("Traceparent"), "00-"+parent.SpanContext().TraceID().String()+"-"))
}

// TestEstimatedUsage: counts the router estimated (an answer without usage)
// are left out of the GenAI token metric and attributes unless
// WithEstimatedUsage.
func TestEstimatedUsage(t *testing.T) {
	for _, withEstimates := range []bool{false, true} {
		t.Run(strconv.FormatBool(withEstimates), func(t *testing.T) {
			a := server(t, "a")
			a.Script(relaytest.Fault{NoUsage: true})
			var opts []relayotel.Option
			if withEstimates {
				opts = append(opts, relayotel.WithEstimatedUsage())
			}
			h := newHarness(t, relay.Config{Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}}}, opts...)
			h.chat(t, chatBody("gpt-4.1", false))
			require.True(t, h.report(t).Usage.Estimated)
			got := kvs(attrs(h.spans(t)["chat gpt-4.1"]))
			m := h.metrics(t)
			if !withEstimates {
				assert.NotContains(t, got, "gen_ai.usage.input_tokens")
				assert.NotContains(t, m, "gen_ai.client.token.usage")
				return
			}
			assert.Equal(t, "true", got["relay.usage.estimated"])
			assert.Equal(t, itoa(h.report(t).Usage.PromptTokens), got["gen_ai.usage.input_tokens"])
			assert.Len(t, m["gen_ai.client.token.usage"].Points, 2)
		})
	}
}

// TestJoinedObservers: the observer works between other hooks that wrap the
// request's context, and Config.OnReport still gets every report.
func TestJoinedObservers(t *testing.T) {
	type key string
	wrap := func(name string) relay.Hooks {
		return relay.Hooks{OnRequest: func(ctx context.Context, _ *http.Request) context.Context {
			return context.WithValue(ctx, key(name), name)
		}}
	}
	a := server(t, "a")
	var seen []string
	h := newHarness(t, relay.Config{
		Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}},
		Hooks: relay.JoinHooks(wrap("before"), relay.Hooks{OnReport: func(r relay.Report) {
			seen = append(seen, r.Context.Value(key("before")).(string))
		}}),
	})
	h.chat(t, chatBody("gpt-4.1", false))
	assert.Equal(t, []string{"before"}, seen)
	require.Len(t, h.reports, 1, "Config.OnReport runs too")
	assert.NotNil(t, h.spans(t)["chat gpt-4.1"])

	// The observer first, another wrapper after it.
	rec := server(t, "b")
	obs := relayotel.New(relayotel.WithTracerProvider(h.tp))
	r, err := relay.New(relay.Config{
		Upstreams: []relay.Upstream{{Name: "b", BaseURL: rec.URL}},
		Hooks:     relay.JoinHooks(obs.Hooks(), wrap("after")),
		Base:      &http.Transport{},
	})
	require.NoError(t, err)
	t.Cleanup(r.CloseIdleConnections)
	h.rec.Reset()
	h.router = r
	h.chat(t, chatBody("gpt-4.1", false))
	call := h.spans(t)["chat gpt-4.1"]
	require.NotNil(t, call, "found again through a context wrapped after it")
	assert.Equal(t, "b", attrs(call)["relay.upstream"].AsString())
}

// TestUnsampledCall: a call whose span is not sampled gets no attempt spans
// (they would not be sampled either) and sends its own context upstream,
// marked not sampled; its metrics are recorded all the same.
func TestUnsampledCall(t *testing.T) {
	a := server(t, "a")
	h := newHarness(t, relay.Config{Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}}})
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()), sdktrace.WithSpanProcessor(h.rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	ctx, parent := tp.Tracer("test").Start(context.Background(), "handler")
	defer parent.End()
	_, err := h.do(t, ctx, http.MethodPost, "chat/completions", chatBody("gpt-4.1", false))
	require.NoError(t, err)
	assert.Empty(t, h.rec.Started(), "nothing recorded")
	tpHeader := a.Requests()[0].Header.Get("Traceparent")
	assert.True(t, strings.HasPrefix(tpHeader, "00-"+parent.SpanContext().TraceID().String()+"-"), tpHeader)
	assert.True(t, strings.HasSuffix(tpHeader, "-00"), "not sampled: %s", tpHeader)
	assert.NotContains(t, tpHeader, parent.SpanContext().SpanID().String(), "the call's own span is the parent")
	assert.Len(t, h.metrics(t)["relay.client.attempts"].Points, 1)
}

// TestBudgetSpendAndRefusals: a settled call's cost is added to
// relay.budget.spend for each budget that covers it, in the billing
// currency; a refused call adds to relay.budget.refusals.
func TestBudgetSpendAndRefusals(t *testing.T) {
	a := server(t, "a")
	h := newHarness(t, relay.Config{Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}},
		Currency: relay.Currency{Code: "EUR", PerUSD: 0.5},
		Budgets:  []relay.Budget{{Name: "team", Limit: 1000, Window: relay.Window{Every: time.Hour}}}})
	h.chat(t, chatBody("gpt-4.1", false))
	rep := h.report(t)
	require.Positive(t, rep.Cost)
	m := h.metrics(t)
	assert.Equal(t, instrument{Unit: "{currency_unit}", Kind: "counter", Points: []point{
		{Attrs: "relay.budget=team,relay.budget.currency=EUR", Value: rep.Cost}, // sorted by key
	}}, m["relay.budget.spend"])
	assert.NotContains(t, m, "relay.budget.refusals", "nothing refused")

	h = newHarness(t, relay.Config{Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}},
		Budgets: []relay.Budget{{Name: "tight", Limit: 1e-9, Window: relay.Window{Every: time.Hour}}}})
	_, err := h.do(t, context.Background(), http.MethodPost, "chat/completions", chatBody("gpt-4.1", false))
	require.ErrorIs(t, err, relay.ErrBudgetExceeded)
	m = h.metrics(t)
	assert.Equal(t, instrument{Unit: "{request}", Kind: "counter", Points: []point{
		{Attrs: "relay.budget=tight", Value: 1},
	}}, m["relay.budget.refusals"])
	assert.NotContains(t, m, "relay.budget.spend", "nothing spent")
}

// TestStateFallbacks: a failed shared-state call adds to
// relay.state.fallbacks by operation, and shows as an event on the call's
// span.
func TestStateFallbacks(t *testing.T) {
	a := server(t, "a")
	h := newHarness(t, relay.Config{Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL, RPM: 100}},
		State: statetest.DownState(), Replicas: 2})
	h.chat(t, chatBody("gpt-4.1", false))
	require.True(t, h.report(t).StateFallback)
	require.EqualValues(t, 1, h.router.StateFallbacks())
	assert.Equal(t, instrument{Unit: "{call}", Kind: "counter", Points: []point{
		{Attrs: "relay.state.operation=admit", Value: 1},
	}}, h.metrics(t)["relay.state.fallbacks"])
	span := h.spans(t)["chat gpt-4.1"]
	require.NotNil(t, span)
	var events []string
	for _, e := range span.Events() {
		m := map[string]string{}
		for _, kv := range e.Attributes {
			m[string(kv.Key)] = kv.Value.Emit()
		}
		events = append(events, e.Name+" "+m["relay.state.operation"])
	}
	assert.Contains(t, events, "relay.state.fallback admit")

	// Every operation the router names is recorded as itself ("usage",
	// reading a budget's spend, was "other").
	reader, mp := meterProvider(t)
	hooks := relayotel.New(relayotel.WithMeterProvider(mp)).Hooks()
	var want []point
	for _, op := range relay.StateFallbackOps() {
		hooks.OnStateFallback(relay.StateFallbackEvent{Op: op, Err: context.DeadlineExceeded})
		want = append(want, point{Attrs: "relay.state.operation=" + op, Value: 1})
	}
	assert.ElementsMatch(t, want, collect(t, reader)["relay.state.fallbacks"].Points)
}

// TestUnsampledCountsAsSampled: a call whose span is not sampled (its
// attempts' done functions have no span to complete) counts its attempts,
// its retry and its hedge as a sampled one does: a retry after a 503 is
// counted with the failed call's upstream and outcome, and a hedge's
// cancelled loser does not hide the outcome before it.
func TestUnsampledCountsAsSampled(t *testing.T) {
	unsampled := func(t *testing.T) context.Context {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
		t.Cleanup(func() { tp.Shutdown(context.Background()) })
		ctx, parent := tp.Tracer("test").Start(context.Background(), "handler")
		t.Cleanup(func() { parent.End() })
		return ctx
	}
	counted := func(t *testing.T, h *harness, n int) map[string]instrument {
		require.Eventually(t, func() bool {
			var total float64
			for _, p := range h.metrics(t)["relay.client.attempts"].Points {
				total += p.Value
			}
			return total == float64(n)
		}, 10*time.Second, time.Millisecond, "a hedge's loser is counted when its cancelled call returns")
		m := h.metrics(t)
		return map[string]instrument{"attempts": m["relay.client.attempts"], "retries": m["relay.client.retries"], "hedges": m["relay.client.hedges"]}
	}
	for _, c := range []struct {
		name     string
		attempts int
		config   func(t *testing.T) relay.Config
	}{
		{"retried", 3, func(t *testing.T) relay.Config {
			a, b := server(t, "a"), server(t, "b")
			a.Script(relaytest.Fault{Status: 503})
			b.Script(relaytest.Fault{Status: 429})
			return relay.Config{Strategy: relay.StrategyPriority,
				Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}, {Name: "b", BaseURL: b.URL}}}
		}},
		{"hedged", 2, func(t *testing.T) relay.Config {
			slow, fast := server(t, "slow"), server(t, "fast")
			slow.Script(relaytest.Fault{Delay: 10 * time.Second})
			return relay.Config{Strategy: relay.StrategyPriority,
				Upstreams: []relay.Upstream{{Name: "slow", BaseURL: slow.URL}, {Name: "fast", BaseURL: fast.URL}},
				Hedge:     relay.HedgeConfig{Delay: 20 * time.Millisecond, Budget: 1}}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got [2]map[string]instrument
			for i, ctx := range []func(*testing.T) context.Context{func(*testing.T) context.Context { return context.Background() }, unsampled} {
				h := newHarness(t, c.config(t))
				_, err := h.do(t, ctx(t), http.MethodPost, "chat/completions", chatBody("gpt-4.1", false))
				require.NoError(t, err)
				got[i] = counted(t, h, c.attempts)
			}
			assert.Equal(t, got[0], got[1])
			if c.name == "retried" {
				assert.Equal(t, sorted([]point{
					{Attrs: set("relay.retry.reason=5xx", "relay.upstream=a"), Value: 1},
					{Attrs: set("relay.retry.reason=429", "relay.upstream=b"), Value: 1},
				}), got[1]["retries"].Points)
			} else {
				assert.Equal(t, []point{{Attrs: "relay.hedge.result=won", Value: 1}}, got[1]["hedges"].Points)
			}
		})
	}
}

// TestAttemptsByUpstream: attempts are counted by upstream, outcome and
// hedge, answered ones (2xx) as the others, concurrently, for an upstream
// given to WithUpstreams, one learned from its request and one with no
// URL to learn from.
func TestAttemptsByUpstream(t *testing.T) {
	reader, mp := meterProvider(t)
	hooks := relayotel.New(relayotel.WithMeterProvider(mp), relayotel.WithUpstreams(relay.Upstream{Name: "a", BaseURL: "http://a.test/v1"})).Hooks()
	attempt := func(up string, hedge bool, status int) {
		out, err := http.NewRequest(http.MethodPost, "http://"+up+".test/v1/chat/completions", nil)
		require.NoError(t, err)
		if up == "nourl" {
			out.URL = nil
		}
		hooks.OnAttempt(context.Background(), relay.AttemptInfo{Upstream: up, N: 1, Hedge: hedge}, out)(relay.AttemptDone{StatusCode: status})
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, up := range []string{"a", "b", "nourl"} {
				attempt(up, false, 200)
				attempt(up, true, 200)
			}
			attempt("a", false, 200)
		}()
	}
	wg.Wait()
	attempt("a", false, 503)
	attempt("b", true, 429)
	counted := func(up, outcome string, hedge bool, n float64) point {
		return point{Attrs: set("relay.attempt.hedge="+strconv.FormatBool(hedge), "relay.attempt.outcome="+outcome, "relay.upstream="+up), Value: n}
	}
	assert.Equal(t, sorted([]point{
		counted("a", "2xx", false, 16), counted("a", "2xx", true, 8), counted("a", "5xx", false, 1),
		counted("b", "2xx", false, 8), counted("b", "2xx", true, 8), counted("b", "429", true, 1),
		counted("nourl", "2xx", false, 8), counted("nourl", "2xx", true, 8),
	}), collect(t, reader)["relay.client.attempts"].Points)
}
