// Package relayotel reports what a relay.Router does to OpenTelemetry: one
// client span per RoundTrip with a child span per upstream call, the W3C
// trace context on every upstream request, and the metrics of the
// OpenTelemetry GenAI semantic conventions (semconv v1.41.0) beside relay's
// own.
//
//	obs := relayotel.New(relayotel.WithUpstreams(upstreams...))
//	router, err := relay.New(relay.Config{Upstreams: upstreams, Hooks: obs.Hooks()})
//
// # Spans
//
// A RoundTrip is one span of kind client, started when RoundTrip starts and
// ended when the response body ends (when the Report is made), not when the
// headers arrive. It is named "{gen_ai.operation.name} {gen_ai.request.model}"
// (e.g. "chat gpt-4.1"), or by the operation alone ("chat") when the
// metrics record its model as "_OTHER" (see Models below), and carries
// gen_ai.operation.name, gen_ai.provider.name, gen_ai.request.model,
// gen_ai.response.model,
// gen_ai.request.stream, gen_ai.response.time_to_first_chunk (streams),
// gen_ai.usage.input_tokens, gen_ai.usage.output_tokens,
// gen_ai.usage.cache_read.input_tokens, gen_ai.usage.reasoning.output_tokens,
// openai.api.type (provider "openai"), server.address and server.port of the
// upstream that answered, http.response.status_code, and relay's own:
// relay.upstream, relay.bucket, relay.attempts, relay.cost_usd (priced
// models), relay.hedged, relay.hedge_won, relay.usage.estimated and
// relay.router (WithRouterName). A failed call has status Error and
// error.type. Spans carry the models as asked and routed, whatever the
// metrics record.
//
// Each upstream call is a child span "relay.attempt" with relay.upstream,
// gen_ai.request.model (the model asked of that upstream),
// relay.attempt.number, relay.attempt.hedge, server.address, server.port,
// relay.wait.duration and relay.wait.reason (when it waited for the
// upstream's limits), http.response.status_code, and error.type on failure.
// Its context is injected into the upstream request (traceparent), so the
// upstream's own spans hang under the attempt. A call whose span is not
// sampled gets no attempt spans (no standard sampler would sample them) and
// sends its own context, marked not sampled.
//
// Requests to paths relay does not route by model (GET /models, files) get a
// span named by their method and no GenAI metrics.
//
// # Metrics
//
// The GenAI conventions, with their recommended bucket boundaries:
//
//	gen_ai.client.operation.duration              histogram  s        per call; error.type when it failed
//	gen_ai.client.token.usage                     histogram  {token}  one record per gen_ai.token.type (input, output)
//	gen_ai.client.operation.time_to_first_chunk   histogram  s        streams only
//
// with gen_ai.operation.name, gen_ai.provider.name, gen_ai.request.model,
// gen_ai.response.model, server.address and server.port. Token counts are
// the billed ones the upstream reported; counts the router estimated (an
// answer without usage) are left out unless WithEstimatedUsage.
//
// Relay's own:
//
//	relay.client.cost          counter        {USD}            gen_ai.operation.name, gen_ai.request.model, gen_ai.response.model, relay.upstream, relay.bucket
//	relay.client.attempts      counter        {attempt}        relay.upstream, relay.attempt.outcome, relay.attempt.hedge
//	relay.client.retries       counter        {retry}          relay.upstream (the one that failed), relay.retry.reason
//	relay.client.hedges        counter        {hedge}          relay.hedge.result (won, lost)
//	relay.client.overhead      histogram      s                gen_ai.operation.name
//	relay.limiter.wait         histogram      s                relay.upstream, relay.wait.reason, error.type
//	relay.breaker.state        updowncounter  1                relay.upstream, relay.breaker.state: 1 for the current state, 0 for the others
//	relay.breaker.transitions  counter        {transition}     relay.upstream, relay.breaker.state (the new state)
//	relay.budget.spend         counter        {currency_unit}  relay.budget, relay.budget.currency
//	relay.budget.refusals      counter        {request}        relay.budget (the one that refused)
//	relay.state.fallbacks      counter        {call}           relay.state.operation
//
// relay.client.cost and relay.client.attempts, which every call adds to,
// are observable counters: the Observer keeps their totals per attribute
// set (at most 4,096 each; further sets add to otel.metric.overflow=true)
// and reports them at each collection as monotonic cumulative sums, so a
// call pays an atomic add instead of an SDK Add. They carry no exemplars.
//
// An attempt's outcome (and a retry's reason, the outcome of the attempt it
// follows) is a status class ("2xx", "4xx", "429", "5xx") or an error kind
// ("timeout", "attempt_timeout", "canceled", "deadline_exceeded",
// "connection", "_OTHER"; for a stream failed over before its first content
// "first_token_timeout", "stream_error", "stream_malformed",
// "stream_stalled"). A retry after a 2xx follows a bad answer
// (RetryConfig.BadAnswerFallbacks) or a custom ShouldRetry. error.type is
// the status code ("503") of an error response, or one of "no_upstream",
// "body_too_large", "rate_limited", "circuit_open", "attempt_timeout",
// "first_token_timeout", "stream_stalled", "stream_error",
// "stream_malformed", "canceled", "deadline_exceeded", "timeout",
// "connection", "_OTHER".
//
// # Models
//
// The model names in the metrics (gen_ai.request.model and
// gen_ai.response.model, in the GenAI metrics and relay.client.cost) are
// bounded, since callers choose them: a gateway that forwards its callers'
// "model" would otherwise make an attribute set per made-up name, and past
// the SDK's cardinality limit (2,000 sets per instrument by default) the
// real models' new sets would go to its overflow set. The metrics record
// as themselves the models named with WithModels and listed by the
// upstreams given to WithUpstreams (Upstream.Models), and up to 32 more
// (WithModelLimit) that the Observer learns, each the first time a call
// shows it to be real: an upstream was called with it and did not refuse
// the call as a client error (a 4xx other than 429). A name a Policy
// replaced (an alias, a fallback) was not sent, so it is not learned from
// the call: name your aliases with WithModels. Any other model is
// "_OTHER", the value the conventions give an attribute outside its known
// set (as error.type and http.request.method do). So with nothing
// configured, the models a service uses are recorded by name, and a name
// no upstream serves, one an upstream does not know (404), or one past the
// limit is "_OTHER"; until a model has been learned, its calls refused
// before reaching an upstream (by a budget, open circuits) are "_OTHER"
// too. Spans keep the names as asked.
// relayprom learns models the same way, with the same default of 32.
// WithModelLimit(0) records only the named models.
//
// # Several routers
//
// A service with several routers (one for chat, one for embeddings) gives
// each its Observer, named with WithRouterName: every metric of that
// Observer, and each call's span, then carries relay.router, so that
// Observers on one MeterProvider report apart. Unnamed (or named alike),
// they report the same attribute sets, which add up: the counters sum,
// and relay.breaker.state, an up-down counter (as the conventions' own
// state metric, hw.status, is), counts the breakers in each state (two
// routers with an upstream "a", one breaker open and one closed: 1 and 1).
// An Observer keeps one breaker state per upstream name, so routers whose
// upstream names repeat need an Observer each.
//
// An Observer registers callbacks with its MeterProvider for its observed
// instruments. When its router is replaced (a configuration reload),
// Close unregisters its breaker-state callback, else the provider keeps
// reporting the old router's breakers; the cost and attempt totals stay
// reported, so those counters never go backwards (the new Observer's
// totals add to them).
package relayotel
