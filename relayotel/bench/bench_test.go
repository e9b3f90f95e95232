// Package bench measures what the observers add to a warm router: the
// same calls with no observer, relayotel's, relayprom's, and both. It is a
// module of its own, so that neither observer depends on the other. The
// README's test command runs its tests (TestFloorRecordsAsRelayotel holds
// the floor to what relayotel records) in the workspace; the figures are
// measured with its own go.mod, outside it:
//
//	cd relayotel/bench && GOWORK=off go test -run '^$' -bench Observed -benchmem
//
// BenchmarkObservedPaired gives the figures the README reports: what both
// observers add, what each adds alone, and the floor (the OpenTelemetry
// SDK's calls alone, floor.call), as paired differences the machine's
// drift does not reach.
package bench

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relayotel"
	"github.com/tokenrelay/relay/relayprom"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

const (
	reqBody = `{"model":"gpt-4.1","messages":[{"role":"user","content":"Say hello to the benchmark."}]}`
	answer  = `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-4.1","choices":[{"index":0,"message":{"role":"assistant","content":"Hello."},"finish_reason":"stop"}],"usage":{"prompt_tokens":14,"completion_tokens":3,"total_tokens":17}}`
)

// base answers every call at once with a fixed body that carries usage.
var base = roundTripFunc(func(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		r.Body.Close()
	}
	return &http.Response{
		StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(strings.NewReader(answer)), ContentLength: int64(len(answer)), Request: r,
	}, nil
})

var upstreams = []relay.Upstream{{Name: "a", BaseURL: "http://a.test/v1"}}

// tracing is how the benchmark's TracerProvider treats spans.
type tracing int

const (
	sampled   tracing = iota // the SDK, every span sampled and handed to a span processor (exporting nowhere)
	unsampled                // the SDK, no span sampled (as most calls under ratio sampling)
	noSDK                    // no SDK installed: the global no-op providers
)

// providers are the SDK's MeterProvider, metrics aggregated for a reader,
// and TracerProvider, tracing as asked (tr is not noSDK), shut down at the
// end of the benchmark.
func providers(b testing.TB, tr tracing) (*sdkmetric.MeterProvider, *sdktrace.TracerProvider) {
	sampler := sdktrace.AlwaysSample()
	if tr == unsampled {
		sampler = sdktrace.NeverSample()
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sampler)),
		sdktrace.WithSpanProcessor(sdktrace.NewSimpleSpanProcessor(tracetest.NewNoopExporter())))
	b.Cleanup(func() {
		mp.Shutdown(context.Background())
		tp.Shutdown(context.Background())
	})
	return mp, tp
}

// otelHooks is relayotel with metrics aggregated by the SDK for a reader
// (but with noSDK) and tracing as asked.
func otelHooks(b testing.TB, tr tracing) relay.Hooks {
	if tr == noSDK {
		return relayotel.New(relayotel.WithUpstreams(upstreams...)).Hooks()
	}
	mp, tp := providers(b, tr)
	return relayotel.New(relayotel.WithMeterProvider(mp), relayotel.WithTracerProvider(tp), relayotel.WithUpstreams(upstreams...)).Hooks()
}

func promHooks() relay.Hooks {
	c := relayprom.New(relayprom.WithUpstreams(upstreams...), relayprom.WithModels("gpt-4.1"))
	prometheus.NewRegistry().MustRegister(c)
	return c.Hooks()
}

// BenchmarkObserved: warm calls through the router over an in-memory base,
// with no observer, relayotel (every span sampled and processed), relayprom,
// and both joined; floor is the router with no observer, each call followed
// by the SDK calls alone that an observer following the GenAI conventions
// makes (floor.call).
func BenchmarkObserved(b *testing.B) { benchObserved(b, sampled) }

// BenchmarkObservedUnsampled: the same with spans not sampled.
func BenchmarkObservedUnsampled(b *testing.B) { benchObserved(b, unsampled) }

// BenchmarkObservedNoSDK: the same with no OpenTelemetry SDK installed.
func BenchmarkObservedNoSDK(b *testing.B) { benchObserved(b, noSDK) }

