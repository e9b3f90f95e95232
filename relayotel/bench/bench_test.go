// Package bench measures what the observers add to a warm router: the
// same calls with no observer, relayotel's, relayprom's, and both. It is a
// module of its own, so that neither observer depends on the other; run it
// outside the workspace:
//
//	cd relayotel/bench && GOWORK=off go test -run '^$' -bench Observed -benchmem
//
// BenchmarkObservedPaired gives the figure the README reports: what both
// observers add, as a paired difference the machine's drift does not reach.
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

// otelHooks is relayotel with metrics aggregated by the SDK for a reader
// (but with noSDK) and tracing as asked.
func otelHooks(b *testing.B, tr tracing) relay.Hooks {
	if tr == noSDK {
		return relayotel.New(relayotel.WithUpstreams(upstreams...)).Hooks()
	}
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
	return relayotel.New(relayotel.WithMeterProvider(mp), relayotel.WithTracerProvider(tp), relayotel.WithUpstreams(upstreams...)).Hooks()
}

func promHooks() relay.Hooks {
	c := relayprom.New(relayprom.WithUpstreams(upstreams...), relayprom.WithModels("gpt-4.1"))
	prometheus.NewRegistry().MustRegister(c)
	return c.Hooks()
}

// BenchmarkObserved: warm calls through the router over an in-memory base,
// with no observer, relayotel (every span sampled and processed), relayprom,
// and both joined.
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
	} {
		b.Run(c.name, func(b *testing.B) {
			r, err := relay.New(relay.Config{Upstreams: upstreams, Base: base, Hooks: c.hooks(b)})
			if err != nil {
				b.Fatal(err)
			}
			call := caller(b, r)
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
func caller(b *testing.B, r *relay.Router) func() {
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

// BenchmarkObservedPaired measures what both observers add as a paired
// difference, which the machine's drift does not reach: batches of 64
// calls alternate between a bare router and one with both observers (the
// SDK installed, spans sampled as asked), and the reported added-ns/op is
// the median over the pairs of (observed batch − bare batch) / 64, in
// process CPU time. ns/op covers one call of each router.
func BenchmarkObservedPaired(b *testing.B) {
	for _, c := range []struct {
		name string
		tr   tracing
	}{{"control", -1}, {"unsampled", unsampled}, {"noSDK", noSDK}, {"sampled", sampled}} {
		b.Run(c.name, func(b *testing.B) {
			bare, err := relay.New(relay.Config{Upstreams: upstreams, Base: base})
			if err != nil {
				b.Fatal(err)
			}
			var hooks relay.Hooks
			if c.tr >= 0 {
				hooks = relay.JoinHooks(otelHooks(b, c.tr), promHooks())
			}
			obs, err := relay.New(relay.Config{Upstreams: upstreams, Base: base, Hooks: hooks})
			if err != nil {
				b.Fatal(err)
			}
			callBare, callObs := caller(b, bare), caller(b, obs)
			for range 100 {
				callBare()
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
				var dBare, dObs time.Duration
				if i%2 == 0 { // each order half the time
					dBare, dObs = timed(callBare), timed(callObs)
				} else {
					dObs, dBare = timed(callObs), timed(callBare)
				}
				diffs = append(diffs, float64(dObs-dBare)/batch)
			}
			if len(diffs) > 0 {
				slices.Sort(diffs)
				b.ReportMetric(diffs[len(diffs)/2], "added-ns/op")
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}
