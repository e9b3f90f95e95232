package relayotel

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/internal/errclass"
	"github.com/tokenrelay/relay/internal/labelcache"
)

// scope is the instrumentation scope of the tracer and the meter.
const scope = "github.com/tokenrelay/relay/relayotel"

// Observer turns a Router's hooks into OpenTelemetry spans and metrics. It
// is safe for concurrent use; one Observer may serve several routers whose
// upstream names differ (it keeps one breaker state per upstream name).
type Observer struct {
	tracer    trace.Tracer
	prop      propagation.TextMapPropagator
	provider  attribute.KeyValue
	router    attribute.KeyValue // relay.router; not valid when the router is not named
	openai    bool               // the provider is "openai": spans carry openai.api.type
	estimated bool
	inst      instruments

	addrMu sync.RWMutex
	addrs  map[string]*upstream // by name

	reports   labelcache.Cache[*Observer, reportKey, *reportSets]
	attempts  labelcache.Cache[*Observer, attemptKey, *sum]
	retries   labelcache.Cache[*Observer, retryKey, []metric.AddOption]
	waits     labelcache.Cache[*Observer, waitKey, []metric.RecordOption]
	spends    labelcache.Cache[*Observer, [2]string, []metric.AddOption] // budget, currency
	refusals  labelcache.Cache[*Observer, string, []metric.AddOption]    // budget
	fallbacks labelcache.Cache[*Observer, string, []metric.AddOption]    // operation
	breakers  breakers
	models    models                // the model names the metrics record
	costSums  sums                  // relay.client.cost
	tries     sums                  // relay.client.attempts
	ops       [numEndpoints]*opSets // by endpoint index (endpointIndex)
	hedge     [2][]metric.AddOption // relay.hedge.result lost, won
	closeMu   sync.Mutex            // held by Close
}

// address is an upstream's server.address and server.port.
type address struct {
	host string
	port int
}

