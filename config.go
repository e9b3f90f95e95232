package relay

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/tokenrelay/relay/internal/prompt"
	"github.com/tokenrelay/relay/store"
)

// Config configures a Router. New copies it and checks every field;
// changing it afterwards has no effect.
//
// Every field but Upstreams has a usable zero value: zero means the default
// its doc names. A negative number or duration turns a setting off where its
// doc says "negative: off", and New refuses it everywhere else.
type Config struct {
	// Upstreams are the OpenAI-compatible endpoints requests are sent to. At
	// least one is required. Order matters for requests that are not routed
	// by model (e.g. GET /models goes to the first healthy one) and under
	// StrategyPriority.
	Upstreams []Upstream

	// Policy decides each request's Route. If nil, the requested model is
	// kept and there are no fallbacks.
	Policy Policy

	// Prices maps model names to list prices. If nil, DefaultPrices() is
	// used. Names resolve with provider prefixes and date suffixes removed
	// (see LoadPrices). New refuses a price that is negative, NaN,
	// infinite or above MaxPricePerMTok (see Price).
	Prices map[string]Price

	// Base sends the requests. If nil, http.DefaultTransport is used.
	Base http.RoundTripper

	// OnReport is called exactly once per RoundTrip, when the response body
	// reaches EOF or is closed, or when no response came. It is called
	// synchronously on the goroutine that finished the request, with no lock
	// held, and must not block.
	OnReport func(Report)

	// Hooks observe requests, attempts, waits and breakers as they happen
	// (see Hooks); OnReport and Breaker.OnChange are called as well as
	// Hooks.OnReport and Hooks.OnBreaker. The zero Hooks observe nothing, at
	// no cost.
	Hooks Hooks

	// MaxBodyBytes bounds the request body the router reads. If 0, 32 MiB.
	// A larger body fails with ErrBodyTooLarge and no upstream is called.
	MaxBodyBytes int64

	// Buckets sets the prompt-size thresholds of the bucket labels.
	Buckets Buckets

	// MemoEntries bounds the memo of token counts and affinity keys (the
	// counts of message contents, so a conversation that resends its
	// history pays only for new messages; the shard ends and keys of
	// prompts seen before). It is a table allocated once, three entries to
	// 64 bytes: about 171 KB with the default. If 0, 8192 entries;
	// negative: off.
	MemoEntries int

	// ImageTokens is the prompt-token estimate for one image content part.
	// If 0, 85 (OpenAI's fixed cost of a low-detail image); the true cost of
	// a high-detail image depends on its size, which the router does not
	// fetch.
	ImageTokens int

	// Strategy orders the upstreams serving a model. The zero value is
	// StrategyAffinity.
	Strategy Strategy
	// Jitter is the fraction of requests StrategyAffinity sends to an
	// upstream other than the key's home, at random, to break bursts. If 0,
	// 0.125; negative: off; at most 1.
	Jitter float64
	// PromptCacheKey sets "prompt_cache_key" (the OpenAI field that steers
	// provider cache routing) from the request's affinity key when the
	// caller sent none, so requests sharing a prompt prefix share a key.
	PromptCacheKey bool
	// LoadFactor is the c of StrategyBoundedLoad: no upstream takes more
	// than ⌈c·average⌉ in-flight requests. If 0, 1.25; at least 1.
	// StrategyExpectedCost keeps the same bound.
	LoadFactor float64
	// CacheRecordBlocks bounds the record StrategyExpectedCost keeps of
	// the prompt-prefix blocks (about 128 tokens each) each upstream
	// served: a table of that many blocks per upstream, 16 bytes each,
	// allocated on the upstream's first answer. If 0, 16384 (256 KB per
	// upstream).
	CacheRecordBlocks int

	// Retry configures retries and fallbacks.
	Retry RetryConfig

	// Hedge configures hedging; off by default.
	Hedge HedgeConfig

	// Breaker configures the circuit breaker of each upstream.
	Breaker BreakerConfig

	// Limits configures backpressure waits; per-upstream rates are in
	// Upstream.
	Limits Limits

	// Budgets cap spend (see Budget); none by default.
	Budgets []Budget
	// Currency is the billing currency: budgets are set in it and
	// Report.Cost is given in it. The zero Currency is USD.
	Currency Currency
	// Ledger keeps budget spend (see store.Ledger). If nil, State's when
	// one is set, else this process's.
	Ledger store.Ledger

	// State keeps the upstreams' limits, holds and circuits, and the
	// budgets, shared with the other replicas of the service (package
	// redisstate; see package store for the contract). If nil, they live
	// in this process only (store.NewLocal).
	State store.State
	// StateTimeout bounds each call to a shared State or Ledger on the
	// request path; a call that fails or times out is decided from this
	// replica's share instead (see docs/fleet-state.md). If 0, 1 s: a
	// healthy Redis shared by busy replicas on one loaded host answers
	// within half of it, and one that stalls costs the requests in flight
	// this long once a call, before its calls fail fast.
	StateTimeout time.Duration
	// Replicas is how many replicas share State: while it does not answer,
	// each replica decides from its share of the limits (RPM/Replicas and
	// TPM/Replicas) and of what is left of each budget, kept in step with
	// the fleet while it answers. Set it to at least the number of
	// replicas. If 0, 1.
	Replicas int

	// Stream configures the handling of server-sent-event answers.
	Stream StreamConfig

	// ModelTimeouts are the attempt, first-token and idle timeouts of the
	// attempts that send a model (keyed by the model name as routed: the
	// Route's Model or a fallback), field by field over the upstream's
	// Timeouts and the global settings (see Timeouts); zero fields inherit,
	// negative ones turn the bound off. When every upstream lists its
	// Models, New refuses a model none of them serves.
	ModelTimeouts map[string]Timeouts

	// ContextFallbacks are models (larger-window ones) tried, in order,
	// for a request that fits no model of its route, and once for a
	// request an upstream refused with context_length_exceeded.
	ContextFallbacks []string

	// Clamp, when on, lowers a request's output-token limit to what its
	// model's window and its budgets allow instead of refusing it (see
	// ClampConfig). Off by default.
	Clamp ClampConfig

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
	// endpoint ("/chat/completions") is appended. A query string in it
	// (e.g. api-version) comes before the caller's.
	BaseURL string
	// APIKey, when set, replaces the caller's Authorization header with
	// "Bearer APIKey" (on an Azure upstream: the Api-Key header, and the
	// caller's Authorization and Api-Key are dropped). When empty, the
	// caller's Authorization is forwarded unchanged. It never appears in
	// errors, reports or printed values.
	APIKey string
	// Models the upstream serves, as callers and policies name them. If
	// empty, every model.
	Models []string
	// ModelNames maps a model, as callers, policies, prices, budgets and
	// context windows name it, to the name this upstream expects, e.g.
	// {"gpt-4.1": "openai/gpt-4.1"} on OpenRouter, or the deployment on
	// Azure. A model it does not map is sent under its own name. The
	// router edits only the outgoing request (the body's model, on Azure
	// the path): reports, prices, budgets, fallbacks and the X-Relay-Model
	// header keep the caller's name; Report.UpstreamModel has the one
	// sent. It does not change what the upstream serves (Models does);
	// New refuses a key that Models, when set, does not list.
	ModelNames map[string]string
	// Azure, when set, makes the upstream speak the Azure OpenAI
	// deployment API (see AzureConfig): BaseURL is the resource endpoint
	// (https://NAME.openai.azure.com), calls go to the deployment's path
	// with the api-version, and APIKey goes in the Api-Key header. If nil,
	// the OpenAI API.
	Azure *AzureConfig
	// RPM and TPM cap requests and tokens per minute; 0 is no limit.
	RPM, TPM int
	// MaxInFlight caps concurrent requests to the upstream; 0 is no cap.
	MaxInFlight int
	// Weight is the share of traffic under StrategyWeighted; 0 is 1.
	Weight float64
	// Header holds extra headers set on every request to this upstream.
	// Their values are redacted when the Upstream is printed.
	Header http.Header
	// BodyTags are top-level JSON fields set on every JSON request body
	// sent to this upstream, e.g. {"x_route_region": "eu-west"}. The fields
	// the router sets itself (model, stream_options, prompt_cache_key) are
	// refused, and so are more than 61 tags.
	BodyTags map[string]any
	// PriceFactor scales list prices for this upstream (0.147 for an 85.3%
	// discount). If 0, 1.
	PriceFactor float64
	// KeyPrefixes, when set, are checked by New: APIKey must be set and
	// start with one of them (e.g. "hs_live_", "hs_test_").
	KeyPrefixes []string
	// Tags describe the upstream for requests that require some (e.g.
	// "region=eu", "tier=batch", "zdr"): such a request only ever goes to
	// upstreams that carry every tag it requires.
	Tags []string
	// Timeouts are the attempt, first-token and idle timeouts of the
	// attempts sent to this upstream, field by field over the global
	// settings; a model's entry in Config.ModelTimeouts wins over them (see
	// Timeouts). Zero fields inherit; negative ones turn the bound off.
	Timeouts Timeouts
	// Cache says how the upstream's provider caches prompt prefixes, for
	// StrategyExpectedCost's prediction of cached tokens. The zero value
	// is OpenAI's rules (1024 tokens at least, steps of 128, 5 minutes).
	Cache CacheRules
}

