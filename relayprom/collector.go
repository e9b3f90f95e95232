package relayprom

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/internal/errclass"
	"github.com/tokenrelay/relay/internal/labelcache"
	"github.com/tokenrelay/relay/internal/modelset"
)

// Bucket boundaries: durationBuckets are the ones the OpenTelemetry GenAI
// conventions recommend for call durations and times to first chunk.
var (
	durationBuckets = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}
	waitBuckets     = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
	overheadBuckets = []float64{0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01}
)

// Label values of what is not in the collector's sets.
const (
	other = "other" // a value not given to New
	none  = "none"  // no value: no upstream reached, no model in the request
)

// Option configures a Collector.
type Option func(*Collector)

// WithUpstreams gives the upstream names (and the models each lists in
// Upstream.Models) that label the metrics as themselves; pass the router's
// Config.Upstreams. Only names and models are kept, never a key.
func WithUpstreams(ups ...relay.Upstream) Option {
	return func(c *Collector) {
		for _, u := range ups {
			c.upstreams[u.Name] = true
			c.named = append(c.named, u.Models...)
		}
	}
}

// WithModels gives more model names that label the metrics as themselves:
// the models your Policy routes to and its fallbacks, the models callers
// ask for. Models not given are learned (see WithModelLimit).
func WithModels(models ...string) Option {
	return func(c *Collector) { c.named = append(c.named, models...) }
}

// WithModelLimit sets how many models not given (WithModels,
// WithUpstreams) the Collector learns, each the first time a call shows it
// to be real: an upstream was called with it and did not refuse the call
// as a client error (a 4xx other than 429). A name no upstream serves, one
// an upstream does not know (404) and one of a call that reached no
// upstream are not learned, and once n are learned, no more are: any
// other model is "other". Default: 32, as relayotel's. 0 learns none: the
// metrics label only the models given.
func WithModelLimit(n int) Option {
	return func(c *Collector) { c.modelLimit = n }
}

// WithBuckets gives bucket labels your Policy sets (Route.Bucket) beyond
// "short", "mid" and "long".
func WithBuckets(labels ...string) Option {
	return func(c *Collector) {
		for _, b := range labels {
			c.buckets[b] = true
		}
	}
}

// WithBudgets gives the budget names (Config.Budgets) that label the
// budget metrics as themselves.
func WithBudgets(budgets ...relay.Budget) Option {
	return func(c *Collector) {
		for _, b := range budgets {
			c.budgets[b.Name] = true
		}
	}
}

// Collector is a prometheus.Collector of a Router's metrics, fed by the
// hooks Hooks returns. It is safe for concurrent use; one Collector may
// serve several routers. Register it once (prometheus.MustRegister).
type Collector struct {
	upstreams, buckets, budgets map[string]bool // read-only after New
	models                      modelset.Set    // the models given, and those learned
	named                       []string        // the models given, until New
	modelLimit                  int

	requests    *prometheus.CounterVec
	errors      *prometheus.CounterVec
	tokens      *prometheus.CounterVec
	cost        *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	ttft        *prometheus.HistogramVec
	attempts    *prometheus.CounterVec
	retries     *prometheus.CounterVec
	hedges      *prometheus.CounterVec
	overhead    prometheus.Histogram
	wait        *prometheus.HistogramVec
	breaker     *prometheus.GaugeVec
	transitions *prometheus.CounterVec
	spend       *prometheus.CounterVec
	refusals    *prometheus.CounterVec
	fallbacks   *prometheus.CounterVec
	all         []prometheus.Collector

	// The metrics' children, resolved once per label set: recording a call
	// then takes no label lookup and allocates nothing. The label values
	// are bounded, and so are these.
	reports  labelcache.Cache[*Collector, reportKey, *reportMetrics]
	errs     labelcache.Cache[*Collector, [3]string, prometheus.Counter]
	attemptC labelcache.Cache[*Collector, [2]string, prometheus.Counter]
	retryC   labelcache.Cache[*Collector, [2]string, prometheus.Counter]
	ttftC    labelcache.Cache[*Collector, [2]string, prometheus.Observer]
	waitC    labelcache.Cache[*Collector, [2]string, prometheus.Observer]
	hedgeC   [2]prometheus.Counter // lost, won

	// ups are the upstream labels with what an attempt counts: one per
	// upstream given, and other and none; read-only after New.
	ups               map[string]*upstreamLabel
	otherUps, noneUps *upstreamLabel
}