// New returns an Observer. Plug it in with Config.Hooks: Hooks: obs.Hooks(),
// or relay.JoinHooks(obs.Hooks(), other.Hooks()) beside other observers.
// Instruments that cannot be created are reported to otel.Handle and
// replaced by no-ops.
func New(opts ...Option) *Observer {
	c := config{provider: "openai", limit: defaultModelLimit}
	for _, opt := range opts {
		opt(&c)
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	if c.prop == nil {
		c.prop = otel.GetTextMapPropagator()
		if len(c.prop.Fields()) == 0 { // none set: W3C trace context
			c.prop = propagation.TraceContext{}
		}
	}
	o := &Observer{
		tracer:    c.tp.Tracer(scope, trace.WithSchemaURL(semconv.SchemaURL)),
		prop:      c.prop,
		provider:  semconv.GenAIProviderNameKey.String(c.provider),
		openai:    c.provider == "openai",
		estimated: c.estimated,
		addrs:     map[string]*upstream{},
	}
	if c.router != "" {
		o.router = attribute.String("relay.router", c.router)
	}
	var names []string
	known := c.models
	for _, u := range c.ups {
		if a, ok := parseAddress(u.BaseURL); ok {
			o.addrs[u.Name] = &upstream{address: a}
		}
		names = append(names, u.Name)
		known = append(known, u.Models...)
	}
	o.models.init(known, c.limit)
	o.breakers.router = o.router
	o.breakers.init(names)
	for ep := range o.ops {
		o.ops[ep] = newOpSets(o, ep)
	}
	o.hedge[0] = addOpts(o.set(attribute.String("relay.hedge.result", "lost")))
	o.hedge[1] = addOpts(o.set(attribute.String("relay.hedge.result", "won")))
	o.inst = newInstruments(c.mp, &o.breakers, &o.costSums, &o.tries)
	return o
}

// Close unregisters the Observer's relay.breaker.state callback from its
// MeterProvider: call it when its router is replaced, as on a
// configuration reload, else the provider keeps reporting the old
// router's breakers (added to the new one's when their attribute sets
// are the same) for as long as it lives. The totals of relay.client.cost
// and relay.client.attempts stay reported: those counters never go
// backwards, and the new Observer's totals add to the old one's (at most
// 4,096 attribute sets each are kept). Its hooks must not be used after
// Close. Calling Close again does nothing.
func (o *Observer) Close() error {
	o.closeMu.Lock()
	defer o.closeMu.Unlock()
	if o.inst.breakerReg == nil {
		return nil
	}
	err := o.inst.breakerReg.Unregister()
	o.inst.breakerReg = nil
	return err
}

// Hooks returns the hooks to install in Config.Hooks.
func (o *Observer) Hooks() relay.Hooks {
	return relay.Hooks{
		OnRequest: o.onRequest,
		OnAttempt: o.onAttempt,
		OnWait:    o.onWait,
		OnBreaker: o.onBreaker,
		OnReport:  func(r relay.Report) { o.onReport(&r) }, // (a method value would copy the Report once more)

		OnSpend:         o.onSpend,
		OnStateFallback: o.onStateFallback,
	}
}

// onSpend records a charge to a budget's ledger.
func (o *Observer) onSpend(e relay.SpendEvent) {
	ctx, _ := o.callContext(e.Context)
	o.inst.spend.Add(ctx, e.Amount, o.spends.Get(o, [2]string{e.Budget, e.Currency}, newSpendSets)...)
}

// onStateFallback records a failed shared-state call, and notes it on the
// request's span.
func (o *Observer) onStateFallback(e relay.StateFallbackEvent) {
	ctx, c := o.callContext(e.Context)
	op := e.Op
	if !stateOps[op] {
		op = "other"
	}
	o.inst.fallbacks.Add(ctx, 1, o.fallbacks.Get(o, op, newFallbackSets)...)
	if c != nil && c.span.IsRecording() {
		c.span.AddEvent("relay.state.fallback", trace.WithAttributes(
			attribute.String("relay.state.operation", op),
			semconv.ErrorTypeKey.String(errclass.Type(e.Err, 0)),
		))
	}
}

// stateOps are the operations of relay.StateFallbackEvent.
var stateOps = func() map[string]bool {
	m := map[string]bool{}
	for _, op := range relay.StateFallbackOps() {
		m[op] = true
	}
	return m
}()

// call is a RoundTrip's state, kept in its context: the context carries the
// span, and answers Value(callKey{o}) with the call itself, so that keeping
// it costs no context of its own.
type call struct {
	context.Context
	o    *Observer
	span trace.Span
	// endpoint is the operation onRequest read from the URL path
	// (endpointIndex), for a call that fails before the router classifies
	// it (Report.Endpoint "").
	endpoint int

	mu         sync.Mutex
	wait       time.Duration // a wait not yet attached to an attempt
	waitReason string
	lastUp     string // the last finished attempt: upstream and outcome
	lastOut    string
	attempted  bool // the first attempt has started: first (and rec.attempt) are its

	// first is the carrier of the call's first attempt: the traceparent
	// value it sets is kept in the call, not in a slice of its own.
	first firstCarrier
	rec   *recorded // the call's span is recording: room for its attributes; else nil
}

// recorded is a call whose span is recording, with room for the attributes
// set on it at its end and on its first attempt's span at that attempt's
// end: one allocation instead of three.
type recorded struct {
	call
	report  [24]attribute.KeyValue
	attempt [10]attribute.KeyValue
}

type callKey struct{ o *Observer }

func (c *call) Value(key any) any {
	if k, ok := key.(callKey); ok && k.o == c.o {
		return c
	}
	return c.Context.Value(key)
}

func (o *Observer) callOf(ctx context.Context) *call {
	if ctx == nil {
		return nil
	}
	c, _ := ctx.Value(callKey{o}).(*call)
	return c
}

// callContext returns the context to record a call's metrics in, and the
// call (nil when ctx is none of this Observer's calls): the call span's
// context, so that the exemplars name this Observer's span, not one a hook
// after it started (another Observer's), and the SDK finds the span
// without passing the contexts wrapped around it; else ctx, or Background
// when ctx is nil.
func (o *Observer) callContext(ctx context.Context) (context.Context, *call) {
	if c := o.callOf(ctx); c != nil {
		return c.Context, c
	}
	if ctx == nil {
		return context.Background(), nil
	}
	return ctx, nil
}

// onRequest starts the RoundTrip's span, named by the operation until the
// report names the model.
func (o *Observer) onRequest(ctx context.Context, req *http.Request) context.Context {
	ep := otherEndpoint
	if req.URL != nil && req.Method == http.MethodPost {
		ep = endpointOf(req.URL.Path)
	}
	ops, name := o.ops[ep], req.Method
	if ops.op != "" {
		name = ops.op
	}
	ctx, span := o.tracer.Start(ctx, name, ops.start...)
	if span.IsRecording() {
		r := &recorded{call: call{Context: ctx, o: o, span: span, endpoint: ep}}
		r.rec = r
		return &r.call
	}
	return &call{Context: ctx, o: o, span: span, endpoint: ep}
}

// onAttempt starts an attempt's span and injects its context into the
// upstream request. The span's attributes are set once, when the outcome is
// known: one copy instead of two.
func (o *Observer) onAttempt(ctx context.Context, a relay.AttemptInfo, out *http.Request) func(relay.AttemptDone) {
	c := o.callOf(ctx)
	addr, ups := o.learn(a.Upstream, out.URL)
	span := trace.SpanFromContext(ctx)
	if c != nil && span.SpanContext().SpanID() != c.span.SpanContext().SpanID() {
		// A hook after this Observer's started a span inside the call's
		// (another Observer's, on a provider of its own): the attempt is
		// this call's child, sampled as this call is.
		span = c.span
		ctx = trace.ContextWithSpan(ctx, span)
	}
	if span.IsRecording() || span.SpanContext().IsSampled() {
		ctx, span = o.tracer.Start(ctx, "relay.attempt", attemptStart...)
	} else {
		// The call's span is not sampled: nor would the attempt's be (every
		// standard sampler decides alike for a child), so it gets none, and
		// the call's context goes upstream.
		span = nil
	}
	var (
		wait       time.Duration
		waitReason string
		room       *[10]attribute.KeyValue // for the span's attributes, if the call has it
	)
	var carrier propagation.TextMapCarrier = headerCarrier(out.Header)
	if c != nil {
		c.mu.Lock()
		wait, waitReason = c.wait, c.waitReason
		c.wait, c.waitReason = 0, ""
		up, reason := c.lastUp, c.lastOut
		if !c.attempted { // the first attempt: no other uses c.first, c.rec.attempt
			c.attempted = true
			c.first.h = out.Header
			carrier = &c.first
			if c.rec != nil {
				room = &c.rec.attempt
			}
		}
		c.mu.Unlock()
		if a.N > 1 && !a.Hedge && reason != "" {
			o.inst.retries.Add(ctx, 1, o.retries.Get(o, retryKey{up, reason}, newRetrySets)...)
		}
	}
	o.prop.Inject(ctx, carrier)
	if f, ok := carrier.(*firstCarrier); ok {
		f.h = nil // (the header is the attempt's: not kept with the call)
	}
	if span == nil { // no span to complete: a done function that keeps only what counting needs
		up, hedge := a.Upstream, a.Hedge
		return func(d relay.AttemptDone) {
			outcome := errclass.Outcome(d.StatusCode, d.Err)
			o.countAttempt(ups, up, outcome, hedge)
			c.attemptDone(up, outcome)
		}
	}
	return func(d relay.AttemptDone) {
		outcome := errclass.Outcome(d.StatusCode, d.Err)
		if span.IsRecording() {
			failed := d.Err != nil || d.StatusCode >= 400
			kv := room
			if kv == nil {
				kv = new([10]attribute.KeyValue)
			}
			kv[0] = attribute.String("relay.upstream", a.Upstream)
			kv[1] = semconv.GenAIRequestModelKey.String(a.Model)
			kv[2] = attribute.Int("relay.attempt.number", a.N)
			kv[3] = attribute.Bool("relay.attempt.hedge", a.Hedge)
			n := 4
			if addr.host != "" {
				kv[n], kv[n+1] = semconv.ServerAddress(addr.host), semconv.ServerPort(addr.port)
				n += 2
			}
			if waitReason != "" {
				kv[n], kv[n+1] = attribute.Float64("relay.wait.duration", wait.Seconds()), attribute.String("relay.wait.reason", waitReason)
				n += 2
			}
			if d.StatusCode != 0 {
				kv[n] = semconv.HTTPResponseStatusCode(d.StatusCode)
				n++
			}
			if failed {
				et := outcome
				if d.StatusCode >= 400 {
					et = errclass.Status(d.StatusCode)
				}
				kv[n] = semconv.ErrorTypeKey.String(et)
				n++
			}
			span.SetAttributes(kv[:n]...)
			if failed {
				span.SetStatus(codes.Error, attemptError(d))
			}
		}
		// The count first: whoever sees the span ended sees the attempt counted.
		o.countAttempt(ups, a.Upstream, outcome, a.Hedge)
		span.End()
		c.attemptDone(a.Upstream, outcome)
	}
}

// countAttempt adds a finished attempt to name (u, if it is kept) to
// relay.client.attempts.
func (o *Observer) countAttempt(u *upstream, name, outcome string, hedge bool) {
	if u == nil || outcome != "2xx" {
		o.attempts.Get(o, attemptKey{name, outcome, hedge}, newAttemptSum).addInt(1)
		return
	}
	answered := &u.answered[b2i(hedge)]
	t := answered.Load()
	if t == nil {
		t = o.attempts.Get(o, attemptKey{name, outcome, hedge}, newAttemptSum)
		answered.Store(t)
	}
	t.addInt(1)
}

// attemptDone notes an attempt's end in its call (which may be nil), for
// the retry that may follow: a cancelled attempt (a hedge's loser) does not
// hide the outcome of one that failed before it.
func (c *call) attemptDone(upstream, outcome string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	if outcome != "canceled" || c.lastOut == "" {
		c.lastUp, c.lastOut = upstream, outcome
	}
	c.mu.Unlock()
}

// headerCarrier carries the trace context in an http.Header, setting the
// W3C and baggage headers under their canonical keys without working them
// out anew for every request.
type headerCarrier http.Header

var canonicalKeys = map[string]string{"traceparent": "Traceparent", "tracestate": "Tracestate", "baggage": "Baggage"}

func (h headerCarrier) Get(key string) string { return propagation.HeaderCarrier(h).Get(key) }
func (h headerCarrier) Keys() []string        { return propagation.HeaderCarrier(h).Keys() }

func (h headerCarrier) Set(key, value string) {
	if k, ok := canonicalKeys[key]; ok {
		h[k] = []string{value}
		return
	}
	http.Header(h).Set(key, value)
}

// firstCarrier is headerCarrier with room for one traceparent value: the
// header's value slice is v, so that setting it allocates nothing. It
// serves one request (one attempt), and is then not written again.
type firstCarrier struct {
	h http.Header
	v [1]string
}

func (f *firstCarrier) Get(key string) string { return headerCarrier(f.h).Get(key) }
func (f *firstCarrier) Keys() []string        { return headerCarrier(f.h).Keys() }

func (f *firstCarrier) Set(key, value string) {
	if key == "traceparent" && f.v[0] == "" {
		f.v[0] = value
		f.h["Traceparent"] = f.v[:1:1] // (an append to it copies: its capacity is 1)
		return
	}
	headerCarrier(f.h).Set(key, value)
}

// attemptError describes a failed attempt for its span's status.
func attemptError(d relay.AttemptDone) string {
	if d.Err != nil {
		return d.Err.Error()
	}
	return http.StatusText(d.StatusCode)
}

// onWait records a limiter wait; a wait that ended in admission is noted on
// the next attempt's span, one that failed on the request's span.
func (o *Observer) onWait(w relay.WaitEvent) {
	et := ""
	if w.Err != nil {
		et = errclass.Type(w.Err, 0)
	}
	ctx, c := o.callContext(w.Context)
	o.inst.wait.Record(ctx, w.Wait.Seconds(), o.waits.Get(o, waitKey{w.Upstream, w.Reason, et}, newWaitSets)...)
	if c == nil {
		return
	}
	if w.Err != nil {
		c.span.AddEvent("relay.wait", trace.WithAttributes(
			attribute.String("relay.upstream", w.Upstream),
			attribute.String("relay.wait.reason", w.Reason),
			attribute.Float64("relay.wait.duration", w.Wait.Seconds()),
			semconv.ErrorTypeKey.String(et),
		))
		return
	}
	c.mu.Lock()
	c.wait += w.Wait
	c.waitReason = w.Reason
	c.mu.Unlock()
}

// onBreaker records a breaker's new state.
func (o *Observer) onBreaker(e relay.BreakerEvent) {
	o.breakers.set(e.Upstream, e.To)
	o.inst.transitions.Add(context.Background(), 1, o.breakers.transition(e.Upstream, e.To)...)
}

// onReport records the call's metrics, completes its span and ends it.
func (o *Observer) onReport(r *relay.Report) {
	ctx, c := o.callContext(r.Context)
	et := errclass.Type(r.Err, r.StatusCode)
	ep := endpointIndex(r.Endpoint)
	if r.Endpoint == "" && c != nil {
		ep = c.endpoint // a call that failed before it was classified (a body too large)
	}
	ops := o.ops[ep]
	var (
		rs               *reportSets
		requested, model string // as the metrics record them
	)
	if ops.op != "" {
		learn := vouched(r)
		// The name asked for is learned only when it is the one sent: a
		// Policy's alias or a fallback sends another name upstream.
		requested = o.models.bound(r.RequestedModel, learn && r.Model == r.RequestedModel)
		model = requested
		if r.Model != r.RequestedModel {
			model = o.models.bound(r.Model, learn)
		}
		rs = o.reports.Get(o, reportKey{ep, requested, model, r.Upstream, r.Bucket, et}, newReportSets)
		o.inst.duration.Record(ctx, r.Latency.Seconds(), rs.duration...)
		if o.estimated || !r.Usage.Estimated {
			if r.Usage.PromptTokens > 0 || r.Usage.CompletionTokens > 0 {
				o.inst.tokens.Record(ctx, int64(r.Usage.PromptTokens), rs.input...)
				if ops.output {
					o.inst.tokens.Record(ctx, int64(r.Usage.CompletionTokens), rs.output...)
				}
			}
		}
		if streamed(r) {
			o.inst.ttfc.Record(ctx, r.TTFT.Seconds(), rs.ttfc...)
		}
		if r.Priced {
			rs.cost.addFloat(r.CostUSD)
		}
	}
	if r.Hedged {
		o.inst.hedges.Add(ctx, 1, o.hedge[b2i(r.HedgeWon)]...)
	}
	if r.Budget != "" {
		o.inst.refusals.Add(ctx, 1, o.refusals.Get(o, r.Budget, newRefusalSets)...)
	}
	o.inst.overhead.Record(ctx, r.Overhead.Seconds(), ops.overhead...)

	if c == nil {
		return
	}
	span := c.span
	if span.IsRecording() {
		var (
			fixed []attribute.KeyValue
			kv    *[24]attribute.KeyValue
			n     int
		)
		if c.rec != nil {
			kv = &c.rec.report
		} else { // (recording, though it was not when it started)
			kv = new([24]attribute.KeyValue)
		}
		if rs != nil {
			span.SetName(rs.name)
			fixed = rs.span
			// The span has the models as asked, also those the metrics
			// record as _OTHER (rs.span has the others).
			if requested == otherModel {
				kv[n] = semconv.GenAIRequestModelKey.String(r.RequestedModel)
				n++
			}
			if model == otherModel {
				kv[n] = semconv.GenAIResponseModelKey.String(r.Model)
				n++
			}
		} else {
			fixed = o.reportSpanAttrs(r, et)
		}
		o.setAttributes(span, kv[:n], fixed, r)
		if et != "" {
			span.SetStatus(codes.Error, r.Err.Error())
		}
	}
	span.End()
}

// setAttributes sets the span's attributes in one call (one copy), built in
// kv: the fixed ones of its label set, and those that change with every
// call.
func (o *Observer) setAttributes(span trace.Span, kv []attribute.KeyValue, fixed []attribute.KeyValue, r *relay.Report) {
	kv = append(append(kv, fixed...), attribute.Int("relay.attempts", r.Attempts), attribute.Bool("relay.hedged", r.Hedged))
	if r.Hedged {
		kv = append(kv, attribute.Bool("relay.hedge_won", r.HedgeWon))
	}
	if r.StatusCode != 0 {
		kv = append(kv, semconv.HTTPResponseStatusCode(r.StatusCode))
	}
	if r.Priced {
		kv = append(kv, attribute.Float64("relay.cost_usd", r.CostUSD))
	}
	if r.Stream {
		kv = append(kv, semconv.GenAIRequestStreamKey.Bool(true))
		if streamed(r) {
			kv = append(kv, semconv.GenAIResponseTimeToFirstChunkKey.Float64(r.TTFT.Seconds()))
		}
	}
	u := r.Usage
	if (u.PromptTokens > 0 || u.CompletionTokens > 0) && (o.estimated || !u.Estimated) {
		kv = append(kv, semconv.GenAIUsageInputTokensKey.Int(u.PromptTokens), semconv.GenAIUsageOutputTokensKey.Int(u.CompletionTokens))
		if u.CachedTokens > 0 {
			kv = append(kv, semconv.GenAIUsageCacheReadInputTokensKey.Int(u.CachedTokens))
		}
		if u.ReasoningTokens > 0 {
			kv = append(kv, semconv.GenAIUsageReasoningOutputTokensKey.Int(u.ReasoningTokens))
		}
		if u.Estimated {
			kv = append(kv, attribute.Bool("relay.usage.estimated", true))
		}
	}
	span.SetAttributes(kv...)
}

// upstream is what an Observer keeps of an upstream: where it is, and the
// relay.client.attempts totals of its answered attempts (outcome 2xx; not
// hedges, hedges), found the first time each is counted, so that most
// attempts are counted without a label lookup.
type upstream struct {
	address
	answered [2]atomic.Pointer[sum]
}

// learn returns where an upstream is: as configured, else as its request
// shows, remembered for its reports; and what is kept of it, nil when
// nothing is (past maxCached names, or no URL to learn from).
func (o *Observer) learn(name string, u *url.URL) (address, *upstream) {
	o.addrMu.RLock()
	ups := o.addrs[name]
	o.addrMu.RUnlock()
	if ups != nil {
		return ups.address, ups
	}
	if u == nil {
		return address{}, nil
	}
	a := addressOf(u)
	o.addrMu.Lock()
	defer o.addrMu.Unlock()
	if ups = o.addrs[name]; ups == nil && len(o.addrs) < maxCached {
		ups = &upstream{address: a}
		o.addrs[name] = ups
	}
	return a, ups
}

func (o *Observer) addressOf(name string) address {
	o.addrMu.RLock()
	ups := o.addrs[name]
	o.addrMu.RUnlock()
	if ups == nil {
		return address{}
	}
	return ups.address
}

func parseAddress(baseURL string) (address, bool) {
	u, err := url.Parse(baseURL)
	if err != nil || u.Host == "" {
		return address{}, false
	}
	return addressOf(u), true
}

func addressOf(u *url.URL) address {
	a := address{host: u.Hostname()}
	switch p := u.Port(); {
	case p != "":
		a.port = atoi(p)
	case strings.EqualFold(u.Scheme, "https"):
		a.port = 443
	case strings.EqualFold(u.Scheme, "http"):
		a.port = 80
	}
	return a
}

func atoi(s string) int {
	n := 0
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0
		}
		n = n*10 + int(c-'0')
	}
	return n
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// streamed reports whether r is a stream that sent a first chunk: a 2xx
// stream with a TTFT (for an error status, Report.TTFT is the time to the
// headers, not to a chunk).
func streamed(r *relay.Report) bool {
	return r.Stream && r.TTFT > 0 && r.StatusCode >= 200 && r.StatusCode < 300
}