// Format prints the Upstream with its API key, header values and any
// password in BaseURL redacted, for every verb (keys often travel in
// headers such as Api-Key).
func (u Upstream) Format(f fmt.State, verb rune) {
	type plain Upstream
	if u.APIKey != "" {
		u.APIKey = "[redacted]"
	}
	if len(u.Header) > 0 {
		h := make(http.Header, len(u.Header))
		for k := range u.Header {
			h[k] = []string{"[redacted]"}
		}
		u.Header = h
	}
	u.BaseURL = redactURL(u.BaseURL)
	fmt.Fprintf(f, fmt.FormatString(f, verb), plain(u))
}

// RetryConfig configures retries and fallbacks. Each retry goes to the next
// candidate: another upstream serving the model, then the route's fallback
// models in order.
type RetryConfig struct {
	// MaxAttempts is the number of upstream calls in all, the first one
	// included. If 0, 3; 1 disables retries.
	MaxAttempts int
	// InitialInterval is the first backoff wait. If 0, 100 ms.
	InitialInterval time.Duration
	// MaxInterval caps a backoff wait. If 0, 1.2 s.
	MaxInterval time.Duration
	// Multiplier grows the wait after each retry. If 0, 2.
	Multiplier float64
	// RandomizationFactor spreads each wait over [w·(1−f), w·(1+f)]. If 0,
	// 0.5; negative: off; below 1.
	RandomizationFactor float64
	// MaxRetryAfter caps the wait a server may ask for with retry-after-ms
	// or Retry-After. A hint sets the wait when the retry goes back to the
	// upstream that sent it, and a response asking for longer than the cap
	// is then returned to the caller at once instead of waited for. When the
	// next candidate is another upstream, the backoff applies (the limiter
	// holds the hinting upstream). If 0, 8 s.
	MaxRetryAfter time.Duration
	// AttemptTimeout bounds each attempt's time to response headers. If 0,
	// no bound but the request's context. Upstream.Timeouts and
	// Config.ModelTimeouts set it per upstream and per model.
	AttemptTimeout time.Duration
	// ShouldRetry decides whether an outcome may succeed elsewhere. If nil,
	// DefaultShouldRetry. It is never asked when the request's context
	// ended.
	ShouldRetry func(resp *http.Response, err error) bool
	// Backoff returns the wait before retry n of a request (1 for the
	// first retry); a negative wait stops retrying. Server hints win over
	// it. If nil, exponential backoff with the intervals above
	// (github.com/cenkalti/backoff's ExponentialBackOff, one per request).
	// It is called concurrently.
	Backoff func(n int) time.Duration
	// BadAnswerFallbacks are models a bad 2xx answer is retried on, at
	// once and as one of MaxAttempts: an answer a content filter stopped
	// (a choice's finish_reason "content_filter"; a Responses answer
	// incomplete for "content_filter") or one with no output (no text,
	// refusal or tool call). A plain answer is judged when its body came
	// whole within 1 s and 1 MiB, a stream before its first content (see
	// StreamConfig.FailoverWindow). The next model is the one after the
	// answering model in the list, or the first when it is not in it; the
	// attempts that follow go to that model's upstreams (a failure there is
	// retried on them, never on a model whose answer was bad).
	// Report.BadAnswer says why an answer was set aside, and its usage is
	// billed with the hedges' (Report.HedgeUsage). When no later attempt
	// answers, the bad answer is returned. If empty, off.
	BadAnswerFallbacks []string
}

