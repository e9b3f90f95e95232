package relayotel_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relayotel"
	"github.com/tokenrelay/relay/relaytest"
)

// A stream request answered with an error status (no chunk ever came)
// must not record time_to_first_chunk.
func TestTTFCOnErrorStatus(t *testing.T) {
	a := server(t, "a")
	a.Script(relaytest.Fault{Status: 429})
	h := newHarness(t, relay.Config{
		Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}},
		Retry:     relay.RetryConfig{MaxAttempts: 1},
	})
	resp := h.chat(t, chatBody("gpt-4.1", true))
	require.Equal(t, 429, resp.StatusCode)
	rep := h.report(t)
	t.Logf("report: Stream=%v TTFT=%v Err=%v", rep.Stream, rep.TTFT, rep.Err)
	m := h.metrics(t)
	assert.NotContains(t, m, "gen_ai.client.operation.time_to_first_chunk", "no chunk came: a 429 JSON error")
	got := kvs(attrs(h.spans(t)["chat gpt-4.1"]))
	assert.NotContains(t, got, "gen_ai.response.time_to_first_chunk")
}

// First-token failover: the abandoned attempt's outcome and the retry's
// reason should name the first-token timeout, not "_OTHER".
func TestFirstTokenOutcome(t *testing.T) {
	a, b := server(t, "a"), server(t, "b")
	a.Script(relaytest.Fault{FirstTokenDelay: 2 * time.Second})
	h := newHarness(t, relay.Config{
		Strategy:  relay.StrategyPriority,
		Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}, {Name: "b", BaseURL: b.URL}},
		Stream:    relay.StreamConfig{FirstTokenTimeout: 100 * time.Millisecond},
	})
	h.chat(t, chatBody("gpt-4.1", true))
	rep := h.report(t)
	require.NoError(t, rep.Err)
	require.Equal(t, "b", rep.Upstream)
	atts := h.attempts()
	require.Len(t, atts, 2)
	t.Logf("attempt 1: %v", kvs(attrs(atts[0])))
	m := h.metrics(t)
	t.Logf("attempts: %+v", m["relay.client.attempts"].Points)
	t.Logf("retries: %+v", m["relay.client.retries"].Points)
	assert.NotEqual(t, "_OTHER", attrs(atts[0])["error.type"].AsString())
	for _, p := range m["relay.client.retries"].Points {
		assert.NotContains(t, p.Attrs, "_OTHER")
	}
}

// A budget refusal's error.type.
func TestBudgetErrorType(t *testing.T) {
	a := server(t, "a")
	h := newHarness(t, relay.Config{Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}},
		Budgets: []relay.Budget{{Name: "tight", Limit: 1e-9, Window: relay.Window{Every: time.Hour}}}})
	_, err := h.do(t, context.Background(), http.MethodPost, "chat/completions", chatBody("gpt-4.1", false))
	require.ErrorIs(t, err, relay.ErrBudgetExceeded)
	// Named "chat": the call reached no upstream, so its model is not yet
	// known to the metrics (_OTHER). The span has it all the same.
	got := kvs(attrs(h.spans(t)["chat"]))
	t.Logf("span: %v", got)
	assert.Equal(t, "gpt-4.1", got["gen_ai.request.model"])
	m := h.metrics(t)
	t.Logf("duration: %+v", m["gen_ai.client.operation.duration"].Points)
	assert.NotEqual(t, "_OTHER", got["error.type"])
}

// Closing the response body before reading it ends the span once.
func TestCloseBeforeReadEndsSpanOnce(t *testing.T) {
	a := server(t, "a")
	h := newHarness(t, relay.Config{Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}}})
	for _, stream := range []bool{false, true} {
		h.rec.Reset()
		req, _ := http.NewRequest(http.MethodPost, "http://relay.test/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", stream)))
		resp, err := h.router.RoundTrip(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		resp.Body.Close()
		io.ReadAll(resp.Body)
		n := 0
		for _, s := range h.rec.Ended() {
			if s.Name() == "chat gpt-4.1" {
				n++
			}
		}
		assert.Equal(t, 1, n)
		assert.Empty(t, openSpans(h))
	}
}