// upstreamLabel is an upstream's label, and the relay_attempts_total child
// of its answered attempts (outcome 2xx), found the first time one is
// counted: most attempts are counted without a label lookup.
type upstreamLabel struct {
	name     string
	answered atomic.Pointer[prometheus.Counter]
}

// upstreamOf is the label of the upstream named name.
func (c *Collector) upstreamOf(name string) *upstreamLabel {
	if name == "" {
		return c.noneUps
	}
	if u := c.ups[name]; u != nil {
		return u
	}
	return c.otherUps
}

// countAttempt counts an attempt to u that ended with outcome.
func (c *Collector) countAttempt(u *upstreamLabel, outcome string) {
	if outcome != "2xx" {
		c.attemptC.Get(c, [2]string{u.name, outcome}, newAttempt).Inc()
		return
	}
	n := u.answered.Load()
	if n == nil {
		child := c.attemptC.Get(c, [2]string{u.name, outcome}, newAttempt)
		n = &child
		u.answered.Store(n)
	}
	(*n).Inc()
}

// New returns a Collector.
func New(opts ...Option) *Collector {
	c := &Collector{
		upstreams:  map[string]bool{},
		modelLimit: modelset.DefaultLimit,
		buckets:    map[string]bool{relay.BucketShort: true, relay.BucketMid: true, relay.BucketLong: true},
		budgets:    map[string]bool{},
	}
	for _, opt := range opts {
		opt(c)
	}
	c.models.Init(c.named, c.modelLimit)
	c.named = nil
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
		c.all = append(c.all, v)
		return v
	}
	histogram := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		v := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
		c.all = append(c.all, v)
		return v
	}
	c.requests = counter("relay_requests_total", "Calls through the router, by the final status class (none: no response came).", "upstream", "model", "bucket", "status")
	c.errors = counter("relay_errors_total", "Failed calls, by error type.", "upstream", "model", "type")
	c.tokens = counter("relay_tokens_total", "Tokens billed: input and output, and the cache_read part of input and the reasoning part of output.", "upstream", "model", "type")
	c.cost = counter("relay_cost_usd_total", "Cost of the calls in US dollars, after each upstream's price factor.", "upstream", "model")
	c.duration = histogram("relay_request_duration_seconds", "Duration of the calls, from RoundTrip to the end of the body.", durationBuckets, "upstream", "model")
	c.ttft = histogram("relay_ttft_seconds", "Time to the first content chunk of the streams.", durationBuckets, "upstream", "model")
	c.attempts = counter("relay_attempts_total", "Upstream calls, hedges included, by outcome.", "upstream", "outcome")
	c.retries = counter("relay_retries_total", "Upstream calls made again after a failed one, by the failed one's upstream and outcome.", "upstream", "reason")
	c.hedges = counter("relay_hedges_total", "Hedges sent: won when the hedge's answer was the one returned.", "result")
	c.overhead = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "relay_overhead_seconds",
		Help: "Time a call spent in the router itself, upstream calls and waits excluded.", Buckets: overheadBuckets})
	c.all = append(c.all, c.overhead)
	c.wait = histogram("relay_limiter_wait_seconds", "Waits for an upstream's rate limits or in-flight slot.", waitBuckets, "upstream", "reason")
	c.breaker = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "relay_breaker_state",
		Help: "Circuit breaker state of each upstream: 1 for the current state, 0 for the others."}, []string{"upstream", "state"})
	c.all = append(c.all, c.breaker)
	c.transitions = counter("relay_breaker_transitions_total", "Circuit breaker state changes, by the new state.", "upstream", "state")
	c.spend = counter("relay_budget_spend_total", "Spend charged to each budget's ledgers, in the billing currency.", "budget", "currency")
	c.refusals = counter("relay_budget_refusals_total", "Requests a budget refused (relay.ErrBudgetExceeded), no upstream called.", "budget")
	c.fallbacks = counter("relay_state_fallbacks_total", "Calls to the shared state (Config.State, a shared Ledger) that failed or timed out, decided in-process instead, by operation.", "operation")
	c.hedgeC = [2]prometheus.Counter{c.hedges.WithLabelValues("lost"), c.hedges.WithLabelValues("won")}
	for u := range c.upstreams {
		c.setBreaker(u, relay.StateClosed)
	}
	c.ups = map[string]*upstreamLabel{}
	for u := range c.upstreams {
		c.ups[u] = &upstreamLabel{name: u}
	}
	c.otherUps, c.noneUps = &upstreamLabel{name: other}, &upstreamLabel{name: none}
	return c
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.all {
		m.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c.all {
		m.Collect(ch)
	}
}