func benchObserved(b *testing.B, tr tracing) {
	for _, c := range []struct {
		name  string
		hooks func(*testing.B) relay.Hooks
	}{
		{"none", func(*testing.B) relay.Hooks { return relay.Hooks{} }},
		{"otel", func(b *testing.B) relay.Hooks { return otelHooks(b, tr) }},
		{"prom", func(*testing.B) relay.Hooks { return promHooks() }},
		{"both", func(b *testing.B) relay.Hooks { return relay.JoinHooks(otelHooks(b, tr), promHooks()) }},
		{"floor", nil},
	} {
		b.Run(c.name, func(b *testing.B) {
			var call func()
			if c.hooks != nil {
				call = caller(b, router(b, c.hooks(b)))
			} else {
				call = floorCaller(b, tr)
			}
			for range 100 { // warm: memo, caches, label sets
				call()
			}
			b.ReportAllocs()
			cpu := cpuTime()
			for b.Loop() {
				call()
			}
			if d := cpuTime() - cpu; d > 0 {
				b.ReportMetric(float64(d.Nanoseconds())/float64(b.N), "cpu-ns/op")
			}
		})
	}
}

// caller returns a function that makes one warm call through r.
func caller(b testing.TB, r *relay.Router) func() {
	return func() {
		req, _ := http.NewRequest(http.MethodPost, "http://relay.test/v1/chat/completions", strings.NewReader(reqBody))
		// The headers an SDK sends (go-openai's): the outgoing request's
		// header map is then in use before any observer adds its trace
		// context to it, as in production.
		req.Header = http.Header{
			"Authorization": {"Bearer sk-bench"},
			"Content-Type":  {"application/json"},
			"Accept":        {"application/json"},
		}
		resp, err := r.RoundTrip(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// BenchmarkObservedPaired measures what observing adds as paired
// differences, which the machine's drift does not reach: batches of 64
// calls alternate between a base (a bare router, but in aboveFloor) and an
// observed side, each first half the time, and the reported added-ns/op
// is the median over the pairs of (observed batch - base batch) / 64, in
// wall time. ns/op covers one call of each side. The rows:
//
//   - control: two bare routers;
//   - unsampled: both observers joined, the SDK installed, no span sampled;
//   - floor: the bare router and then the SDK calls alone (floor.call)
//     that an observer following the GenAI conventions makes per call, no
//     relay code, spans not sampled: the least that observing with this
//     SDK can add;
//   - aboveFloor: both observers (unsampled) against the bare router with
//     the floor's calls: what relay's own code adds above the floor,
//     relayprom's included;
//   - otel, prom: each observer alone (otel unsampled);
//   - noSDK: both observers, no SDK installed (the API's no-ops);
//   - sampled: both observers, every span sampled and processed.
func BenchmarkObservedPaired(b *testing.B) {
	bare := func(b *testing.B) func() { return caller(b, router(b, relay.Hooks{})) }
	observed := func(hooks func(*testing.B) relay.Hooks) func(*testing.B) func() {
		return func(b *testing.B) func() { return caller(b, router(b, hooks(b))) }
	}
	both := func(tr tracing) func(*testing.B) relay.Hooks {
		return func(b *testing.B) relay.Hooks { return relay.JoinHooks(otelHooks(b, tr), promHooks()) }
	}
	withFloor := func(b *testing.B) func() { return floorCaller(b, unsampled) }
	for _, c := range []struct {
		name      string
		base, obs func(*testing.B) func()
	}{
		{"control", bare, bare},
		{"unsampled", bare, observed(both(unsampled))},
		{"floor", bare, withFloor},
		{"aboveFloor", withFloor, observed(both(unsampled))},
		{"otel", bare, observed(func(b *testing.B) relay.Hooks { return otelHooks(b, unsampled) })},
		{"prom", bare, observed(func(*testing.B) relay.Hooks { return promHooks() })},
		{"noSDK", bare, observed(both(noSDK))},
		{"sampled", bare, observed(both(sampled))},
	} {
		b.Run(c.name, func(b *testing.B) {
			callBase, callObs := c.base(b), c.obs(b)
			for range 100 {
				callBase()
				callObs()
			}
			const batch = 64
			var diffs []float64
			timed := func(call func()) time.Duration {
				t := time.Now()
				for range batch {
					call()
				}
				return time.Since(t)
			}
			for i := 0; b.Loop(); i++ {
				var dBase, dObs time.Duration
				if i%2 == 0 { // each order half the time
					dBase, dObs = timed(callBase), timed(callObs)
				} else {
					dObs, dBase = timed(callObs), timed(callBase)
				}
				diffs = append(diffs, float64(dObs-dBase)/batch)
			}
			if len(diffs) > 0 {
				slices.Sort(diffs)
				b.ReportMetric(diffs[len(diffs)/2], "added-ns/op")
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}

// router is a router to the benchmark's base with hooks.
func router(b testing.TB, hooks relay.Hooks) *relay.Router {
	r, err := relay.New(relay.Config{Upstreams: upstreams, Base: base, Hooks: hooks})
	if err != nil {
		b.Fatal(err)
	}
	return r
}
