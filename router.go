// Package relay is a drop-in http.RoundTripper for OpenAI-compatible APIs
// that makes every LLM call cheaper, faster in the tail, and accounted for.
//
// Wrap any HTTP client with a Router (go-openai's ClientConfig.HTTPClient,
// openai-go's option.WithHTTPClient, plain net/http) and every call goes
// through one pipeline:
//
//  1. transport.go clones the request (the caller's is never modified) and
//     reads the body once, bounded, so every attempt can replay it.
//  2. classify.go reads endpoint, model, stream flag, max tokens and prompt
//     text from the JSON without decoding all of it, and counts prompt tokens
//     the way the API bills them; a bucket label (short, mid, long) follows.
//  3. The Policy turns the Request into a Route: the model to send, fallback
//     models, a bucket label.
//  4. shard.go derives the request's affinity key from its prompt prefix.
//  5. region.go lists the upstreams that serve the model, in the order to try
//     them, skipping open circuits (breaker.go).
//  6. limit.go takes RPM and TPM tokens from the chosen upstream's buckets.
//  7. transport.go rewrites URL, Authorization, model and body tags on its own
//     copy and sends it through Config.Base.
//  8. retry.go sorts the outcome: success, retry elsewhere, or final.
//  9. stream.go and cost.go wrap the response body: bytes pass through as they
//     arrive; usage is picked out of the body or the SSE stream; cost and
//     latency go into one Report, handed to Config.OnReport exactly once.
//
// A Router needs no server and runs no background goroutine: time-based
// transitions (breaker cooldowns, limiter refills) are computed from
// timestamps. Only a hedged request races its two attempts on goroutines that
// end with it. Its routing decision can be tested in-process, without a
// network, with Router.Decide.
package relay

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Errors callers may branch on with errors.Is. Every error the router returns
// or reports is an *Error wrapping one of these (or a transport error), with a
// message prefixed "relay: ". No error ever contains an API key.
var (
	// ErrNoUpstream: no configured upstream serves the requested model.
	ErrNoUpstream = errors.New("relay: no upstream serves the model")
	// ErrBodyTooLarge: the request body exceeds Config.MaxBodyBytes; no
	// upstream was called.
	ErrBodyTooLarge = errors.New("relay: request body too large")
	// ErrRateLimited: every candidate upstream's limiter refused the request
	// within Config.Limits.MaxWait; no upstream was called.
	ErrRateLimited = errors.New("relay: rate limited by every upstream")
	// ErrStreamStalled: a stream sent no byte for the idle timeout.
	ErrStreamStalled = errors.New("relay: stream stalled")
	// ErrUpstreamStatus: the final response had a status of 400 or more.
	// The response itself is still returned to the caller with err == nil;
	// this error only appears in Report.Err.
	ErrUpstreamStatus = errors.New("relay: upstream answered with an error status")
)