// Hooks returns the hooks to install in Config.Hooks.
func (c *Collector) Hooks() relay.Hooks {
	return relay.Hooks{
		OnRequest: c.onRequest,
		OnAttempt: c.onAttempt,
		OnWait:    c.onWait,
		OnBreaker: c.onBreaker,
		OnReport:  func(r relay.Report) { c.onReport(&r) }, // (a method value would copy the Report once more)

		OnSpend:         c.onSpend,
		OnStateFallback: c.onStateFallback,
	}
}

func (c *Collector) onSpend(e relay.SpendEvent) {
	c.spend.WithLabelValues(c.label(c.budgets, e.Budget), e.Currency).Add(e.Amount)
}

// stateOps are the operations of relay.StateFallbackEvent.
var stateOps = func() map[string]bool {
	m := map[string]bool{}
	for _, op := range relay.StateFallbackOps() {
		m[op] = true
	}
	return m
}()

func (c *Collector) onStateFallback(e relay.StateFallbackEvent) {
	c.fallbacks.WithLabelValues(c.label(stateOps, e.Op)).Inc()
}

func (c *Collector) upstream(name string) string { return c.label(c.upstreams, name) }

// model is the label of a call's model: itself when given or learned
// (learn: the call shows it to be real), "other" when not, "none" when
// there is none.
func (c *Collector) model(name string, learn bool) string {
	switch {
	case name == "":
		return none
	case c.models.Bound(name, learn):
		return name
	}
	return other
}

func (c *Collector) label(set map[string]bool, v string) string {
	switch {
	case v == "":
		return none
	case set[v]:
		return v
	}
	return other
}

// call is a RoundTrip's state, kept in its context, which it wraps: the
// last finished attempt, the reason of a retry that follows it.
type call struct {
	context.Context
	c *Collector

	mu      sync.Mutex
	lastUp  string
	lastOut string
}

type callKey struct{ c *Collector }

func (k *call) Value(key any) any {
	if ck, ok := key.(callKey); ok && ck.c == k.c {
		return k
	}
	return k.Context.Value(key)
}

func (c *Collector) onRequest(ctx context.Context, _ *http.Request) context.Context {
	return &call{Context: ctx, c: c}
}

func (c *Collector) onAttempt(ctx context.Context, a relay.AttemptInfo, _ *http.Request) func(relay.AttemptDone) {
	k, _ := ctx.Value(callKey{c}).(*call)
	u := c.upstreamOf(a.Upstream)
	if k != nil && a.N > 1 && !a.Hedge {
		k.mu.Lock()
		lastUp, reason := k.lastUp, k.lastOut
		k.mu.Unlock()
		if reason != "" {
			c.retryC.Get(c, [2]string{lastUp, reason}, newRetry).Inc()
		}
	}
	return func(d relay.AttemptDone) {
		outcome := errclass.Outcome(d.StatusCode, d.Err)
		c.countAttempt(u, outcome)
		if k != nil {
			k.mu.Lock()
			if outcome != "canceled" || k.lastOut == "" {
				k.lastUp, k.lastOut = u.name, outcome
			}
			k.mu.Unlock()
		}
	}
}

func (c *Collector) onWait(w relay.WaitEvent) {
	c.waitC.Get(c, [2]string{c.upstream(w.Upstream), w.Reason}, newWait).Observe(w.Wait.Seconds())
}

func (c *Collector) onBreaker(e relay.BreakerEvent) {
	up := c.upstream(e.Upstream)
	c.transitions.WithLabelValues(up, stateName(e.To)).Inc()
	if up != other { // several upstreams share "other": no one state to show
		c.setBreaker(up, e.To)
	}
}

