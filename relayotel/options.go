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
	models    []string
	limit     int // WithModelLimit
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
// the start, closed, and the models the upstreams list (Upstream.Models)
// known to the metrics, as WithModels does.
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

// WithModels names models the metrics record as themselves in
// gen_ai.request.model and gen_ai.response.model: those your Policy routes
// to and falls back to, and the names your callers ask for. The models the
// upstreams given to WithUpstreams list are named too.
//
// A model neither named nor learned (see WithModelLimit) is recorded as
// "_OTHER", so that the names callers make up cannot add attribute sets
// without end and push the real ones into the SDK's overflow set. Spans
// carry every model as asked; a call's span is named by its operation
// alone ("chat") when its model is "_OTHER" in the metrics.
func WithModels(names ...string) Option {
	return func(c *config) { c.models = append(c.models, names...) }
}

// WithModelLimit sets how many models not named (WithModels,
// WithUpstreams) the Observer learns, each the first time a call shows it
// to be real: an upstream was called with it and did not refuse the call
// as a client error (a 4xx other than 429). The name a caller asked for
// is learned only when it is the one sent upstream (not when a Policy
// replaced it). A name no upstream serves, one an upstream does not know
// (404) and one of a call that reached no upstream are not learned, and
// once n are learned, no more are. Default: 32, as relayprom's. 0 learns
// none: the metrics record only the named models.
func WithModelLimit(n int) Option {
	return func(c *config) { c.limit = n }
}