func openSpans(h *harness) []string {
	ended := map[string]bool{}
	for _, s := range h.rec.Ended() {
		ended[s.SpanContext().SpanID().String()] = true
	}
	var open []string
	for _, s := range h.rec.Started() {
		if !ended[s.SpanContext().SpanID().String()] {
			open = append(open, s.Name())
		}
	}
	return open
}

type closedBody struct{}

func (closedBody) Read([]byte) (int, error) {
	return 0, errors.New("http: invalid Read on closed Body")
}
func (closedBody) Close() error { return nil }

func TestClosedRequestBodyEndsSpan(t *testing.T) {
	a := server(t, "a")
	h := newHarness(t, relay.Config{Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}}})
	req, _ := http.NewRequest(http.MethodPost, "http://relay.test/v1/chat/completions", io.NopCloser(nil))
	req.Body = closedBody{}
	req.ContentLength = 100
	_, err := h.router.RoundTrip(req)
	require.Error(t, err)
	assert.Empty(t, openSpans(h))
	spans := h.spans(t)
	for n, s := range spans {
		t.Logf("%s %v %v", n, kvs(attrs(s)), s.Status())
	}
	assert.Len(t, spans, 1)
	m := h.metrics(t)
	t.Logf("%v", names(m))
}

// A chat call refused for its body size fails before it is classified:
// gen_ai.client.operation.duration has a point for it, with the operation
// its URL path names and error.type body_too_large. (It had none.)
func TestBodyTooLargeDuration(t *testing.T) {
	a := server(t, "a")
	h := newHarness(t, relay.Config{Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}}, MaxBodyBytes: 10})
	_, err := h.do(t, t.Context(), http.MethodPost, "chat/completions", chatBody("gpt-4.1", false))
	require.ErrorIs(t, err, relay.ErrBodyTooLarge)
	span := h.spans(t)["chat"]
	require.NotNil(t, span)
	assert.Equal(t, "body_too_large", attrs(span)["error.type"].AsString())
	m := h.metrics(t)
	assert.Contains(t, m, "gen_ai.client.operation.duration", "the failed chat call is not in the duration metric")
}

// observed collects reader and returns metric name's points as values by
// attribute set ("k=v,k=v", as the harness writes them), whatever the
// instrument's kind (a gauge, a sum).
func observed(t *testing.T, reader *sdkmetric.ManualReader, name string) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					out[enc(p.Attributes)] += p.Value
				}
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out[enc(p.Attributes)] += p.Value
				}
			default:
				t.Fatalf("%s: unexpected data %T", name, m.Data)
			}
		}
	}
	return out
}

// Two routers in one service (chat and embeddings), each with its
// Observer on the same MeterProvider. The SDK ignores the callback given
// when an observable instrument is created again (it warns "Repeated
// observable instrument creation with callbacks"), so relay.breaker.state
// showed the first Observer's breakers only: the embeddings router's
// upstream "e" was missing altogether. Both have an upstream named "a":
// the chat router's breaker for it opens, the embeddings router's stays
// closed, and the metric must show one breaker in each state.
func TestTwoObserversBreakerState(t *testing.T) {
	reader, mp := meterProvider(t)
	a := relay.Upstream{Name: "a", BaseURL: "http://a.test/v1"}
	chat := relayotel.New(relayotel.WithMeterProvider(mp), relayotel.WithUpstreams(a))
	embed := relayotel.New(relayotel.WithMeterProvider(mp), relayotel.WithUpstreams(a, relay.Upstream{Name: "e", BaseURL: "http://e.test/v1"}))
	chat.Hooks().OnBreaker(relay.BreakerEvent{Upstream: "a", From: relay.StateClosed, To: relay.StateOpen})
	assert.Equal(t, map[string]int64{
		"relay.breaker.state=closed,relay.upstream=a":    1,
		"relay.breaker.state=half_open,relay.upstream=a": 0,
		"relay.breaker.state=open,relay.upstream=a":      1,
		"relay.breaker.state=closed,relay.upstream=e":    1,
		"relay.breaker.state=half_open,relay.upstream=e": 0,
		"relay.breaker.state=open,relay.upstream=e":      0,
	}, observed(t, reader, "relay.breaker.state"))

	embed.Hooks().OnBreaker(relay.BreakerEvent{Upstream: "a", From: relay.StateClosed, To: relay.StateOpen})
	chat.Hooks().OnBreaker(relay.BreakerEvent{Upstream: "a", From: relay.StateOpen, To: relay.StateHalfOpen})
	got := observed(t, reader, "relay.breaker.state")
	assert.EqualValues(t, 1, got["relay.breaker.state=half_open,relay.upstream=a"])
	assert.EqualValues(t, 1, got["relay.breaker.state=open,relay.upstream=a"])
	assert.EqualValues(t, 0, got["relay.breaker.state=closed,relay.upstream=a"])
}

