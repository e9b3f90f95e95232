package bench

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/metric/metricdata/metricdatatest"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/semconv/v1.41.0/genaiconv"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relayotel"
)

// floor is what an OpenTelemetry observer that follows the GenAI
// conventions as relayotel does cannot avoid on a call with this SDK, and
// nothing else: start and end the call's client span, inject its trace
// context into the upstream request's header, and record
// gen_ai.client.operation.duration, gen_ai.client.token.usage (input and
// output) and relay.client.overhead, with the attribute sets and options
// relayotel passes for a call of the benchmark, built once. No relay code
// runs in it; TestFloorRecordsAsRelayotel checks that it records what
// relayotel records.
type floor struct {
	tracer   trace.Tracer
	prop     propagation.TextMapPropagator
	start    []trace.SpanStartOption
	duration metric.Float64Histogram
	tokens   metric.Int64Histogram
	overhead metric.Float64Histogram

	durationOpts, inputOpts, outputOpts, overheadOpts []metric.RecordOption

	carrier slotCarrier
}

// The conventions' bucket boundaries, and relay's for its overhead, as
// relayotel's instruments.go has them.
var (
	durationBounds = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}
	tokenBounds    = []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864}
	overheadBounds = []float64{0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01}
)

// scope is relayotel's instrumentation scope.
const scope = "github.com/tokenrelay/relay/relayotel"

// floorCaller returns a function that makes one warm call through a bare
// router and then the floor's SDK calls, with the SDK's providers traced
// as tr asks (with noSDK, the global no-op ones).
func floorCaller(b testing.TB, tr tracing) func() {
	call := caller(b, router(b, relay.Hooks{}))
	var (
		mp metric.MeterProvider = otel.GetMeterProvider()
		tp trace.TracerProvider = otel.GetTracerProvider()
	)
	if tr != noSDK {
		mp, tp = providers(b, tr)
	}
	f := newFloor(b, mp, tp)
	ctx := context.Background()
	return func() {
		call()
		f.call(ctx)
	}
}

// newFloor makes the floor's instruments on mp and tracer on tp, as
// relayotel.New does, and the attribute sets of the benchmark's call
// (chat with gpt-4.1 to upstream "a" at a.test:80, as reqBody and answer
// say), as relayotel builds them the first time.
func newFloor(b testing.TB, mp metric.MeterProvider, tp trace.TracerProvider) *floor {
	m := mp.Meter(scope, metric.WithSchemaURL(semconv.SchemaURL))
	var (
		dur genaiconv.ClientOperationDuration
		tok genaiconv.ClientTokenUsage
		err error
		f   = &floor{tracer: tp.Tracer(scope, trace.WithSchemaURL(semconv.SchemaURL)), prop: propagation.TraceContext{}}
	)
	if f.duration, err = m.Float64Histogram(dur.Name(), metric.WithUnit(dur.Unit()), metric.WithDescription(dur.Description()),
		metric.WithExplicitBucketBoundaries(durationBounds...)); err != nil {
		b.Fatal(err)
	}
	if f.tokens, err = m.Int64Histogram(tok.Name(), metric.WithUnit(tok.Unit()), metric.WithDescription(tok.Description()),
		metric.WithExplicitBucketBoundaries(tokenBounds...)); err != nil {
		b.Fatal(err)
	}
	if f.overhead, err = m.Float64Histogram("relay.client.overhead", metric.WithUnit("s"),
		metric.WithDescription("Time a call spent in the router itself, upstream calls and waits excluded."),
		metric.WithExplicitBucketBoundaries(overheadBounds...)); err != nil {
		b.Fatal(err)
	}
	op, provider := semconv.GenAIOperationNameKey.String("chat"), semconv.GenAIProviderNameKey.String("openai")
	f.start = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(op, provider, semconv.OpenAIAPITypeChatCompletions)}
	base := []attribute.KeyValue{op, provider,
		semconv.GenAIRequestModelKey.String("gpt-4.1"), semconv.GenAIResponseModelKey.String("gpt-4.1"),
		semconv.ServerAddress("a.test"), semconv.ServerPort(80)}
	with := func(kv ...attribute.KeyValue) []metric.RecordOption {
		return []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(append(append([]attribute.KeyValue(nil), base...), kv...)...))}
	}
	f.durationOpts = with()
	f.inputOpts = with(semconv.GenAITokenTypeInput)
	f.outputOpts = with(semconv.GenAITokenTypeOutput)
	f.overheadOpts = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(op))}
	f.carrier.h = http.Header{}
	return f
}

