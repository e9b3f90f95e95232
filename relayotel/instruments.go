package relayotel

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/semconv/v1.41.0/genaiconv"
)

// Bucket boundaries. The GenAI conventions recommend durationBounds for
// operation durations and times to first chunk, and tokenBounds for token
// counts.
var (
	durationBounds = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}
	tokenBounds    = []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864}
	// waitBounds spans limiter waits, up to Limits.MaxWait and beyond.
	waitBounds = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
	// overheadBounds spans the router's own time per call: microseconds.
	overheadBounds = []float64{0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01}
)

type instruments struct {
	// The GenAI conventions.
	duration metric.Float64Histogram // gen_ai.client.operation.duration
	tokens   metric.Int64Histogram   // gen_ai.client.token.usage
	ttfc     metric.Float64Histogram // gen_ai.client.operation.time_to_first_chunk

	// Relay's own.
	// relay.client.cost and relay.client.attempts are observed from their
	// totals (sums) at each collection.
	cost        metric.Float64ObservableCounter
	attempts    metric.Int64ObservableCounter
	retries     metric.Int64Counter     // relay.client.retries
	hedges      metric.Int64Counter     // relay.client.hedges
	overhead    metric.Float64Histogram // relay.client.overhead
	wait        metric.Float64Histogram // relay.limiter.wait
	transitions metric.Int64Counter     // relay.breaker.transitions
	// relay.breaker.state is observed from breakers at each collection.
	spend     metric.Float64Counter // relay.budget.spend
	refusals  metric.Int64Counter   // relay.budget.refusals
	fallbacks metric.Int64Counter   // relay.state.fallbacks

	// breakerReg is relay.breaker.state's callback, which Observer.Close
	// unregisters. The cost and attempt totals' callback stays: their
	// counters are monotonic, and the SDK adds the totals of Observers
	// that share an attribute set (a router replaced by one of the same
	// name), so dropping a closed Observer's totals would make the
	// series go backwards.
	breakerReg metric.Registration
}

func newInstruments(mp metric.MeterProvider, b *breakers, costs, attempts *sums) instruments {
	m := mp.Meter(scope, metric.WithSchemaURL(semconv.SchemaURL))
	var (
		in  instruments
		nop = noop.Meter{}
	)
	f64h := func(name, unit, desc string, bounds []float64) metric.Float64Histogram {
		return instrument[metric.Float64Histogram, metric.Float64HistogramOption](m.Float64Histogram, nop.Float64Histogram, name,
			metric.WithUnit(unit), metric.WithDescription(desc), metric.WithExplicitBucketBoundaries(bounds...))
	}
	f64c := func(name, unit, desc string) metric.Float64Counter {
		return instrument[metric.Float64Counter, metric.Float64CounterOption](m.Float64Counter, nop.Float64Counter, name, metric.WithUnit(unit), metric.WithDescription(desc))
	}
	i64c := func(name, unit, desc string) metric.Int64Counter {
		return instrument[metric.Int64Counter, metric.Int64CounterOption](m.Int64Counter, nop.Int64Counter, name, metric.WithUnit(unit), metric.WithDescription(desc))
	}

	var (
		dur  genaiconv.ClientOperationDuration
		tok  genaiconv.ClientTokenUsage
		ttfc genaiconv.ClientOperationTimeToFirstChunk
	)
	in.duration = f64h(dur.Name(), dur.Unit(), dur.Description(), durationBounds)
	in.tokens = instrument[metric.Int64Histogram, metric.Int64HistogramOption](m.Int64Histogram, nop.Int64Histogram, tok.Name(), metric.WithUnit(tok.Unit()),
		metric.WithDescription(tok.Description()), metric.WithExplicitBucketBoundaries(tokenBounds...))
	in.ttfc = f64h(ttfc.Name(), ttfc.Unit(), ttfc.Description(), durationBounds)

	in.cost = instrument[metric.Float64ObservableCounter, metric.Float64ObservableCounterOption](m.Float64ObservableCounter, nop.Float64ObservableCounter,
		"relay.client.cost", metric.WithUnit("{USD}"),
		metric.WithDescription("Cost of the calls in US dollars, after each upstream's price factor; a hedge's losing call that completed is included."))
	in.attempts = instrument[metric.Int64ObservableCounter, metric.Int64ObservableCounterOption](m.Int64ObservableCounter, nop.Int64ObservableCounter,
		"relay.client.attempts", metric.WithUnit("{attempt}"), metric.WithDescription("Upstream calls, hedges included, by outcome."))
	register(m, observeSums(in.cost, costs, in.attempts, attempts), in.cost, in.attempts)
	in.retries = i64c("relay.client.retries", "{retry}", "Upstream calls made again after a failed one, by the outcome of the failed one.")
	in.hedges = i64c("relay.client.hedges", "{hedge}", "Hedges sent: won when the hedge's answer was the one returned.")
	in.overhead = f64h("relay.client.overhead", "s", "Time a call spent in the router itself, upstream calls and waits excluded.", overheadBounds)
	in.wait = f64h("relay.limiter.wait", "s", "Time a call waited for an upstream's rate limits or in-flight slot.", waitBounds)
	in.transitions = i64c("relay.breaker.transitions", "{transition}", "Circuit breaker state changes, by the new state.")
	in.spend = f64c("relay.budget.spend", "{currency_unit}", "Spend charged to each budget's ledgers, in the billing currency (relay.budget.currency).")
	in.refusals = i64c("relay.budget.refusals", "{request}", "Requests a budget refused (relay.ErrBudgetExceeded), no upstream called.")
	in.fallbacks = i64c("relay.state.fallbacks", "{call}", "Calls to the shared state (Config.State, a shared Ledger) that failed or timed out, decided in-process instead, by operation.")
	// relay.breaker.state is an up-down counter, as the conventions' own
	// state metric (hw.status: 1 for the current state, 0 for the others)
	// is, not a gauge: the observations of Observers that share a
	// MeterProvider and an attribute set (two routers, each with an
	// upstream "a") add up to the number of breakers in each state, where
	// a gauge would keep one of them. Its callback is registered apart:
	// the SDK ignores the callback given with an instrument it already
	// made, so a second Observer's breakers would not be reported at all.
	state := instrument[metric.Int64ObservableUpDownCounter, metric.Int64ObservableUpDownCounterOption](m.Int64ObservableUpDownCounter, nop.Int64ObservableUpDownCounter,
		"relay.breaker.state", metric.WithUnit("1"),
		metric.WithDescription("Circuit breakers of each upstream in each state: 1 for a breaker's current state, 0 for the others."))
	in.breakerReg = register(m, b.observe(state), state)
	return in
}

// register registers f for the observed instruments obs; an error goes
// to otel.Handle, and the registration is then nil.
func register(m metric.Meter, f metric.Callback, obs ...metric.Observable) metric.Registration {
	reg, err := m.RegisterCallback(f, obs...)
	if err != nil {
		otel.Handle(err)
		return nil
	}
	return reg
}

// instrument makes the instrument name with create, or, when create fails
// and gives none, the no-op one (fallback): a meter's error is handed to
// otel.Handle and never leaves an instrument nil.
func instrument[T any, O any](create, fallback func(string, ...O) (T, error), name string, opts ...O) T {
	v, err := create(name, opts...)
	if err != nil {
		otel.Handle(err)
	}
	if any(v) == nil {
		v, _ = fallback(name)
	}
	return v
}