// Error describes a failed request. It wraps the cause (a sentinel above, a
// context error or a transport error).
type Error struct {
	Op         string // what failed, e.g. "read body", "send", "route"
	Upstream   string // upstream name, when one was involved
	Model      string // model sent, when known
	StatusCode int    // upstream status, when one came
	Err        error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("relay: ")
	b.WriteString(e.Op)
	if e.Upstream != "" {
		b.WriteString(" upstream ")
		b.WriteString(e.Upstream)
	}
	if e.Model != "" {
		b.WriteString(" model ")
		b.WriteString(e.Model)
	}
	if e.StatusCode != 0 {
		fmt.Fprintf(&b, " status %d", e.StatusCode)
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(strings.TrimPrefix(e.Err.Error(), "relay: "))
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// Config configures a Router. New copies it; changing it afterwards has no
// effect. The zero value of every field but Upstreams is a usable default.
type Config struct {
	// Upstreams are the OpenAI-compatible endpoints requests are sent to. At
	// least one is required. Order matters for requests that are not routed
	// by model (e.g. GET /models goes to the first one).
	Upstreams []Upstream

	// Policy decides each request's Route. If nil, the requested model is
	// kept and there are no fallbacks.
	Policy Policy

	// Prices maps model names to list prices. If nil, DefaultPrices() is
	// used. Names resolve with provider prefixes and date suffixes removed
	// (see LoadPrices).
	Prices map[string]Price

	// Base sends the requests. If nil, http.DefaultTransport is used.
	Base http.RoundTripper

	// OnReport is called exactly once per RoundTrip, when the response body
	// reaches EOF or is closed, or when no response came. It is called
	// synchronously on the goroutine that finished the request, with no lock
	// held, and must not block.
	OnReport func(Report)

	// MaxBodyBytes bounds the request body the router reads. If 0, 32 MiB.
	// A larger body fails with ErrBodyTooLarge and no upstream is called.
	MaxBodyBytes int64

	// Buckets sets the prompt-size thresholds of the bucket labels.
	Buckets Buckets

	// MemoEntries bounds the token-count memo (counts of message contents,
	// so a conversation that resends its history pays only for new
	// messages). If 0, 8192 entries; negative disables the memo.
	MemoEntries int

	// ImageTokens is the prompt-token estimate for one image content part.
	// If 0, 85 (OpenAI's fixed cost of a low-detail image); the true cost of
	// a high-detail image depends on its size, which the router does not
	// fetch.
	ImageTokens int

	// Strategy orders the upstreams serving a model (region.go). The zero
	// value is StrategyAffinity.
	Strategy Strategy
	// Jitter is the fraction of requests StrategyAffinity sends to an
	// upstream other than the key's home, at random, to break bursts. If 0,
	// 0.125; negative means none.
	Jitter float64
	// PromptCacheKey sets "prompt_cache_key" (the OpenAI field that steers
	// provider cache routing) from the request's affinity key when the
	// caller sent none, so requests sharing a prompt prefix share a key.
	PromptCacheKey bool
	// LoadFactor is the c of StrategyBoundedLoad: no upstream takes more
	// than ⌈c·average⌉ in-flight requests. If 0, 1.25; it must be at least 1.
	LoadFactor float64

	// Retry configures retries and fallbacks (retry.go).
	Retry RetryConfig

	// Hedge configures hedging (retry.go); off by default.
	Hedge HedgeConfig

	// Breaker configures the circuit breaker of each upstream (breaker.go).
	Breaker BreakerConfig

	// Limits configures backpressure waits (limit.go); per-upstream rates are
	// in Upstream.
	Limits LimitConfig

	// Stream configures the handling of server-sent-event answers (stream.go).
	Stream StreamConfig

	// Clock is the router's source of time. If nil, the real clock. Tests
	// inject a fake one.
	Clock Clock
}

// Format prints the Config with every API key redacted, for every verb.
func (c Config) Format(f fmt.State, verb rune) {
	type plain Config // no methods: prints fields; Upstream values redact themselves
	fmt.Fprintf(f, fmt.FormatString(f, verb), plain(c))
}

// Buckets are the prompt-token thresholds of the bucket labels: short below
// Mid, mid below Long, long from Long on.
type Buckets struct {
	Mid  int // first token count labelled "mid"; 0: 200
	Long int // first token count labelled "long"; 0: 900
}

// Bucket returns "short", "mid" or "long" for a prompt of n tokens.
func (b Buckets) Bucket(n int) string {
	switch {
	case n >= b.Long:
		return BucketLong
	case n >= b.Mid:
		return BucketMid
	default:
		return BucketShort
	}
}

// Bucket labels.
const (
	BucketShort = "short"
	BucketMid   = "mid"
	BucketLong  = "long"
)

// Upstream is one OpenAI-compatible endpoint (a provider, region or relay).
type Upstream struct {
	// Name identifies the upstream in reports, headers and stats; unique.
	Name string
	// BaseURL is the API root, e.g. "https://api.example.com/v1"; the
	// endpoint ("/chat/completions") is appended.
	BaseURL string
	// APIKey, when set, replaces the caller's Authorization header with
	// "Bearer APIKey". It never appears in errors, reports or printed values.
	APIKey string
	// Models the upstream serves. If empty, every model.
	Models []string
	// RPM and TPM cap requests and tokens per minute; 0 is no limit.
	RPM, TPM int
	// MaxInFlight caps concurrent requests to the upstream; 0 is no cap.
	MaxInFlight int
	// Weight is the share of traffic under the weighted strategy; 0 is 1.
	Weight float64
	// Header holds extra headers set on every request to this upstream.
	Header http.Header
	// BodyTags are top-level JSON fields set on every JSON request body
	// sent to this upstream, e.g. {"x_route_region": "eu-west"}.
	BodyTags map[string]any
	// PriceFactor scales list prices for this upstream (0.147 for an 85.3%
	// discount). If 0, 1.
	PriceFactor float64
	// KeyPrefixes, when set, are checked by New: APIKey must start with one
	// of them (e.g. "hs_live_", "hs_test_").
	KeyPrefixes []string
}

// Format prints the Upstream with its API key, header values and any
// password in BaseURL redacted, for every verb (keys often travel in
// headers such as Api-Key).
func (u Upstream) Format(f fmt.State, verb rune) {
	type plain Upstream
	u.APIKey = redact(u.APIKey)
	if len(u.Header) > 0 {
		h := make(http.Header, len(u.Header))
		for k := range u.Header {
			h[k] = []string{"[redacted]"}
		}
		u.Header = h
	}
	if p, err := url.Parse(u.BaseURL); err == nil && p.User != nil {
		u.BaseURL = p.Redacted()
	}
	fmt.Fprintf(f, fmt.FormatString(f, verb), plain(u))
}

func redact(key string) string {
	if key == "" {
		return ""
	}
	return "[redacted]"
}

// Policy decides where a request goes. Route is called once per RoundTrip
// (and per Decide), concurrently from many goroutines; it must be safe for
// concurrent use and should be fast. It must not modify r.Header.
type Policy interface {
	Route(r Request) Route
}

// PolicyFunc adapts a function to Policy.
type PolicyFunc func(Request) Route

// Route calls f(r).
func (f PolicyFunc) Route(r Request) Route { return f(r) }

// Request is what a Policy sees of a request.
type Request struct {
	Endpoint     string      // "chat/completions", "responses", "completions", "embeddings"; "" for other paths
	Model        string      // as the caller asked
	PromptTokens int         // tiktoken count, as the API bills the prompt
	MaxTokens    int         // max_tokens / max_completion_tokens / max_output_tokens; 0 when absent
	Stream       bool        // "stream": true
	Bucket       string      // "short", "mid" or "long", from Config.Buckets
	Header       http.Header // caller's headers, read-only
	// Load reports live load per model, so a rule can say "when busy". It
	// is never nil in a Request made by the router.
	Load Load
}

// Load is the policy's view of live load.
type Load interface {
	// Busy reports whether the model's upstreams are busy: their recent p99
	// latency is over the bound, or every one of them is saturated.
	Busy(model string) bool
}

// Route is a Policy's answer.
type Route struct {
	Model     string   // model to send; empty keeps the requested one
	Fallbacks []string // further models to try, in order, when Model's upstreams fail
	Bucket    string   // label for reports; empty: the request's bucket
}

// Decision is the router's answer for a request, without sending it.
type Decision struct {
	Request   Request
	Route     Route
	Upstreams []string // upstream names in the order they would be tried
}

// Report describes one finished RoundTrip.
type Report struct {
	RequestedModel, Model, Upstream, Bucket string

	Endpoint     string        // as in Request
	PromptTokens int           // the router's count, before sending
	Usage        Usage         // what was billed, as the upstream reported it
	CostUSD      float64       // effective cost (after the upstream's price factor)
	ListCostUSD  float64       // at list price
	Priced       bool          // false when the model has no price: CostUSD is then 0, not a guess
	Latency      time.Duration // RoundTrip start to body done
	TTFT         time.Duration // to the first content byte (streams) or the response headers
	Attempts     int           // upstream calls made, hedges included
	Hedged       bool          // a hedge was sent
	StatusCode   int           // final status; 0 when none came
	Stream       bool
	Err          error // nil on success

	// Context is the request's context, so a hook can tell which call a
	// report belongs to (e.g. a request ID kept in a context value). It may
	// be done by the time the report is made.
	Context context.Context
}

// Router is an http.RoundTripper that classifies, routes, rewrites, sends and
// reports OpenAI-compatible requests. Create it with New. It is safe for
// simultaneous use by multiple goroutines and runs no background goroutine.
type Router struct {
	cfg     Config
	base    http.RoundTripper
	clock   Clock
	ups     []*upstream
	byName  map[string]*upstream
	prices  map[string]Price
	counter *counter
	retry   retryPolicy
	maxBody int64

	breakers         *breakerSettings
	maxWait          time.Duration
	defaultMaxTokens int
	strategy         Strategy
	jitter           float64
	loadFactor       float64
	hedging          bool
	hedges           hedgeBudget
}

var _ http.RoundTripper = (*Router)(nil)

// New validates cfg and returns a Router. It reports every invalid upstream
// by name; no error contains an API key.
func New(cfg Config) (*Router, error) {
	if len(cfg.Upstreams) == 0 {
		return nil, errors.New("relay: config has no upstreams")
	}
	cfg.Upstreams = append([]Upstream(nil), cfg.Upstreams...)
	r := &Router{
		cfg:    cfg,
		base:   cfg.Base,
		clock:  cfg.Clock,
		byName: make(map[string]*upstream, len(cfg.Upstreams)),
		prices: cfg.Prices,
	}
	if r.base == nil {
		r.base = http.DefaultTransport
	}
	if r.clock == nil {
		r.clock = realClock{}
	}
	if r.prices == nil {
		r.prices = DefaultPrices()
	} else {
		r.prices = maps.Clone(r.prices) // the caller may keep changing theirs
	}
	if r.cfg.Buckets.Mid == 0 {
		r.cfg.Buckets.Mid = 200
	}
	if r.cfg.Buckets.Long == 0 {
		r.cfg.Buckets.Long = 900
	}
	if r.cfg.Buckets.Long < r.cfg.Buckets.Mid {
		return nil, fmt.Errorf("relay: Buckets.Long (%d) is below Buckets.Mid (%d)", r.cfg.Buckets.Long, r.cfg.Buckets.Mid)
	}
	r.maxBody = cfg.MaxBodyBytes
	if r.maxBody == 0 {
		r.maxBody = 32 << 20
	}
	if r.maxBody < 0 {
		return nil, errors.New("relay: MaxBodyBytes is negative")
	}
	if r.cfg.ImageTokens == 0 {
		r.cfg.ImageTokens = 85
	}
	memo := cfg.MemoEntries
	if memo == 0 {
		memo = 8192
	}
	r.counter = newCounter(memo)
	var err error
	if r.retry, err = newRetryPolicy(cfg.Retry); err != nil {
		return nil, err
	}
	if r.breakers, err = newBreakerSettings(cfg.Breaker); err != nil {
		return nil, err
	}
	r.maxWait = cfg.Limits.MaxWait
	if r.maxWait == 0 {
		r.maxWait = 2 * time.Second
	}
	r.maxWait = max(r.maxWait, 0)
	r.strategy = cfg.Strategy
	if r.strategy > StrategyPriority {
		return nil, fmt.Errorf("relay: unknown Strategy %d", cfg.Strategy)
	}
	r.jitter = cfg.Jitter
	if r.jitter == 0 {
		r.jitter = 0.125
	}
	r.jitter = min(max(r.jitter, 0), 1)
	r.loadFactor = cfg.LoadFactor
	if r.loadFactor == 0 {
		r.loadFactor = 1.25
	}
	if r.loadFactor < 1 {
		return nil, errors.New("relay: LoadFactor must be at least 1")
	}
	if cfg.Hedge.Delay < 0 || cfg.Hedge.Budget < 0 || cfg.Hedge.Budget > 1 || (cfg.Hedge.P95 && cfg.Hedge.Delay == 0) {
		return nil, errors.New("relay: invalid HedgeConfig: Delay must be positive (also with P95), Budget within [0, 1]")
	}
	r.hedging = cfg.Hedge.Delay > 0 || cfg.Hedge.P95
	budget := cfg.Hedge.Budget
	if budget == 0 {
		budget = 0.05
	}
	r.hedges.deposit = int64(budget * 1000)
	r.defaultMaxTokens = cfg.Limits.DefaultMaxTokens
	if r.defaultMaxTokens <= 0 {
		r.defaultMaxTokens = 1024
	}
	for i := range r.cfg.Upstreams {
		u, err := newUpstream(&r.cfg.Upstreams[i], r)
		if err != nil {
			return nil, err
		}
		if _, dup := r.byName[u.cfg.Name]; dup {
			return nil, fmt.Errorf("relay: upstream %q is configured twice", u.cfg.Name)
		}
		r.byName[u.cfg.Name] = u
		r.ups = append(r.ups, u)
	}
	return r, nil
}

func newUpstream(c *Upstream, r *Router) (*upstream, error) {
	if c.Name == "" {
		return nil, errors.New("relay: an upstream has no Name")
	}
	base, err := url.Parse(c.BaseURL)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, fmt.Errorf("relay: upstream %q: BaseURL must be an absolute http(s) URL", c.Name)
	}
	if len(c.KeyPrefixes) > 0 {
		ok := false
		for _, p := range c.KeyPrefixes {
			if strings.HasPrefix(c.APIKey, p) {
				ok = true
				break
			}
		}
		if !ok {
			return nil, fmt.Errorf("relay: upstream %q: APIKey does not start with any of the prefixes %q", c.Name, c.KeyPrefixes)
		}
	}
	if c.PriceFactor < 0 {
		return nil, fmt.Errorf("relay: upstream %q: PriceFactor is negative", c.Name)
	}
	if c.RPM < 0 || c.TPM < 0 || c.MaxInFlight < 0 || c.Weight < 0 {
		return nil, fmt.Errorf("relay: upstream %q: RPM, TPM, MaxInFlight and Weight must not be negative", c.Name)
	}
	base.Path = strings.TrimSuffix(base.Path, "/")
	base.RawPath = ""
	u := &upstream{cfg: c, base: base}
	if c.APIKey != "" {
		// The key lives only in this closure: the router's copy of the
		// config forgets it, so no printing of router state can reach it.
		auth := "Bearer " + c.APIKey
		u.auth = func() string { return auth }
		c.APIKey = ""
	}
	if len(c.Header) > 0 {
		u.header = make(http.Header, len(c.Header))
		for k, vs := range c.Header {
			u.header[http.CanonicalHeaderKey(k)] = slices.Clone(vs)
		}
	}
	c.Header, c.Models, c.KeyPrefixes, c.BodyTags = u.header, slices.Clone(c.Models), slices.Clone(c.KeyPrefixes), maps.Clone(c.BodyTags)
	if len(c.Models) > 0 {
		u.models = make(map[string]bool, len(c.Models))
		for _, m := range c.Models {
			u.models[m] = true
		}
	}
	if len(c.BodyTags) > 0 {
		for k, v := range c.BodyTags {
			switch k {
			case "model", "stream_options", "prompt_cache_key":
				return nil, fmt.Errorf("relay: upstream %q: body tag %q would clash with a field the router sets", c.Name, k)
			}
			raw, err := tagJSON(v)
			if err != nil {
				return nil, fmt.Errorf("relay: upstream %q: body tag %q: %v", c.Name, k, err)
			}
			u.tags = append(u.tags, bodyTag{key: k, raw: raw})
		}
	}
	u.factor = c.PriceFactor
	if u.factor == 0 {
		u.factor = 1
	}
	u.initRuntime(r)
	return u, nil
}

// Format prints the Router without its secrets, for every verb.
func (r *Router) Format(f fmt.State, verb rune) {
	names := make([]string, len(r.ups))
	for i, u := range r.ups {
		names[i] = u.cfg.Name
	}
	fmt.Fprintf(f, "relay.Router{Upstreams: %q}", names)
}

// CloseIdleConnections calls CloseIdleConnections on Config.Base when it has
// that method.
func (r *Router) CloseIdleConnections() {
	type closeIdler interface{ CloseIdleConnections() }
	if c, ok := r.base.(closeIdler); ok {
		c.CloseIdleConnections()
	}
}

// Busy implements Load for the router's own upstreams.
func (r *Router) Busy(model string) bool {
	any := false
	for _, u := range r.ups {
		if !u.serves(model) {
			continue
		}
		if !u.busy() {
			return false
		}
		any = true
	}
	return any
}