// HedgeConfig configures hedging: a request with no response headers after
// the hedge delay gets a second attempt on the next candidate; the first
// response wins and the other attempt is cancelled and its body closed.
// Hedging is off unless Delay is set. A stream is never hedged once a byte
// reached the caller (hedging acts before response headers).
//
// Each hedge runs the two attempts on goroutines; a losing attempt that is
// still in flight is cancelled, and its goroutine ends as soon as the
// cancelled call returns.
type HedgeConfig struct {
	// Delay is the fixed hedge delay, and the floor of the P95 delay.
	Delay time.Duration
	// P95 uses the first upstream's observed p95 time to headers as the
	// delay once 20 samples are in; Delay (required with P95) is the delay
	// before that, and the floor after. Once the upstream's fit of time to
	// first token against prompt size holds 20 answers of the model (and
	// kind: stream or not), the delay is the p95 that fit predicts for the
	// request's size instead (docs/routing.md: time to first token by size).
	P95 bool
	// Budget caps hedges to a fraction of requests, so an outage does not
	// double the load: each request adds Budget to a balance (capped at 10
	// hedges) and each hedge spends 1. If 0, 0.05; at most 1. An attempt
	// is looked at when the delay is up and again after 2, 4, 8… delays,
	// until it answers or a look finds a hedge; the first look leaves 2
	// hedges in the balance for the later ones, so that a short budget
	// goes to the attempts that stay slow longest.
	Budget float64
}

// BreakerConfig configures the circuit breaker of every upstream.
//
// A breaker is closed (traffic flows), open (the upstream is dropped from
// the candidate order) or half-open (one real request probes it). It opens
// after more than Failures consecutive failures, or when the p99 latency of
// the upstream's last 200 requests passes P99. After Cooldown (stretched by a
// Retry-After the upstream sent) it is half-open: the next request that
// would use it is the probe. Success closes it; failure opens it again with
// the cooldown doubled, up to MaxCooldown.
//
// Failures are 5xx, 429 and connection errors (per-attempt timeouts
// included). Other 4xx, caused by the request, and cancelled requests count
// neither way. There is no background goroutine: every transition is
// computed from timestamps of Config.Clock when the breaker is consulted.
type BreakerConfig struct {
	// Failures is the number of consecutive failures the breaker tolerates;
	// one more opens it. If 0, 5; negative: off.
	Failures int
	// P99 opens the breaker when the p99 latency (to response headers) of
	// the last 200 requests exceeds it, once MinSamples are in. If 0,
	// 1.5 s; negative: off.
	P99 time.Duration
	// MinSamples is the number of latencies needed before P99 can trip. If
	// 0, 20.
	MinSamples int
	// Cooldown is the first open period. If 0, 30 s.
	Cooldown time.Duration
	// MaxCooldown caps the doubled cooldown. If 0, 5 min.
	MaxCooldown time.Duration
	// BusyP99 is the recent p99 latency over which an upstream counts as
	// busy for Load.Busy. If 0, 1 s.
	BusyP99 time.Duration
	// ProbePath, when set, turns on the active health probe: an open
	// upstream whose cooldown ended is not handed a user request as its
	// probe; it waits until Router.Probe (called from the user's own ticker)
	// gets a 2xx for GET BaseURL+ProbePath (e.g. "/models").
	ProbePath string
	// OnChange is called on every state change, synchronously, with no lock
	// held. It must not block.
	OnChange func(BreakerEvent)
}

// Limits configures backpressure. Per-upstream rates and caps are in
// Upstream (RPM, TPM, MaxInFlight).
//
// Each upstream's RPM and TPM are buckets that refill continuously and hold
// at most one minute's quota, kept by the router's store (package store;
// GCRA). A request
// takes one request token and a TPM charge of its prompt tokens plus its max
// output tokens (DefaultMaxTokens when it sets none), clamped to the bucket
// size. The router tries candidates in order and takes the first that can
// serve the request now; when none can, it waits for the one that can serve
// soonest, at most MaxWait and never past the request's context; when that
// is too long for all of them, RoundTrip fails with ErrRateLimited at once
// and no upstream is called. Requests that wait for one upstream queue by
// priority: only the head of the queue asks the store, once per answer,
// and a request whose turn in the queue could not come in time is refused
// at once.
//
// The upstream's own word counts too: x-ratelimit-remaining-requests or
// -tokens of 0 hold the upstream until x-ratelimit-reset-requests or
// -tokens (Go durations such as "6m0s", "120ms"; at most an hour); a 429
// holds it for its Retry-After (1 s when it gives none, a minute at most). A
// hold affects that upstream only, never the whole model.
type Limits struct {
	// MaxWait bounds the wait for an upstream's rate-limit tokens or
	// in-flight slot. If 0, 2 s; negative: off (never wait).
	MaxWait time.Duration
	// DefaultMaxTokens is the output-token estimate in a request's TPM
	// charge when it sets no max tokens. If 0, 1024; negative: off (the
	// charge is the prompt alone).
	DefaultMaxTokens int
}