// The values the floor records: of the order of the benchmark's calls'.
const (
	floorLatency  = 10 * time.Microsecond
	floorOverhead = 5 * time.Microsecond
	floorInput    = 14 // answer's usage
	floorOutput   = 3
)

// call is one call's SDK work: what relayotel's onRequest, onAttempt and
// onReport hand the SDK.
func (f *floor) call(ctx context.Context) {
	ctx, span := f.tracer.Start(ctx, "chat", f.start...)
	f.prop.Inject(ctx, &f.carrier)
	f.duration.Record(ctx, floorLatency.Seconds(), f.durationOpts...)
	f.tokens.Record(ctx, floorInput, f.inputOpts...)
	f.tokens.Record(ctx, floorOutput, f.outputOpts...)
	f.overhead.Record(ctx, floorOverhead.Seconds(), f.overheadOpts...)
	span.End()
}

// slotCarrier sets the traceparent header as the least a carrier can: its
// value slice is the carrier's own, so that setting it allocates nothing
// (as relayotel's carrier for a call's first attempt does); the SDK's
// work, formatting the value, is all that is left.
type slotCarrier struct {
	h http.Header
	v [1]string
}

func (c *slotCarrier) Get(key string) string { return propagation.HeaderCarrier(c.h).Get(key) }
func (c *slotCarrier) Keys() []string        { return propagation.HeaderCarrier(c.h).Keys() }

func (c *slotCarrier) Set(key, value string) {
	if key == "traceparent" {
		c.v[0] = value
		c.h["Traceparent"] = c.v[:]
		return
	}
	http.Header(c.h).Set(key, value)
}

