// Package relayprom exports what a relay.Router does as Prometheus metrics:
// a prometheus.Collector fed by the router's hooks.
//
//	prom := relayprom.New(relayprom.WithUpstreams(upstreams...), relayprom.WithModels("gpt-4.1"))
//	prometheus.MustRegister(prom)
//	router, err := relay.New(relay.Config{Upstreams: upstreams, Hooks: prom.Hooks()})
//
// # Metrics
//
//	relay_requests_total              counter    upstream, model, bucket, status   calls, by the final status class ("2xx" … "5xx", "none" when no response came)
//	relay_errors_total                counter    upstream, model, type             failed calls, by error type
//	relay_tokens_total                counter    upstream, model, type             tokens billed: type "input", "output", and the parts of them "cache_read" (of input) and "reasoning" (of output)
//	relay_cost_usd_total              counter    upstream, model                   cost in US dollars, after each upstream's price factor
//	relay_request_duration_seconds    histogram  upstream, model                   RoundTrip start to body done
//	relay_ttft_seconds                histogram  upstream, model                   streams: time to the first content chunk
//	relay_attempts_total              counter    upstream, outcome                 upstream calls, hedges included
//	relay_retries_total               counter    upstream, reason                  calls made again after a failed one: the failed one's upstream and outcome
//	relay_hedges_total                counter    result                            hedges sent: "won" when the hedge's answer was returned, else "lost"
//	relay_overhead_seconds            histogram                                    the router's own time per call, upstream calls and waits excluded
//	relay_limiter_wait_seconds        histogram  upstream, reason                  waits for an upstream's rate limits ("rate") or in-flight slot ("slot")
//	relay_breaker_state               gauge      upstream, state                   1 for each upstream's current breaker state, 0 for the others ("closed", "open", "half_open")
//	relay_breaker_transitions_total   counter    upstream, state                   breaker state changes, by the new state
//	relay_budget_spend_total          counter    budget, currency                  spend charged to each budget's ledgers, in the billing currency
//	relay_budget_refusals_total       counter    budget                            requests a budget refused, no upstream called
//	relay_state_fallbacks_total       counter    operation                         shared-state calls that failed, decided in-process ("admit", "refund", "observe", "reserve", "settle", "usage")
//
// Token counts include those the router estimated for an answer without
// usage, as the cost does. Sum type="input" and type="output" for totals:
// "cache_read" and "reasoning" are parts of them.
//
// # Cardinality
//
// Every label has a bounded set of values. Upstreams are the ones given to
// New (WithUpstreams), and so are budgets (WithBudgets); buckets are
// "short", "mid", "long" and those given with WithBuckets. Models are those
// given (WithModels, and the Models of the upstreams given), and up to 32
// more (WithModelLimit) that the Collector learns, each the first time a
// call shows it to be real (an upstream was called with it and did not
// refuse it as a client error), as relayotel does: with nothing
// configured, the models a service uses label its metrics by name, while a
// made-up name no upstream serves, or one an upstream does not know (404),
// is "other". Any other value is "other", and
// a missing one (no upstream reached, no model in the request) is "none".
// Outcomes, reasons and error types are the fixed classifications below;
// the only open-ended part, an HTTP status code, is at most three digits.
//
// An attempt's outcome (and a retry's reason, the outcome of the attempt it
// follows) is a status class ("2xx", "4xx", "429", "5xx") or an error kind
// ("timeout", "attempt_timeout", "canceled", "deadline_exceeded",
// "connection", "_OTHER"; for a stream failed over before its first content
// "first_token_timeout", "stream_error", "stream_malformed",
// "stream_stalled"). A retry after a 2xx follows a bad answer
// (RetryConfig.BadAnswerFallbacks) or a custom ShouldRetry. An error type
// is the status code ("503") of an error response, or one of
// "no_upstream", "body_too_large", "rate_limited", "circuit_open",
// "attempt_timeout", "first_token_timeout", "stream_stalled",
// "stream_error", "stream_malformed", "canceled", "deadline_exceeded",
// "timeout", "connection", "_OTHER".
package relayprom