// StreamConfig configures the handling of server-sent-event answers
// (2xx responses with Content-Type text/event-stream).
//
// The bytes of a stream reach the caller as they arrive, unchanged. The
// reader gets an error wrapping io.ErrUnexpectedEOF when the stream is cut
// (see the README's Streaming section for how an end is told from a cut),
// and one wrapping ErrStreamStalled when it went idle. One Report is made
// per stream, when the reader hits EOF or an error, or closes the body; its
// TTFT runs from RoundTrip's start to the first chunk carrying content
// (text, refusal or a tool-call delta), and is 0 when no such chunk came.
type StreamConfig struct {
	// IdleTimeout closes a stream that sent no byte for this long while the
	// caller was waiting in Read; the reader then gets ErrStreamStalled. If
	// 0, 25 s; negative: off. Upstream.Timeouts and Config.ModelTimeouts
	// set it per upstream and per model.
	IdleTimeout time.Duration
	// FailoverWindow bounds the hold of a stream's response until its
	// first content chunk (text, refusal, tool call), so that a stream that
	// fails before it can be retried elsewhere, under RetryConfig, while
	// nothing has reached the caller: an error event (judged as the status
	// its error counts as: a rate limit as a 429 with its retry hint, a
	// server error as a 500, an invalid request as a 400, which is not
	// retried), a cut, data that is not JSON, or a stall (IdleTimeout counts
	// during the hold). The held bytes then reach the caller unchanged. A
	// stream still without content once the window has passed (looked at
	// as its bytes arrive), or after 1 MiB, is handed over as it is; so is
	// every stream of the last attempt. If 0, 10 s; negative: off (a stream
	// is handed over at its headers). FirstTokenTimeout, when set, is the
	// hold's bound instead.
	FailoverWindow time.Duration
	// FirstTokenTimeout, when set, holds a stream's response until its first
	// content chunk; if none comes within this time of the response headers
	// the router cancels that upstream and tries the next candidate (as a
	// retry, under RetryConfig), while nothing has reached the caller; a
	// stream that fails before its first content is retried as under
	// FailoverWindow. Once a byte reached the caller, a stream is never
	// retried. If 0, off. Upstream.Timeouts and Config.ModelTimeouts set it
	// per upstream and per model.
	FirstTokenTimeout time.Duration
	// KeepUsageOption turns off the injection of
	// stream_options.include_usage. By default, when a chat or completions
	// stream does not ask for usage, the router asks for it and removes that
	// extra usage chunk (and its event line, if any) from what the caller
	// reads. With injection off, such a stream's usage is estimated locally
	// (Usage.Estimated).
	KeepUsageOption bool
}

// settings is a Config with every default filled in and every field
// checked: the only form of the configuration the Router reads.
type settings struct {
	base             http.RoundTripper
	clock            Clock
	policy           Policy
	prices           map[string]Price
	hooks            Hooks // Config.Hooks joined with OnReport and Breaker.OnChange
	onReport         func(Report)
	maxBody          int64
	buckets          Buckets
	memoEntries      int // 0: no memo
	imageTokens      int
	strategy         Strategy
	jitter           float64
	cacheKey         bool
	loadFactor       float64
	retry            retrySettings
	hedge            hedgeSettings
	breaker          breakerSettings
	busyP99          time.Duration
	maxWait          time.Duration
	defaultMaxTokens int
	stream           streamSettings
	upstreams        []upstreamSettings
	secrets          secrets     // what to redact from upstream text
	state            store.State // nil: in-process
	stateTimeout     time.Duration
	replicas         int
	budgets          []budgetSettings
	contextFallbacks []string
	currency         Currency     // Code and PerUSD set
	ledger           store.Ledger // nil: the State's
	clamp            clampSettings
	recordBlocks     int // CacheRecordBlocks
}

type retrySettings struct {
	maxAttempts   int
	initial, max  time.Duration
	multiplier    float64
	randomization float64
	maxRetryAfter time.Duration
	shouldRetry   func(*http.Response, error) bool
	backoff       func(int) time.Duration // nil: exponential
	badAnswer     []string                // BadAnswerFallbacks
}

type hedgeSettings struct {
	on      bool
	delay   time.Duration
	p95     bool
	deposit int64 // millionths of a hedge each request adds to the balance
}

type breakerSettings struct {
	failures    int           // 0: failure counting off
	p99         time.Duration // 0: latency trip off
	minSamples  int
	cooldown    time.Duration
	maxCooldown time.Duration
	probePath   string // "": user requests probe
	onChange    func(BreakerEvent)
	policy      store.CircuitPolicy // the rule the store applies
}

// streamSettings are the stream settings but for the timeouts, which are
// each upstream's (see candidate.timeouts).
type streamSettings struct {
	window      time.Duration // FailoverWindow; 0: off
	injectUsage bool
}

