// Package bench measures what the observers add to a warm router: the
// same calls with no observer, relayotel's, relayprom's, and both. It is a
// module of its own, so that neither observer depends on the other; run it
// outside the workspace:
//
//	cd relayotel/bench && GOWORK=off go test -run '^$' -bench Observed -benchmem
package bench

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

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
			call := func() {
				req, _ := http.NewRequest(http.MethodPost, "http://relay.test/v1/chat/completions", strings.NewReader(reqBody))
				resp, err := r.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
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
