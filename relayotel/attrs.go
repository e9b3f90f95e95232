package relayotel

import (
	"context"
	"strings"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/internal/labelcache"
)

// maxCached bounds the per-name state kept beside the label caches:
// breakers, addresses, and the attribute sets of the observed counters
// (sums).
const maxCached = labelcache.Max

// newSet is the attribute set of kv and, when the router is named
// (router valid), relay.router. kv may be sorted in place.
func newSet(router attribute.KeyValue, kv ...attribute.KeyValue) attribute.Set {
	if router.Valid() {
		kv = append(kv[:len(kv):len(kv)], router)
	}
	return attribute.NewSet(kv...)
}

// set is the attribute set of kv and the Observer's relay.router, if any.
func (o *Observer) set(kv ...attribute.KeyValue) attribute.Set { return newSet(o.router, kv...) }

func recordOpts(s attribute.Set) []metric.RecordOption {
	return []metric.RecordOption{metric.WithAttributeSet(s)}
}

func addOpts(s attribute.Set) []metric.AddOption {
	return []metric.AddOption{metric.WithAttributeSet(s)}
}

// The endpoints an Observer tells apart, as Report.Endpoint names them, by
// index: Observer.ops and reportKey hold an endpoint as its index, so that
// finding its sets takes no map lookup. otherEndpoint is any other path.
const (
	chatEndpoint = iota
	responsesEndpoint
	completionsEndpoint
	embeddingsEndpoint
	otherEndpoint
	numEndpoints
)

// endpointSuffixes are the endpoints as path suffixes, chat/completions
// before completions, which it ends with.
var endpointSuffixes = [otherEndpoint]string{"/chat/completions", "/responses", "/completions", "/embeddings"}

// endpointIndex is the index of an endpoint named as in Report.Endpoint.
func endpointIndex(ep string) int {
	switch ep {
	case "chat/completions":
		return chatEndpoint
	case "responses":
		return responsesEndpoint
	case "completions":
		return completionsEndpoint
	case "embeddings":
		return embeddingsEndpoint
	}
	return otherEndpoint
}

// endpointOf recognises an endpoint by path suffix, as the router does.
func endpointOf(path string) int {
	path = strings.TrimSuffix(path, "/")
	for i, suffix := range endpointSuffixes {
		if strings.HasSuffix(path, suffix) {
			return i
		}
	}
	return otherEndpoint
}

// opSets is what depends on the endpoint alone.
type opSets struct {
	op       string // gen_ai.operation.name; "" for a path not routed by model
	output   bool   // the operation has output tokens
	start    []trace.SpanStartOption
	overhead []metric.RecordOption
}

func newOpSets(o *Observer, endpoint int) *opSets {
	s := &opSets{output: true}
	var api attribute.KeyValue
	switch endpoint {
	case chatEndpoint:
		s.op, api = "chat", semconv.OpenAIAPITypeChatCompletions
	case responsesEndpoint: // the Responses API is a chat operation
		s.op, api = "chat", semconv.OpenAIAPITypeResponses
	case completionsEndpoint:
		s.op = "text_completion"
	case embeddingsEndpoint:
		s.op, s.output = "embeddings", false
	}
	if s.op == "" {
		s.start = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}
		if o.router.Valid() {
			s.start = append(s.start, trace.WithAttributes(o.router))
		}
		s.overhead = recordOpts(o.set())
		return s
	}
	kv := []attribute.KeyValue{semconv.GenAIOperationNameKey.String(s.op), o.provider}
	if o.openai && api.Valid() {
		kv = append(kv, api)
	}
	if o.router.Valid() {
		kv = append(kv, o.router)
	}
	s.start = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(kv...)}
	s.overhead = recordOpts(o.set(semconv.GenAIOperationNameKey.String(s.op)))
	return s
}

var attemptStart = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}

// reportKey is what a call's metric attributes and span name depend on.
// Its models are the ones the metrics record (models.bound).
type reportKey struct {
	endpoint                                    int // endpointIndex
	requested, model, upstream, bucket, errType string
}

type reportSets struct {
	name                          string // the span's
	duration, ttfc, input, output []metric.RecordOption
	cost                          *sum
	span                          []attribute.KeyValue // but a model recorded as _OTHER: the span has it as asked
}