// upstreamSettings is an Upstream checked, with its key sealed in a
// closure so that no printing of router state can reach it.
type upstreamSettings struct {
	cfg    Upstream // APIKey cleared; slices and maps are the router's own
	base   *url.URL
	auth   func() string   // "Bearer <key>" (Azure: "<key>"); nil keeps the caller's Authorization
	models map[string]bool // nil: every model
	tags   []bodyTag
	factor float64 // price factor, 1 for list price
	weight float64

	authHeader string            // the header auth goes in: Authorization, or Api-Key on Azure
	names      map[string]string // ModelNames; nil: none
	azure      string            // the Azure api-version; "": not Azure
	// timeouts are its attempts' (its own over the global ones, resolved);
	// byModel, those of the ModelTimeouts models it serves.
	timeouts Timeouts
	byModel  map[string]Timeouts
	cache    cacheRules // Cache, resolved
}

// bodyTag is a top-level JSON field set on every request body to an upstream.
type bodyTag struct {
	key string // the field's name
	raw []byte // its JSON value
}

// resolve fills in every default of c and checks every field, reporting
// all problems at once. No message contains an API key.
func resolve(c Config) (settings, error) {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("relay: "+format, args...)) }
	s := settings{
		base: c.Base, clock: c.Clock, policy: c.Policy,
		hooks:   JoinHooks(Hooks{OnReport: c.OnReport, OnBreaker: c.Breaker.OnChange}, c.Hooks),
		maxBody: orDefault(c.MaxBodyBytes, 32<<20), buckets: c.Buckets,
		memoEntries: offOr(c.MemoEntries, 8192), imageTokens: orDefault(c.ImageTokens, 85),
		strategy: c.Strategy, jitter: offOr(c.Jitter, 0.125), cacheKey: c.PromptCacheKey,
		loadFactor: orDefault(c.LoadFactor, 1.25), busyP99: orDefault(c.Breaker.BusyP99, time.Second),
		maxWait: offOr(c.Limits.MaxWait, 2*time.Second), defaultMaxTokens: offOr(c.Limits.DefaultMaxTokens, 1024),
	}
	if s.base == nil {
		s.base = http.DefaultTransport
	}
	if s.clock == nil {
		s.clock = realClock{}
	}
	s.prices = clonePrices(c.Prices) // the caller may keep changing theirs
	if s.prices == nil {
		s.prices = DefaultPrices()
	}
	checkPrices(s.prices, bad)
	s.buckets.Mid, s.buckets.Long = orDefault(c.Buckets.Mid, 200), orDefault(c.Buckets.Long, 900)
	notNegative(bad, "Buckets.Mid", c.Buckets.Mid)
	notNegative(bad, "Buckets.Long", c.Buckets.Long)
	if s.buckets.Mid >= 0 && s.buckets.Long >= 0 && s.buckets.Long < s.buckets.Mid {
		bad("Buckets.Long (%d) is below Buckets.Mid (%d)", s.buckets.Long, s.buckets.Mid)
	}
	if s.maxBody < 0 {
		bad("MaxBodyBytes %d is negative", c.MaxBodyBytes)
	}
	if s.imageTokens < 0 {
		bad("ImageTokens %d is negative", c.ImageTokens)
	}
	s.recordBlocks = orDefault(c.CacheRecordBlocks, defaultRecordBlocks)
	notNegative(bad, "CacheRecordBlocks", c.CacheRecordBlocks)
	if s.strategy > StrategyExpectedCost {
		bad("unknown Strategy %d", c.Strategy)
	}
	if !(s.jitter <= 1) || math.IsInf(s.jitter, -1) {
		bad("Jitter %g is over 1", c.Jitter)
	}
	if !(s.loadFactor >= 1) || math.IsInf(s.loadFactor, 1) {
		bad("LoadFactor %g must be at least 1 (and finite)", c.LoadFactor)
	}
	if s.busyP99 < 0 {
		bad("Breaker.BusyP99 %s is negative", c.Breaker.BusyP99)
	}
	s.retry = resolveRetry(c.Retry, bad)
	s.hedge = resolveHedge(c.Hedge, bad)
	s.onReport = s.hooks.OnReport
	s.breaker = resolveBreaker(c.Breaker, bad)
	s.breaker.onChange = s.hooks.OnBreaker
	s.stream = streamSettings{injectUsage: !c.Stream.KeepUsageOption}
	s.stream.window = offOr(c.Stream.FailoverWindow, 10*time.Second)
	s.upstreams = resolveUpstreams(c.Upstreams, bad)
	resolveTimeouts(c, s.upstreams, bad)
	s.budgets = resolveBudgets(c.Budgets, bad)
	s.contextFallbacks = slices.Clone(c.ContextFallbacks)
	s.clamp = resolveClamp(c.Clamp, bad)
	s.currency = Currency{Code: c.Currency.Code, PerUSD: orDefault(c.Currency.PerUSD, 1)}
	if s.currency.Code == "" {
		s.currency.Code = "USD"
	}
	if !(s.currency.PerUSD >= 0) || math.IsInf(s.currency.PerUSD, 1) {
		bad("Currency.PerUSD %g must be a finite positive number", c.Currency.PerUSD)
	}
	resolveShared(&s, c, bad)
	checkModelNames(c, bad)
	checkBudgetPrices(c, s.prices, bad)
	s.secrets = newSecrets(c.Upstreams)
	checkWritten(c, bad)
	return s, errors.Join(errs...)
}

// notNegative reports a setting below zero, naming it and its value.
func notNegative[T ~int | ~int64 | ~float64](bad func(string, ...any), name string, v T) {
	if v < 0 {
		bad("%s %v is negative", name, v)
	}
}

// defaultStateTimeout is Config.StateTimeout's default.
const defaultStateTimeout = time.Second

// resolveShared fills in what replicas share: the State, its bounds, the
// ledger.
func resolveShared(s *settings, c Config, bad func(string, ...any)) {
	s.state, s.stateTimeout, s.replicas = c.State, orDefault(c.StateTimeout, defaultStateTimeout), orDefault(c.Replicas, 1)
	notNegative(bad, "StateTimeout", c.StateTimeout)
	notNegative(bad, "Replicas", c.Replicas)
	s.ledger = c.Ledger
}