// With two Observers joined (on providers of their own), each one's
// metric exemplars name its own call span. Before, the metrics were
// recorded with the report's context, whose span is the one the later
// Observer started inside the first's: the first's exemplars named the
// other provider's span.
func TestExemplarsNameTheirOwnSpan(t *testing.T) {
	obs := chatJoined(t, nil, nil)
	for i, o := range obs {
		var call sdktrace.ReadOnlySpan
		for _, s := range o.rec.Ended() {
			if s.Name() == "chat gpt-4.1" {
				call = s
			}
		}
		require.NotNil(t, call, "observer %d", i)
		var named int
		for name, ids := range exemplarSpans(t, o.reader) {
			for _, id := range ids {
				want := call.SpanContext().SpanID()
				assert.Equal(t, want[:], id, "observer %d, %s", i, name)
				named++
			}
		}
		assert.Equal(t, 4, named, "observer %d: duration, input and output tokens, overhead", i)
	}
}

// With two Observers joined (on providers of their own), each one's
// attempt spans are children of its own call span, and a call its
// provider does not sample makes no attempt spans there, whatever the
// other provider decides. Before, an attempt's span was started in the
// attempt's context, whose span is the one the later Observer started
// inside the first's: the first's attempt spans had the other provider's
// span as their parent, and were sampled by that span's decision.
func TestAttemptSpansAreTheirCallsChildren(t *testing.T) {
	for _, sampled := range []bool{true, false} {
		t.Run(map[bool]string{true: "sampled", false: "first-unsampled"}[sampled], func(t *testing.T) {
			// The second samples every span; the first follows the parent
			// of a span, but samples no call of its own.
			first := sdktrace.AlwaysSample()
			if !sampled {
				first = sdktrace.ParentBased(sdktrace.NeverSample())
			}
			obs := chatJoined(t, first, sdktrace.AlwaysSample())
			for i, o := range obs {
				var call, attempt sdktrace.ReadOnlySpan
				for _, s := range o.rec.Ended() {
					switch s.Name() {
					case "chat gpt-4.1":
						call = s
					case "relay.attempt":
						attempt = s
					}
				}
				if i == 0 && !sampled {
					assert.Nil(t, call, "observer 0: its call is not sampled")
					assert.Nil(t, attempt, "observer 0: no attempt span for a call it does not sample")
					continue
				}
				require.NotNil(t, call, "observer %d", i)
				require.NotNil(t, attempt, "observer %d", i)
				assert.Equal(t, call.SpanContext().SpanID(), attempt.Parent().SpanID(), "observer %d: the attempt's parent", i)
			}
		})
	}
}

// With two Observers joined, the first one's exemplars of a call's
// limiter waits, state fallbacks and budget spend name its own call span,
// as those of its report do (TestExemplarsNameTheirOwnSpan). Before,
// they were recorded with the event's context, whose span is the one the
// later Observer started inside the first's.
func TestEventExemplarsNameTheirOwnSpan(t *testing.T) {
	reader, mp := meterProvider(t)
	tp := sdktrace.NewTracerProvider()
	other := sdktrace.NewTracerProvider()
	t.Cleanup(func() {
		tp.Shutdown(context.Background())
		other.Shutdown(context.Background())
	})
	hooks := relayotel.New(relayotel.WithMeterProvider(mp), relayotel.WithTracerProvider(tp)).Hooks()
	req, err := http.NewRequest(http.MethodPost, "http://relay.test/v1/chat/completions", nil)
	require.NoError(t, err)
	ctx := hooks.OnRequest(context.Background(), req)
	own := trace.SpanFromContext(ctx).SpanContext().SpanID()
	inner, span := other.Tracer("other").Start(ctx, "chat") // the later Observer's call span
	defer span.End()
	require.NotEqual(t, own, span.SpanContext().SpanID())

	hooks.OnWait(relay.WaitEvent{Context: inner, Upstream: "a", Reason: "rate", Wait: time.Millisecond})
	hooks.OnStateFallback(relay.StateFallbackEvent{Context: inner, Op: "admit", Err: errors.New("down")})
	hooks.OnSpend(relay.SpendEvent{Context: inner, Budget: "b", Amount: 1, Currency: "USD"})

	named := map[string]int{}
	for name, ids := range exemplarSpans(t, reader) {
		for _, id := range ids {
			assert.Equal(t, own[:], id, name)
			named[name]++
		}
	}
	assert.Equal(t, map[string]int{"relay.limiter.wait": 1, "relay.state.fallbacks": 1, "relay.budget.spend": 1}, named)
}