func newReportSets(o *Observer, k reportKey) *reportSets {
	op := o.ops[k.endpoint].op
	rs := &reportSets{name: op}
	base := []attribute.KeyValue{semconv.GenAIOperationNameKey.String(op), o.provider}
	var models []attribute.KeyValue
	if k.requested != "" {
		if k.requested != otherModel { // a made-up name would make span names without end
			rs.name = op + " " + k.requested
		}
		models = append(models, semconv.GenAIRequestModelKey.String(k.requested))
	}
	if k.model != "" {
		models = append(models, semconv.GenAIResponseModelKey.String(k.model))
	}
	base = append(base, models...)
	var server []attribute.KeyValue
	if a := o.addressOf(k.upstream); a.host != "" {
		server = []attribute.KeyValue{semconv.ServerAddress(a.host), semconv.ServerPort(a.port)}
	}
	base = append(base, server...)
	with := func(extra ...attribute.KeyValue) attribute.Set {
		return o.set(append(append([]attribute.KeyValue(nil), base...), extra...)...)
	}
	rs.ttfc = recordOpts(with())
	rs.input = recordOpts(with(semconv.GenAITokenTypeInput))
	rs.output = recordOpts(with(semconv.GenAITokenTypeOutput))
	relayKV := []attribute.KeyValue{attribute.String("relay.upstream", k.upstream), attribute.String("relay.bucket", k.bucket)}
	var errKV []attribute.KeyValue
	if k.errType != "" {
		errKV = []attribute.KeyValue{semconv.ErrorTypeKey.String(k.errType)}
	}
	rs.duration = recordOpts(with(errKV...))
	cost := append([]attribute.KeyValue{semconv.GenAIOperationNameKey.String(op)}, models...)
	rs.cost = o.costSums.get(o.set(append(cost, relayKV...)...))
	var spanModels []attribute.KeyValue
	for _, kv := range models {
		if kv.Value.AsString() != otherModel {
			spanModels = append(spanModels, kv)
		}
	}
	rs.span = append(append(append(spanModels, server...), relayKV...), errKV...)
	return rs
}

// reportSpanAttrs are the span attributes of a call to a path not routed by
// model.
func (o *Observer) reportSpanAttrs(r *relay.Report, errType string) []attribute.KeyValue {
	kv := []attribute.KeyValue{attribute.String("relay.upstream", r.Upstream)}
	if a := o.addressOf(r.Upstream); a.host != "" {
		kv = append(kv, semconv.ServerAddress(a.host), semconv.ServerPort(a.port))
	}
	if errType != "" {
		kv = append(kv, semconv.ErrorTypeKey.String(errType))
	}
	return kv
}

type attemptKey struct {
	upstream, outcome string
	hedge             bool
}

func newAttemptSum(o *Observer, k attemptKey) *sum {
	return o.tries.get(o.set(
		attribute.String("relay.upstream", k.upstream),
		attribute.String("relay.attempt.outcome", k.outcome),
		attribute.Bool("relay.attempt.hedge", k.hedge),
	))
}

type retryKey struct{ upstream, reason string }

func newRetrySets(o *Observer, k retryKey) []metric.AddOption {
	return addOpts(o.set(
		attribute.String("relay.upstream", k.upstream),
		attribute.String("relay.retry.reason", k.reason),
	))
}

type waitKey struct{ upstream, reason, errType string }

func newWaitSets(o *Observer, k waitKey) []metric.RecordOption {
	kv := []attribute.KeyValue{
		attribute.String("relay.upstream", k.upstream),
		attribute.String("relay.wait.reason", k.reason),
	}
	if k.errType != "" {
		kv = append(kv, semconv.ErrorTypeKey.String(k.errType))
	}
	return recordOpts(o.set(kv...))
}

// breakers keeps each upstream's breaker state for relay.breaker.state,
// which reports 1 for the current state and 0 for the other two.
type breakers struct {
	router attribute.KeyValue // relay.router, when the router is named; set before init
	mu     sync.Mutex
	m      map[string]*breakerSets
}

var stateNames = [3]string{relay.StateClosed: "closed", relay.StateOpen: "open", relay.StateHalfOpen: "half_open"}

type breakerSets struct {
	state      relay.BreakerState
	observe    [3][]metric.ObserveOption
	transition [3][]metric.AddOption
}

func (b *breakers) init(names []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, n := range names {
		b.entryLocked(n)
	}
}

func (b *breakers) entryLocked(name string) *breakerSets {
	if e, ok := b.m[name]; ok {
		return e
	}
	e := &breakerSets{}
	for s, sn := range stateNames {
		set := newSet(b.router, attribute.String("relay.upstream", name), attribute.String("relay.breaker.state", sn))
		e.observe[s] = []metric.ObserveOption{metric.WithAttributeSet(set)}
		e.transition[s] = addOpts(set)
	}
	if len(b.m) < maxCached {
		if b.m == nil {
			b.m = map[string]*breakerSets{}
		}
		b.m[name] = e
	}
	return e
}

func (b *breakers) set(name string, to relay.BreakerState) {
	b.mu.Lock()
	b.entryLocked(name).state = to
	b.mu.Unlock()
}

func (b *breakers) transition(name string, to relay.BreakerState) []metric.AddOption {
	if int(to) >= len(stateNames) {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.entryLocked(name).transition[to]
}

// observe returns the callback that reports the states to inst.
func (b *breakers) observe(inst metric.Int64Observable) metric.Callback {
	return func(_ context.Context, obs metric.Observer) error {
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, e := range b.m {
			for s := range stateNames {
				obs.ObserveInt64(inst, int64(b2i(relay.BreakerState(s) == e.state)), e.observe[s]...)
			}
		}
		return nil
	}
}

func newSpendSets(o *Observer, k [2]string) []metric.AddOption {
	return addOpts(o.set(attribute.String("relay.budget", k[0]), attribute.String("relay.budget.currency", k[1])))
}

func newRefusalSets(o *Observer, budget string) []metric.AddOption {
	return addOpts(o.set(attribute.String("relay.budget", budget)))
}

func newFallbackSets(o *Observer, op string) []metric.AddOption {
	return addOpts(o.set(attribute.String("relay.state.operation", op)))
}