var stateNames = [3]string{relay.StateClosed: "closed", relay.StateOpen: "open", relay.StateHalfOpen: "half_open"}

func stateName(s relay.BreakerState) string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return other
}

func (c *Collector) setBreaker(up string, to relay.BreakerState) {
	for s, name := range stateNames {
		v := 0.0
		if relay.BreakerState(s) == to {
			v = 1
		}
		c.breaker.WithLabelValues(up, name).Set(v)
	}
}

// reportKey is the labels of a call's metrics.
type reportKey struct{ upstream, model, bucket, status string }

type reportMetrics struct {
	requests             prometheus.Counter
	input, output        prometheus.Counter
	cacheRead, reasoning prometheus.Counter
	cost                 prometheus.Counter
	duration             prometheus.Observer
}

func newReport(c *Collector, k reportKey) *reportMetrics {
	return &reportMetrics{
		requests:  c.requests.WithLabelValues(k.upstream, k.model, k.bucket, k.status),
		input:     c.tokens.WithLabelValues(k.upstream, k.model, "input"),
		output:    c.tokens.WithLabelValues(k.upstream, k.model, "output"),
		cacheRead: c.tokens.WithLabelValues(k.upstream, k.model, "cache_read"),
		reasoning: c.tokens.WithLabelValues(k.upstream, k.model, "reasoning"),
		cost:      c.cost.WithLabelValues(k.upstream, k.model),
		duration:  c.duration.WithLabelValues(k.upstream, k.model),
	}
}

func newAttempt(c *Collector, k [2]string) prometheus.Counter {
	return c.attempts.WithLabelValues(k[0], k[1])
}
func newRetry(c *Collector, k [2]string) prometheus.Counter {
	return c.retries.WithLabelValues(k[0], k[1])
}
func newTTFT(c *Collector, k [2]string) prometheus.Observer {
	return c.ttft.WithLabelValues(k[0], k[1])
}
func newWait(c *Collector, k [2]string) prometheus.Observer {
	return c.wait.WithLabelValues(k[0], k[1])
}
func newError(c *Collector, k [3]string) prometheus.Counter {
	return c.errors.WithLabelValues(k[0], k[1], k[2])
}

func (c *Collector) onReport(r *relay.Report) {
	up, model := c.upstream(r.Upstream), c.model(r.Model, modelset.Vouched(r.Attempts, r.StatusCode))
	m := c.reports.Get(c, reportKey{up, model, c.label(c.buckets, r.Bucket), statusClass(r.StatusCode)}, newReport)
	m.requests.Inc()
	if et := errclass.Type(r.Err, r.StatusCode); et != "" {
		c.errs.Get(c, [3]string{up, model, et}, newError).Inc()
	}
	if u := r.Usage; u.PromptTokens > 0 || u.CompletionTokens > 0 {
		m.input.Add(float64(u.PromptTokens))
		m.output.Add(float64(u.CompletionTokens))
		if u.CachedTokens > 0 {
			m.cacheRead.Add(float64(u.CachedTokens))
		}
		if u.ReasoningTokens > 0 {
			m.reasoning.Add(float64(u.ReasoningTokens))
		}
	}
	if r.CostUSD > 0 {
		m.cost.Add(r.CostUSD)
	}
	m.duration.Observe(r.Latency.Seconds())
	if r.Stream && r.TTFT > 0 && r.StatusCode >= 200 && r.StatusCode < 300 { // a first chunk came (for an error status, TTFT is to the headers)
		c.ttftC.Get(c, [2]string{up, model}, newTTFT).Observe(r.TTFT.Seconds())
	}
	if r.Hedged {
		c.hedgeC[b2i(r.HedgeWon)].Inc()
	}
	c.overhead.Observe(r.Overhead.Seconds())
	if r.Budget != "" {
		c.refusals.WithLabelValues(c.label(c.budgets, r.Budget)).Inc()
	}
}

// statusClass is the status label: a class, or "none" when no response
// came.
func statusClass(code int) string {
	if c := errclass.StatusClass(code); c != "" {
		return c
	}
	return none
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