// joinedObserver is what one of the Observers chatJoined joins recorded.
type joinedObserver struct {
	reader *sdkmetric.ManualReader
	rec    *tracetest.SpanRecorder
}

// chatJoined makes a chat call through a router whose hooks join an
// Observer per sampler (nil: the SDK's default), in order, each on
// providers of its own, and returns what each recorded.
func chatJoined(t *testing.T, samplers ...sdktrace.Sampler) []joinedObserver {
	t.Helper()
	a := server(t, "a")
	ups := []relay.Upstream{{Name: "a", BaseURL: a.URL}}
	obs := make([]joinedObserver, len(samplers))
	var hooks []relay.Hooks
	for i, sampler := range samplers {
		reader, mp := meterProvider(t)
		rec := tracetest.NewSpanRecorder()
		opts := []sdktrace.TracerProviderOption{sdktrace.WithSpanProcessor(rec)}
		if sampler != nil {
			opts = append(opts, sdktrace.WithSampler(sampler))
		}
		tp := sdktrace.NewTracerProvider(opts...)
		t.Cleanup(func() { tp.Shutdown(context.Background()) })
		obs[i] = joinedObserver{reader, rec}
		hooks = append(hooks, relayotel.New(relayotel.WithMeterProvider(mp), relayotel.WithTracerProvider(tp), relayotel.WithUpstreams(ups...)).Hooks())
	}
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	r, err := relay.New(relay.Config{Upstreams: ups, Base: tr, Hooks: relay.JoinHooks(hooks...)})
	require.NoError(t, err)
	(&harness{router: r}).chat(t, chatBody("gpt-4.1", false))
	return obs
}

// exemplarSpans returns the span IDs of the exemplars of the metrics reader
// collects, by metric name.
func exemplarSpans(t *testing.T, reader *sdkmetric.ManualReader) map[string][][]byte {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	out := map[string][][]byte{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Histogram[float64]:
				out[m.Name] = appendExemplarSpans(out[m.Name], d.DataPoints, func(p metricdata.HistogramDataPoint[float64]) []metricdata.Exemplar[float64] { return p.Exemplars })
			case metricdata.Sum[float64]:
				out[m.Name] = appendExemplarSpans(out[m.Name], d.DataPoints, func(p metricdata.DataPoint[float64]) []metricdata.Exemplar[float64] { return p.Exemplars })
			case metricdata.Histogram[int64]:
				out[m.Name] = appendExemplarSpans(out[m.Name], d.DataPoints, func(p metricdata.HistogramDataPoint[int64]) []metricdata.Exemplar[int64] { return p.Exemplars })
			case metricdata.Sum[int64]:
				out[m.Name] = appendExemplarSpans(out[m.Name], d.DataPoints, func(p metricdata.DataPoint[int64]) []metricdata.Exemplar[int64] { return p.Exemplars })
			}
		}
	}
	return out
}

// appendExemplarSpans appends the span IDs of the exemplars of points to ids.
func appendExemplarSpans[P any, N int64 | float64](ids [][]byte, points []P, exemplars func(P) []metricdata.Exemplar[N]) [][]byte {
	for _, p := range points {
		for _, e := range exemplars(p) {
			ids = append(ids, e.SpanID)
		}
	}
	return ids
}