func resolveRetry(c RetryConfig, bad func(string, ...any)) retrySettings {
	r := retrySettings{
		maxAttempts: orDefault(c.MaxAttempts, 3), initial: orDefault(c.InitialInterval, 100*time.Millisecond),
		max: orDefault(c.MaxInterval, 1200*time.Millisecond), multiplier: orDefault(c.Multiplier, 2),
		randomization: offOr(c.RandomizationFactor, 0.5), maxRetryAfter: orDefault(c.MaxRetryAfter, 8*time.Second),
		shouldRetry: c.ShouldRetry, backoff: c.Backoff,
		badAnswer: slices.Clone(c.BadAnswerFallbacks),
	}
	if r.shouldRetry == nil {
		r.shouldRetry = DefaultShouldRetry
	}
	notNegative(bad, "Retry.MaxAttempts", c.MaxAttempts)
	notNegative(bad, "Retry.InitialInterval", c.InitialInterval)
	notNegative(bad, "Retry.MaxInterval", c.MaxInterval)
	notNegative(bad, "Retry.Multiplier", c.Multiplier)
	notNegative(bad, "Retry.MaxRetryAfter", c.MaxRetryAfter)
	if r.randomization >= 1 {
		bad("Retry.RandomizationFactor %g must be below 1", c.RandomizationFactor)
	}
	for i, m := range c.BadAnswerFallbacks {
		if m == "" || hasCtl(m) {
			bad("Retry.BadAnswerFallbacks[%d] %q is empty or has a control character", i, m)
		}
	}
	return r
}

func resolveHedge(c HedgeConfig, bad func(string, ...any)) hedgeSettings {
	notNegative(bad, "Hedge.Delay", c.Delay)
	if c.P95 && c.Delay == 0 {
		bad("Hedge.P95 needs a positive Delay (its floor)")
	}
	if c.Budget < 0 || c.Budget > 1 {
		bad("Hedge.Budget %g is outside [0, 1]", c.Budget)
	}
	if c.Budget > 0 && c.Budget < 1e-6 {
		// The budget is kept in millionths of a hedge per request.
		bad("Hedge.Budget %g is under 1e-6, the smallest share it keeps", c.Budget)
	}
	return hedgeSettings{on: c.Delay > 0, delay: c.Delay, p95: c.P95, deposit: int64(math.Round(orDefault(c.Budget, 0.05) * hedgeUnit))}
}

func resolveBreaker(c BreakerConfig, bad func(string, ...any)) breakerSettings {
	b := breakerSettings{
		failures: offOr(c.Failures, 5), p99: offOr(c.P99, 1500*time.Millisecond),
		minSamples: orDefault(c.MinSamples, 20), cooldown: orDefault(c.Cooldown, 30*time.Second),
		maxCooldown: orDefault(c.MaxCooldown, 5*time.Minute), probePath: c.ProbePath, onChange: c.OnChange,
	}
	notNegative(bad, "Breaker.MinSamples", c.MinSamples)
	notNegative(bad, "Breaker.Cooldown", c.Cooldown)
	notNegative(bad, "Breaker.MaxCooldown", c.MaxCooldown)
	b.maxCooldown = max(b.maxCooldown, b.cooldown)
	b.policy = store.CircuitPolicy{Failures: b.failures, Cooldown: b.cooldown, MaxCooldown: b.maxCooldown}
	return b
}

func resolveUpstreams(list []Upstream, bad func(string, ...any)) []upstreamSettings {
	if len(list) == 0 {
		bad("config has no upstreams")
	}
	out := make([]upstreamSettings, 0, len(list))
	seen := make(map[string]bool, len(list))
	for i := range list {
		u, err := resolveUpstream(list[i])
		if err != nil {
			bad("%v", err)
			continue
		}
		if seen[u.cfg.Name] {
			bad("upstream %q is configured twice", u.cfg.Name)
			continue
		}
		seen[u.cfg.Name] = true
		out = append(out, u)
	}
	return out
}

// resolveUpstream checks one upstream and reports all its problems at once.
func resolveUpstream(c Upstream) (upstreamSettings, error) {
	var errs []string
	name := c.Name
	if name == "" {
		name = "(unnamed)"
		errs = append(errs, "has no Name")
	}
	base, err := url.Parse(c.BaseURL)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		errs = append(errs, fmt.Sprintf("BaseURL %q must be an absolute http(s) URL", redactURL(c.BaseURL)))
	} else if e := endpointInBaseURL(base); e != "" {
		errs = append(errs, e)
	}
	if len(c.KeyPrefixes) > 0 {
		switch {
		case slices.Contains(c.KeyPrefixes, ""):
			// (an empty prefix passes any key, and would make every word
			// of the router's redaction look like a key)
			errs = append(errs, "KeyPrefixes has an empty prefix")
		case c.APIKey == "":
			errs = append(errs, "APIKey is empty")
		case !slices.ContainsFunc(c.KeyPrefixes, func(p string) bool { return strings.HasPrefix(c.APIKey, p) }):
			errs = append(errs, fmt.Sprintf("APIKey does not start with any of the prefixes %q", c.KeyPrefixes))
		}
	}
	if !(c.PriceFactor >= 0) || math.IsInf(c.PriceFactor, 1) {
		errs = append(errs, fmt.Sprintf("PriceFactor %g is negative or not finite", c.PriceFactor))
	}
	errs = append(errs, upstreamProblems(c)...)
	errs = append(errs, nameProblems(c)...)
	cache, cacheErrs := resolveCache(c.Cache)
	errs = append(errs, cacheErrs...)
	tags, tagErrs := resolveTags(c.BodyTags)
	errs = append(errs, tagErrs...)
	if len(c.BodyTags) > maxBodyTags {
		// The body edit sets at most 64 fields: the tags, the model,
		// prompt_cache_key and stream_options.
		errs = append(errs, fmt.Sprintf("%d BodyTags, at most %d", len(c.BodyTags), maxBodyTags))
	}
	if len(errs) > 0 {
		return upstreamSettings{}, fmt.Errorf("upstream %q: %s", name, strings.Join(errs, "; "))
	}
	base.Path = strings.TrimSuffix(base.Path, "/")
	base.RawPath = ""
	u := upstreamSettings{base: base, tags: tags, factor: orDefault(c.PriceFactor, 1), weight: orDefault(c.Weight, 1), cache: cache}
	resolveNames(&c, &u)
	if c.APIKey != "" {
		auth := "Bearer " + c.APIKey
		if c.Azure != nil {
			auth = c.APIKey
		}
		u.auth = func() string { return auth }
	}
	c.APIKey = ""
	if len(c.Header) > 0 {
		h := make(http.Header, len(c.Header))
		for k, vs := range c.Header {
			h[http.CanonicalHeaderKey(k)] = slices.Clone(vs)
		}
		c.Header = h
	}
	c.Models, c.KeyPrefixes, c.BodyTags, c.Tags = slices.Clone(c.Models), slices.Clone(c.KeyPrefixes), maps.Clone(c.BodyTags), slices.Clone(c.Tags)
	if len(c.Models) > 0 {
		u.models = make(map[string]bool, len(c.Models))
		for _, m := range c.Models {
			u.models[m] = true
		}
	}
	u.cfg = c
	return u, nil
}

