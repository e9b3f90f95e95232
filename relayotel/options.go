package relayotel

import (
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokenrelay/relay"
)

// Option configures an Observer.
type Option func(*config)

type config struct {
	mp        metric.MeterProvider
	tp        trace.TracerProvider
	prop      propagation.TextMapPropagator
	provider  string
	ups       []relay.Upstream
	estimated bool
	router    string
}

// WithMeterProvider sets the MeterProvider. Default: the global one
// (otel.GetMeterProvider).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.mp = mp }
}

// WithTracerProvider sets the TracerProvider. Default: the global one
// (otel.GetTracerProvider).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// WithPropagator sets the propagator that injects the trace context into
// every upstream request. Default: the global one (otel.GetTextMapPropagator)
// if one is set when New runs, else W3C trace context.
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(c *config) { c.prop = p }
}

// WithProviderName sets gen_ai.provider.name. Default: "openai".
func WithProviderName(name string) Option {
	return func(c *config) { c.provider = name }
}

// WithUpstreams gives the router's upstreams, so that server.address and
// server.port name the upstream that answered a call (a Report names it only
// by Upstream.Name). Pass the Config's slice; only names and base URLs are
// kept, never a key. An upstream left out is learned from its first request.
// WithUpstreams also makes relay.breaker.state report every upstream from
// the start, closed.
func WithUpstreams(ups ...relay.Upstream) Option {
	return func(c *config) { c.ups = append(c.ups, ups...) }
}

// WithEstimatedUsage records token counts the router estimated (for an
// answer that came without usage, Usage.Estimated) in
// gen_ai.client.token.usage and the span's gen_ai.usage attributes. The
// GenAI conventions leave out offline counts unless the user asks for them,
// so by default only counts the upstream reported are recorded.
func WithEstimatedUsage() Option {
	return func(c *config) { c.estimated = true }
}

// WithRouterName names the router the Observer observes: every metric it
// records, and each call's span, then carries relay.router=name. Name the
// routers of a service that has several (one for chat, one for
// embeddings), each with its Observer, to tell their series apart: on one
// MeterProvider, Observers that are not named (or named alike) report the
// same attribute sets, which the SDK adds up (relay.breaker.state then
// counts the breakers in each state). Default: no relay.router.
func WithRouterName(name string) Option {
	return func(c *config) { c.router = name }
}