// TestFloorRecordsAsRelayotel: the floor's SDK calls are the ones relayotel
// makes for the benchmark's call: the same instruments (name, unit,
// description, bounds) in the same scope, the same attribute sets and
// counts, the same token values, the span started with the same kind and
// attributes, a traceparent of the same span context's flags.
func TestFloorRecordsAsRelayotel(t *testing.T) {
	type observed struct {
		metrics metricdata.ResourceMetrics
		span    sdktrace.ReadOnlySpan
		header  http.Header
	}
	observe := func(t *testing.T, sample bool, run func(mp metric.MeterProvider, tp trace.TracerProvider) http.Header) observed {
		reader, rec := sdkmetric.NewManualReader(), tracetest.NewSpanRecorder()
		sampler := sdktrace.NeverSample()
		if sample {
			sampler = sdktrace.AlwaysSample()
		}
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler), sdktrace.WithSpanProcessor(rec))
		defer mp.Shutdown(context.Background())
		defer tp.Shutdown(context.Background())
		var o observed
		o.header = run(mp, tp)
		require.NoError(t, reader.Collect(context.Background(), &o.metrics))
		if sample { // the call's span: the one without a parent (an attempt's has the call's)
			spans := rec.Ended()
			i := slices.IndexFunc(spans, func(s sdktrace.ReadOnlySpan) bool { return !s.Parent().IsValid() })
			require.GreaterOrEqual(t, i, 0)
			o.span = spans[i]
		}
		return o
	}
	viaRelayotel := func(mp metric.MeterProvider, tp trace.TracerProvider) http.Header {
		var out http.Header
		hooks := relayotel.New(relayotel.WithMeterProvider(mp), relayotel.WithTracerProvider(tp), relayotel.WithUpstreams(upstreams...)).Hooks()
		r, err := relay.New(relay.Config{Upstreams: upstreams, Hooks: hooks,
			Base: roundTripFunc(func(req *http.Request) (*http.Response, error) {
				out = req.Header.Clone()
				return base.RoundTrip(req)
			})})
		require.NoError(t, err)
		caller(t, r)()
		return out
	}
	viaFloor := func(mp metric.MeterProvider, tp trace.TracerProvider) http.Header {
		f := newFloor(t, mp, tp)
		f.call(context.Background())
		return f.carrier.h
	}
	for _, sample := range []bool{false, true} {
		t.Run(map[bool]string{false: "unsampled", true: "sampled"}[sample], func(t *testing.T) {
			want, got := observe(t, sample, viaRelayotel), observe(t, sample, viaFloor)

			// The metrics: those of the floor, as relayotel records them.
			require.Len(t, got.metrics.ScopeMetrics, 1)
			gotScope := got.metrics.ScopeMetrics[0]
			require.Len(t, gotScope.Metrics, 3)
			var wantScope *metricdata.ScopeMetrics
			for i, sm := range want.metrics.ScopeMetrics {
				if sm.Scope.Name == scope {
					wantScope = &want.metrics.ScopeMetrics[i]
				}
			}
			require.NotNil(t, wantScope)
			assert.Equal(t, wantScope.Scope, gotScope.Scope)
			for _, g := range gotScope.Metrics {
				i := slices.IndexFunc(wantScope.Metrics, func(m metricdata.Metrics) bool { return m.Name == g.Name })
				require.GreaterOrEqual(t, i, 0, g.Name)
				w := wantScope.Metrics[i]
				if g.Name != "gen_ai.client.token.usage" { // durations: not the same values
					w, g = timeless(t, w), timeless(t, g)
				}
				opts := []metricdatatest.Option{metricdatatest.IgnoreTimestamp()}
				if sample { // exemplars of other spans: compared by number
					opts = append(opts, metricdatatest.IgnoreExemplars())
					assert.Equal(t, exemplars(w), exemplars(g), g.Name)
				}
				metricdatatest.AssertEqual(t, w, g, opts...)
			}

			// The trace context: a traceparent with the call's span
			// context's flags.
			wantTP, gotTP := want.header.Get("Traceparent"), got.header.Get("Traceparent")
			require.Len(t, gotTP, 55)
			require.Len(t, wantTP, 55)
			assert.Equal(t, wantTP[52:], gotTP[52:], "flags")

			// The span: started as relayotel starts the call's.
			if !sample {
				return
			}
			assert.Equal(t, want.span.SpanKind(), got.span.SpanKind())
			for _, kv := range got.span.Attributes() {
				assert.Contains(t, want.span.Attributes(), kv)
			}
			assert.Equal(t, want.span.InstrumentationScope(), got.span.InstrumentationScope())
		})
	}
}

// timeless is a float histogram m with its values left out: what is left
// is its instrument, its data points' attribute sets and bounds, and how
// many values each has.
func timeless(t *testing.T, m metricdata.Metrics) metricdata.Metrics {
	h, ok := m.Data.(metricdata.Histogram[float64])
	require.True(t, ok, m.Name)
	points := slices.Clone(h.DataPoints)
	for i := range points {
		p := &points[i]
		p.Sum, p.Min, p.Max, p.BucketCounts = 0, metricdata.Extrema[float64]{}, metricdata.Extrema[float64]{}, nil
	}
	h.DataPoints = points
	m.Data = h
	return m
}

// exemplars is how many exemplars each data point of a histogram m has.
func exemplars(m metricdata.Metrics) []int {
	var n []int
	switch h := m.Data.(type) {
	case metricdata.Histogram[float64]:
		for _, p := range h.DataPoints {
			n = append(n, len(p.Exemplars))
		}
	case metricdata.Histogram[int64]:
		for _, p := range h.DataPoints {
			n = append(n, len(p.Exemplars))
		}
	}
	return n
}