// maxBodyTags bounds an upstream's BodyTags.
const maxBodyTags = 61

func resolveTags(tags map[string]any) ([]bodyTag, []string) {
	var out []bodyTag
	var errs []string
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		switch k {
		case "model", "stream_options", "prompt_cache_key":
			errs = append(errs, fmt.Sprintf("body tag %q would clash with a field the router sets", k))
			continue
		}
		raw, err := json.Marshal(tags[k])
		if err != nil {
			errs = append(errs, fmt.Sprintf("body tag %q: %v", k, err))
			continue
		}
		out = append(out, bodyTag{key: k, raw: raw})
	}
	return out, errs
}

// orDefault returns v, or def when v is zero.
func orDefault[T int | int64 | float64 | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// offOr returns def when v is zero, 0 (off) when v is negative, else v.
func offOr[T int | float64 | time.Duration](v, def T) T {
	if v < 0 {
		return 0
	}
	return orDefault(v, def)
}

// endpointInBaseURL explains a BaseURL that ends in an endpoint's path
// ("…/v1/chat/completions" would be sent to
// "…/v1/chat/completions/chat/completions"); "" when it does not.
func endpointInBaseURL(base *url.URL) string {
	ep := prompt.Endpoint(base.Path)
	if ep == "" {
		return ""
	}
	root := *base
	root.Path = strings.TrimSuffix(strings.TrimSuffix(base.Path, "/"), "/"+ep)
	root.RawPath = ""
	return fmt.Sprintf("BaseURL %q ends in the endpoint %q: give the API root (%q); the router appends the endpoint",
		redactURL(base.String()), "/"+ep, redactURL(root.String()))
}

// upstreamProblems lists what is wrong with an upstream's numbers, key
// and headers, naming each field and bad value (never a key or a header
// value, which may be secrets).
func upstreamProblems(c Upstream) []string {
	var errs []string
	for _, f := range []struct {
		name string
		v    int
	}{{"RPM", c.RPM}, {"TPM", c.TPM}, {"MaxInFlight", c.MaxInFlight}} {
		if f.v < 0 {
			errs = append(errs, fmt.Sprintf("%s %d is negative", f.name, f.v))
		}
	}
	if !(c.Weight >= 0) || math.IsInf(c.Weight, 1) {
		errs = append(errs, fmt.Sprintf("Weight %g is negative or not finite", c.Weight))
	}
	if e := apiKeyProblem(c.APIKey); e != "" {
		errs = append(errs, e)
	}
	for _, k := range slices.Sorted(maps.Keys(c.Header)) {
		if e := headerProblem(k, c.Header[k]); e != "" {
			errs = append(errs, e)
		}
	}
	return errs
}

// apiKeyProblem explains an APIKey that no request can carry as it is
// meant to, or "" when it is fine: the router sends "Bearer " + APIKey, so
// a key that starts with "Bearer " would be sent as "Bearer Bearer …", and
// white space or a control character (a newline left by a file or an
// environment variable) makes every request fail. The key itself is never
// named.
func apiKeyProblem(key string) string {
	switch {
	case key == "":
		return ""
	case len(key) >= len("bearer ") && strings.EqualFold(key[:len("bearer ")], "bearer "):
		return `APIKey starts with "Bearer ": give the key alone; the router adds "Bearer "`
	case strings.TrimSpace(key) != key:
		return "APIKey has leading or trailing white space (a newline read with the key?)"
	case strings.ContainsFunc(key, func(r rune) bool { return r <= ' ' || r == 0x7f }):
		return "APIKey contains white space or a control character"
	}
	return ""
}

// headerProblem explains an Upstream.Header entry that HTTP cannot carry:
// a name that is not a token, or a value with a control character (CR, LF,
// NUL...). The value is never named: it may be a key.
func headerProblem(name string, values []string) string {
	if !validHeaderName(name) {
		return fmt.Sprintf("Header name %q is not a valid HTTP header name", name)
	}
	for _, v := range values {
		if !validHeaderValue(v) {
			return fmt.Sprintf("Header %q has a value with a control character (CR, LF, NUL...)", name)
		}
	}
	return ""
}

// validHeaderName reports whether name is an HTTP token (RFC 9110), as
// net/http requires of a header name.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// validHeaderValue reports whether v can be sent as a header value: no
// control character but horizontal tab (net/http refuses the others).
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// namedModel is a model name the configuration gives, and the field that
// gives it.
type namedModel struct{ field, model string }

// namedModels lists the models the configuration routes to besides the
// requested ones: a ClusterPolicy's, the budgets' Downgrade models,
// ContextFallbacks and Retry.BadAnswerFallbacks.
func namedModels(c Config) []namedModel {
	var out []namedModel
	add := func(field, model string) {
		if model != "" {
			out = append(out, namedModel{field, model})
		}
	}
	var p *ClusterPolicy
	switch v := c.Policy.(type) {
	case ClusterPolicy:
		p = &v
	case *ClusterPolicy:
		p = v
	}
	if p != nil {
		add("Policy (ClusterPolicy).Fast", p.Fast)
		add("Policy (ClusterPolicy).Cheap", p.Cheap)
		for i, m := range p.Fallbacks {
			add(fmt.Sprintf("Policy (ClusterPolicy).Fallbacks[%d]", i), m)
		}
	}
	for i, b := range c.Budgets {
		add(fmt.Sprintf("Budgets[%d] (%q).Downgrade", i, b.Name), b.Downgrade)
	}
	for i, m := range c.ContextFallbacks {
		add(fmt.Sprintf("ContextFallbacks[%d]", i), m)
	}
	for i, m := range c.Retry.BadAnswerFallbacks {
		add(fmt.Sprintf("Retry.BadAnswerFallbacks[%d]", i), m)
	}
	return out
}

// servedModels is the set of models the upstreams list, or nil when one
// of them lists none (it serves every model).
func servedModels(ups []Upstream) map[string]bool {
	served := map[string]bool{}
	for _, u := range ups {
		if len(u.Models) == 0 {
			return nil
		}
		for _, m := range u.Models {
			served[m] = true
		}
	}
	return served
}

// checkModelNames refuses a model the configuration routes to that no
// upstream serves, when every upstream lists its Models (a typo would
// otherwise route to nothing, and a ClusterPolicy would quietly fall back
// to the requested model).
func checkModelNames(c Config, bad func(string, ...any)) {
	served := servedModels(c.Upstreams)
	if len(c.Upstreams) == 0 || served == nil {
		return
	}
	for _, n := range namedModels(c) {
		if !served[n.model] {
			bad("%s %q is served by no upstream (none lists it in Models; an upstream with no Models would serve every model)", n.field, n.model)
		}
	}
}

// checkBudgetPrices refuses a budget that would let spend through
// uncounted: one without an UnpricedPrice that covers a model the
// configuration names (an upstream's Models, namedModels) without a
// price, or any budget without one when Prices is empty. It checks the
// UnpricedPrice of the others.
func checkBudgetPrices(c Config, prices map[string]Price, bad func(string, ...any)) {
	if len(c.Budgets) == 0 {
		return
	}
	var unpriced []string // named models without a price, in order, once each
	seen := map[string]bool{}
	consider := func(m string) {
		if !seen[m] {
			seen[m] = true
			if _, ok := lookupPrice(prices, m); !ok {
				unpriced = append(unpriced, m)
			}
		}
	}
	for _, u := range c.Upstreams {
		for _, m := range u.Models {
			consider(m)
		}
	}
	for _, n := range namedModels(c) {
		consider(n.model)
	}
	for i, b := range c.Budgets {
		if p := b.UnpricedPrice; p != nil {
			checkPrice(p, fmt.Sprintf("Budgets[%d] (%q).UnpricedPrice", i, b.Name), true, bad)
			continue
		}
		if len(prices) == 0 {
			bad("Budgets[%d] (%q) can count no spend: Prices is empty; give the models' prices, or set Budget.UnpricedPrice", i, b.Name)
			continue
		}
		for _, m := range unpriced {
			if budgetCovers(b, c.Upstreams, m) {
				bad("Budgets[%d] (%q) covers model %q, which has no price in Prices: add its price, or set Budget.UnpricedPrice (&Price{} lets it through uncounted)", i, b.Name, m)
			}
		}
	}
}

// budgetCovers reports whether b's Scope covers a request for model on an
// upstream that serves it, asked with a request that carries no header. A
// Scope that panics on such a request counts as covering it.
func budgetCovers(b Budget, ups []Upstream, model string) (covers bool) {
	if b.Scope == nil {
		return true
	}
	defer func() {
		if recover() != nil {
			covers = true
		}
	}()
	q := Request{Endpoint: EndpointChat, Model: model, Header: http.Header{}, Load: idleLoad{}, Budget: noBudgets{}}
	for _, u := range ups {
		if len(u.Models) > 0 && !slices.Contains(u.Models, model) {
			continue
		}
		if _, ok := b.Scope(q, model, u.Name); ok {
			return true
		}
	}
	return false
}

// idleLoad is the Load of the requests New asks a Scope about: nothing
// is busy.
type idleLoad struct{}

func (idleLoad) Busy(string) bool { return false }

// unsendable returns err, the Base's error for a request with header h, as
// ErrInvalidHeader when h holds a header HTTP cannot carry: the Base
// refused the request before sending it, and would refuse it again.
func unsendable(h http.Header, err error) error {
	for k, vs := range h {
		if e := headerProblem(k, vs); e != "" {
			return &invalidHeaderError{problem: e, err: err}
		}
	}
	return err
}

// invalidHeaderError is ErrInvalidHeader for one header, wrapping the
// Base's error; its text names the header, never its value.
type invalidHeaderError struct {
	problem string
	err     error
}

func (e *invalidHeaderError) Error() string   { return "relay: request " + e.problem }
func (e *invalidHeaderError) Unwrap() []error { return []error{ErrInvalidHeader, e.err} }
