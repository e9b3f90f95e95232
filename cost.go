package relay

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"

	"github.com/tokenrelay/relay/internal/jsonscan"
)

// Price is a model's list price in USD per 1M tokens.
//
// InputPerMTok prices prompt tokens that were neither read from nor written
// to the upstream's prompt cache, CachedInputPerMTok prices cache reads,
// CacheWriteInputPerMTok prices cache writes (Anthropic's
// cache_creation_input_tokens, billed above the input price), and
// OutputPerMTok prices completion tokens (reasoning tokens included: they
// are billed as output). A CachedInputPerMTok or CacheWriteInputPerMTok of
// 0 means "as the input price": a price table only needs to set them where
// the vendor bills cache reads or writes differently (see [Price.Cost]).
//
// Tiers are long-context rates, as several providers bill them (Gemini 2.5
// Pro above 200k prompt tokens, Claude Sonnet 4 and 4.5 with the 1M window
// above 200k, GPT-5.4 above 272k): when a request's prompt has more tokens
// than a tier's AbovePromptTokens, every token of the request, output
// included, is billed at that tier's rates (the highest such tier when
// several are passed). They ascend by AbovePromptTokens.
//
// ServiceTiers are the rates of a service tier, keyed by its lower-case
// name as the API spells it (OpenAI's "flex" and "priority"): a request the
// response says was served at that tier ("service_tier" in the response,
// else in the request) is billed at its rates. A service tier's Price holds
// rates and Tiers only; its own Tiers, when it has any, replace the base
// Tiers for its requests.
//
// A rate left at 0 in a service tier or a tier means the rate without it:
// a request's rates are the base rates, overlaid by its service tier's
// non-zero rates, then by the non-zero rates of the long-context tier its
// prompt falls in; a cached-input or cache-write rate still 0 then is the
// input rate. (LoadPrices reads LiteLLM's catalog into this shape, with
// its fallbacks.)
//
// MaxInputTokens and MaxOutputTokens are the model's context window, as
// LiteLLM's catalog gives it: the most prompt tokens it takes and the most
// output tokens a request may ask for; 0 is unknown (not checked). The
// router never sends a request to a model whose window it does not fit.
//
// New and LoadPrices refuse a price that is negative, NaN, infinite or
// above MaxPricePerMTok, a negative window, tiers that do not ascend and
// a service tier's name that is empty or not lower-case, naming the model,
// the field and the value: such a price would make costs negative, NaN or
// infinite, and a budget that is never charged.
//
// A Price holds a slice and a map: it is not comparable with ==, and
// copies share them (New keeps its own deep copy of Config.Prices).
type Price struct {
	InputPerMTok, CachedInputPerMTok, OutputPerMTok float64
	MaxInputTokens, MaxOutputTokens                 int

	CacheWriteInputPerMTok float64
	Tiers                  []PriceTier
	ServiceTiers           map[string]Price
}

// PriceTier is a long-context rate of a [Price]: the rates, in USD per 1M
// tokens, of every token of a request whose prompt has more than
// AbovePromptTokens tokens (200000 for "above 200k"). The prompt count is
// the one the upstream billed, cache reads and writes included. A rate of
// 0 is the rate without the tier.
type PriceTier struct {
	AbovePromptTokens                                                       int
	InputPerMTok, CachedInputPerMTok, CacheWriteInputPerMTok, OutputPerMTok float64
}

// Usage is what an upstream billed, normalised so that each token is counted
// once: CachedTokens and CacheWriteTokens are parts of PromptTokens and
// ReasoningTokens is a part of CompletionTokens, as in OpenAI's usage object.
//
// Usage parsed from a response is always normalised (see parseUsage for the
// rules applied to providers that report cached, cache-write or reasoning
// tokens outside the prompt or completion count); [Price.Cost] normalises a
// hand-built Usage the same way before pricing it.
type Usage struct {
	PromptTokens, CompletionTokens, ReasoningTokens, CachedTokens int

	// CacheWriteTokens are the prompt tokens written to the upstream's
	// prompt cache (Anthropic's cache_creation_input_tokens; OpenAI
	// reports none), priced at Price.CacheWriteInputPerMTok.
	CacheWriteTokens int
	// ServiceTier is the service tier the response says it was served at
	// ("default", "flex", "priority"), empty when it says none: the router
	// then charges the service tier the request asked for ([Price.Cost],
	// given none, the base rates).
	ServiceTier string

	Estimated bool // true when counted locally because the upstream sent no usage
}

// Cost returns what u costs at price p, in USD:
//
//	((prompt − cached − writes)·Input + cached·CachedInput + writes·CacheWriteInput
//	  + completion·Output) / 1e6
//
// at the rates of u.ServiceTier and of the long-context tier u.PromptTokens
// falls in (see [Price]). Reasoning tokens are not added: they are already
// part of the completion count. When CachedInputPerMTok or
// CacheWriteInputPerMTok is 0 those tokens are priced at the input rate (a
// price without a published cache discount charges cache reads as ordinary
// input), so a price table only needs to set them where the vendor bills
// them differently.
//
// u is normalised first, as parseUsage does: negative counts become 0,
// CachedTokens > PromptTokens means the cached tokens were reported outside the
// prompt count (PromptTokens += CachedTokens), CachedTokens + CacheWriteTokens
// > PromptTokens then means the cache writes were (PromptTokens +=
// CacheWriteTokens), and ReasoningTokens > CompletionTokens likewise
// (CompletionTokens += ReasoningTokens).
// The zero Price costs nothing.
func (p Price) Cost(u Usage) float64 {
	u = u.normalized()
	r := p.rates(u.PromptTokens, u.ServiceTier)
	uncached := u.PromptTokens - u.CachedTokens - u.CacheWriteTokens
	micro := float64(uncached)*r.input +
		float64(u.CachedTokens)*r.cached +
		float64(u.CacheWriteTokens)*r.write +
		float64(u.CompletionTokens)*r.output
	return micro / 1e6
}

// rates are the per-token rates a request is billed at, USD per 1M tokens.
type rates struct{ input, cached, write, output float64 }

// overlay replaces each rate by the one given, where that is not 0.
func (r *rates) overlay(input, cached, write, output float64) {
	for _, f := range [...]struct {
		dst *float64
		v   float64
	}{{&r.input, input}, {&r.cached, cached}, {&r.write, write}, {&r.output, output}} {
		if f.v != 0 {
			*f.dst = f.v
		}
	}
}

// rates returns the rates of a request of prompt tokens served at service
// tier tier: the base rates, overlaid by the service tier's, then by those
// of the long-context tier prompt falls in (the service tier's Tiers when
// it has any, else p's); cached and cache-write rates still 0 are the
// input rate.
func (p *Price) rates(prompt int, tier string) rates {
	r := rates{p.InputPerMTok, p.CachedInputPerMTok, p.CacheWriteInputPerMTok, p.OutputPerMTok}
	tiers := p.Tiers
	if s, ok := p.serviceTier(tier); ok {
		r.overlay(s.InputPerMTok, s.CachedInputPerMTok, s.CacheWriteInputPerMTok, s.OutputPerMTok)
		if len(s.Tiers) > 0 {
			tiers = s.Tiers
		}
	}
	for i := len(tiers) - 1; i >= 0; i-- {
		if t := &tiers[i]; prompt > t.AbovePromptTokens {
			r.overlay(t.InputPerMTok, t.CachedInputPerMTok, t.CacheWriteInputPerMTok, t.OutputPerMTok)
			break
		}
	}
	if r.cached == 0 {
		r.cached = r.input
	}
	if r.write == 0 {
		r.write = r.input
	}
	return r
}

// serviceTier returns the rates of the service tier named name, matched
// ignoring case; ok is false when p has none of that name.
func (p *Price) serviceTier(name string) (s Price, ok bool) {
	if name == "" || len(p.ServiceTiers) == 0 {
		return Price{}, false
	}
	if s, ok = p.ServiceTiers[name]; !ok && strings.ToLower(name) != name {
		s, ok = p.ServiceTiers[strings.ToLower(name)]
	}
	return s, ok
}

// reservation is the most a request of prompt tokens, asking for at most
// output tokens and for service tier tier, can cost at p, in USD: every
// prompt token at the dearest of the input, cached-input and cache-write
// rates, and every output token at the output rate, at the rates of the
// long-context tier the prompt falls in. Budgets reserve it before the
// request goes out.
func (p *Price) reservation(prompt, output int, tier string) float64 {
	r := p.rates(prompt, tier)
	return (float64(prompt)*max(r.input, r.cached, r.write) + float64(output)*r.output) / 1e6
}

// clonePrices returns a deep copy of prices (nil for nil): its Tiers and
// ServiceTiers are the copy's own.
func clonePrices(prices map[string]Price) map[string]Price {
	if prices == nil {
		return nil
	}
	m := make(map[string]Price, len(prices))
	for k, p := range prices {
		m[k] = p.clone()
	}
	return m
}

// clone returns p with Tiers and ServiceTiers of its own.
func (p Price) clone() Price {
	p.Tiers = slices.Clone(p.Tiers)
	if p.ServiceTiers != nil {
		st := make(map[string]Price, len(p.ServiceTiers))
		for k, s := range p.ServiceTiers {
			st[k] = s.clone()
		}
		p.ServiceTiers = st
	}
	return p
}

// MaxPricePerMTok is the highest price New and LoadPrices accept, in USD
// per 1M tokens (a million dollars a token): far above any model's, and
// low enough that no request's cost can overflow to infinity.
const MaxPricePerMTok = 1e12

// validPrice reports whether v is a price: a number from 0 to
// MaxPricePerMTok (NaN is not).
func validPrice(v float64) bool { return v >= 0 && v <= MaxPricePerMTok }

// checkPrices reports, for New, each problem of the table's prices (see
// checkPrice), in model order.
func checkPrices(prices map[string]Price, bad func(string, ...any)) {
	var models []string
	for m, p := range prices {
		if !checkPrice(&p, "", true, nil) {
			models = append(models, m)
		}
	}
	slices.Sort(models)
	for _, m := range models {
		p := prices[m]
		checkPrice(&p, fmt.Sprintf("Prices[%q]", m), true, bad)
	}
}

// checkPrice reports through bad each problem of p, named where (as
// `Prices["m"]`), with the field and the value: a rate that is not
// validPrice, a negative window, a tier whose threshold is not positive
// or not above the one before, a service tier without a lower-case name;
// in a service tier (top false), a window or service tiers of its own. It
// returns whether p has none; bad may be nil when only that is wanted.
func checkPrice(p *Price, where string, top bool, bad func(string, ...any)) bool {
	ok := true
	fail := func(format string, args ...any) {
		ok = false
		if bad != nil {
			bad(format, args...)
		}
	}
	rate := func(field string, v float64) {
		if !validPrice(v) {
			fail("%s.%s %g is not a price from 0 to %g USD per 1M tokens", where, field, v, float64(MaxPricePerMTok))
		}
	}
	rate("InputPerMTok", p.InputPerMTok)
	rate("CachedInputPerMTok", p.CachedInputPerMTok)
	rate("CacheWriteInputPerMTok", p.CacheWriteInputPerMTok)
	rate("OutputPerMTok", p.OutputPerMTok)
	switch {
	case top && (p.MaxInputTokens < 0 || p.MaxOutputTokens < 0):
		fail("%s: MaxInputTokens %d and MaxOutputTokens %d must not be negative", where, p.MaxInputTokens, p.MaxOutputTokens)
	case !top && (p.MaxInputTokens != 0 || p.MaxOutputTokens != 0):
		fail("%s: MaxInputTokens %d and MaxOutputTokens %d are the model's window, not a service tier's: leave them 0", where, p.MaxInputTokens, p.MaxOutputTokens)
	}
	for i, t := range p.Tiers {
		tw := fmt.Sprintf("%s.Tiers[%d]", where, i) // (cheap enough: tiers are few)
		switch {
		case t.AbovePromptTokens < 1:
			fail("%s.AbovePromptTokens %d must be positive", tw, t.AbovePromptTokens)
		case i > 0 && t.AbovePromptTokens <= p.Tiers[i-1].AbovePromptTokens:
			fail("%s.AbovePromptTokens %d must be above Tiers[%d]'s %d: tiers ascend", tw, t.AbovePromptTokens, i-1, p.Tiers[i-1].AbovePromptTokens)
		}
		for _, f := range [...]struct {
			name string
			v    float64
		}{{"InputPerMTok", t.InputPerMTok}, {"CachedInputPerMTok", t.CachedInputPerMTok},
			{"CacheWriteInputPerMTok", t.CacheWriteInputPerMTok}, {"OutputPerMTok", t.OutputPerMTok}} {
			if !validPrice(f.v) {
				fail("%s.%s %g is not a price from 0 to %g USD per 1M tokens", tw, f.name, f.v, float64(MaxPricePerMTok))
			}
		}
	}
	if !top && len(p.ServiceTiers) > 0 {
		fail("%s has ServiceTiers of its own: a service tier has rates and Tiers only", where)
		return ok
	}
	names := slices.Sorted(maps.Keys(p.ServiceTiers))
	for _, name := range names {
		sw := fmt.Sprintf("%s.ServiceTiers[%q]", where, name)
		if name == "" || strings.ToLower(name) != name {
			fail("%s: a service tier's name is the API's, lower-case (\"flex\", \"priority\")", sw)
		}
		s := p.ServiceTiers[name]
		checkPrice(&s, sw, false, fail)
	}
	return ok
}

// maxUsageTokens caps every parsed or priced token count. Counts beyond it are
// not plausible for one request (268,435,456 tokens); the cap keeps the
// normalising sums from overflowing int, even where int has 32 bits.
const maxUsageTokens = 1 << 28

// usageClamp limits n to [0, maxUsageTokens].
func usageClamp(n int) int {
	if n < 0 {
		return 0
	}
	if n > maxUsageTokens {
		return maxUsageTokens
	}
	return n
}

// normalized applies the rules that need nothing but the counts: clamp
// to [0, maxUsageTokens], then fold cached tokens reported outside the prompt
// count (Cached > Prompt), then cache writes (Cached + CacheWrite > Prompt),
// and reasoning tokens reported outside the completion count (Reasoning >
// Completion) into their totals.
func (u Usage) normalized() Usage {
	u.PromptTokens = usageClamp(u.PromptTokens)
	u.CompletionTokens = usageClamp(u.CompletionTokens)
	u.ReasoningTokens = usageClamp(u.ReasoningTokens)
	u.CachedTokens = usageClamp(u.CachedTokens)
	u.CacheWriteTokens = usageClamp(u.CacheWriteTokens)
	if u.CachedTokens > u.PromptTokens {
		u.PromptTokens += u.CachedTokens
	}
	if u.CachedTokens+u.CacheWriteTokens > u.PromptTokens {
		u.PromptTokens += u.CacheWriteTokens
	}
	if u.ReasoningTokens > u.CompletionTokens {
		u.CompletionTokens += u.ReasoningTokens
	}
	return u
}

// billable is the usage a request is charged for (its costs, its
// budgets): u, at the service tier the request asked for when the response
// named none, but when the request set max tokens and u has more
// completion tokens than it allowed (max tokens times its choices: "n", or
// a completions request's "best_of" when larger, as every one is billed),
// the completion tokens over that bound, reasoning included, are not
// charged: an upstream billing more than the request allowed is broken.
// capped reports it. Without max tokens, u is charged as it is, each count
// clamped to maxUsageTokens.
func (t *trip) billable(u Usage) (_ Usage, capped bool) {
	q := &t.c.req
	u = u.normalized()
	if u.ServiceTier == "" {
		u.ServiceTier = t.requestedServiceTier()
	}
	if q.MaxTokens <= 0 {
		return u, false
	}
	n := int64(max(t.c.choices, 1))
	if int64(u.CompletionTokens) <= int64(q.MaxTokens)*n {
		return u, false
	}
	if q.Endpoint == EndpointCompletions {
		// (read only for a usage over the bound: rare)
		n = max(n, min(gjson.GetBytes(t.body, "best_of").Int(), maxChoices))
	}
	bound := int(min(int64(q.MaxTokens)*n, maxUsageTokens))
	if u.CompletionTokens <= bound {
		return u, false
	}
	u.CompletionTokens = bound
	u.ReasoningTokens = min(u.ReasoningTokens, bound)
	return u, true
}

// requestedServiceTier is the request's "service_tier" ("flex",
// "priority", "auto", ...), "" when it has none. (The body is scanned only
// when it holds the name.)
func (t *trip) requestedServiceTier() string {
	if !bytes.Contains(t.body, []byte(`"service_tier"`)) {
		return ""
	}
	return serviceTierName(gjson.GetBytes(t.body, "service_tier").Raw)
}

// reservation is the most the request can cost at p, in USD, when it
// asks for at most output tokens (see Price.reservation): its prompt
// tokens decide the long-context tier, and the service tier is the one it
// asks for. Budgets reserve it.
func (t *trip) reservation(p Price, output int) float64 {
	return p.reservation(t.c.req.PromptTokens, output, t.requestedServiceTier())
}

// defaultPrices is the built-in price table, in USD per 1M tokens, with
// each model's context window (input and output tokens, as LiteLLM's
// catalog lists them; gpt-5.5-codex's as gpt-5's). Every row
// says where its numbers come from: "relay published output price" is the
// output price the relay publishes for a model; "vendor list price" is the
// model vendor's own published list price (standard tier, text, short
// context). Keys are the model names callers send; lookupPrice also resolves
// provider-prefixed and dated names to these keys.
var defaultPrices = map[string]Price{
	// Output: relay published output price. Input and cached input: no input
	// price is published for gpt-5.5-codex, so both are 0 here (prompt tokens
	// cost nothing in this table): set the real ones through Config.Prices.
	"gpt-5.5-codex": {InputPerMTok: 0, CachedInputPerMTok: 0, OutputPerMTok: 12.00, MaxInputTokens: 272000, MaxOutputTokens: 128000},
	// Output: relay published output price. Input / cached: vendor list price (OpenAI).
	// Priority processing: vendor list price (OpenAI).
	"gpt-4.1": {InputPerMTok: 2.00, CachedInputPerMTok: 0.50, OutputPerMTok: 8.00, MaxInputTokens: 1047576, MaxOutputTokens: 32768,
		ServiceTiers: map[string]Price{"priority": {InputPerMTok: 3.50, CachedInputPerMTok: 0.875, OutputPerMTok: 14.00}}},
	// Output: relay published output price. Input / cache read: vendor list price (Anthropic).
	// Cache writes (5-minute) and the long-context rates above 200k prompt
	// tokens: vendor list price (Anthropic); the long-context rates apply
	// only with the 1M window (raise MaxInputTokens to use it).
	"claude-sonnet-4.5": claudeSonnet45,
	// Same model and prices as "claude-sonnet-4.5", under the ID Anthropic's API uses
	// (dated IDs such as claude-sonnet-4-5-20250929 resolve to it).
	"claude-sonnet-4-5": claudeSonnet45,
	// Output: relay published output price. Input / cached: vendor list price
	// (Google, text). LiteLLM's catalog lists 0.03 for cache reads; 0.075 is the
	// figure this table was specified with.
	"gemini-2.5-flash": {InputPerMTok: 0.30, CachedInputPerMTok: 0.075, OutputPerMTok: 2.50, MaxInputTokens: 1048576, MaxOutputTokens: 65535},
	// Output: relay published output price. Input (cache miss) / cache hit: vendor list price (DeepSeek).
	"deepseek-v3.2": {InputPerMTok: 0.28, CachedInputPerMTok: 0.028, OutputPerMTok: 0.42, MaxInputTokens: 128000, MaxOutputTokens: 8192},

	"gpt-4o": {InputPerMTok: 2.50, CachedInputPerMTok: 1.25, OutputPerMTok: 10.00, MaxInputTokens: 128000, MaxOutputTokens: 16384}, // vendor list price (OpenAI)
	// vendor list price (OpenAI). The first gpt-4o snapshot costs more than
	// gpt-4o; without this row lookupPrice would strip its date and price it as gpt-4o.
	"gpt-4o-2024-05-13": {InputPerMTok: 5.00, CachedInputPerMTok: 5.00, OutputPerMTok: 15.00, MaxInputTokens: 128000, MaxOutputTokens: 4096},
	"gpt-4o-mini": {InputPerMTok: 0.15, CachedInputPerMTok: 0.075, OutputPerMTok: 0.60, MaxInputTokens: 128000, MaxOutputTokens: 16384, // vendor list price (OpenAI), priority processing included
		ServiceTiers: map[string]Price{"priority": {InputPerMTok: 0.25, CachedInputPerMTok: 0.125, OutputPerMTok: 1.00}}},
	"gpt-4.1-mini": {InputPerMTok: 0.40, CachedInputPerMTok: 0.10, OutputPerMTok: 1.60, MaxInputTokens: 1047576, MaxOutputTokens: 32768},  // vendor list price (OpenAI)
	"gpt-4.1-nano": {InputPerMTok: 0.10, CachedInputPerMTok: 0.025, OutputPerMTok: 0.40, MaxInputTokens: 1047576, MaxOutputTokens: 32768}, // vendor list price (OpenAI)
	"gpt-5": {InputPerMTok: 1.25, CachedInputPerMTok: 0.125, OutputPerMTok: 10.00, MaxInputTokens: 272000, MaxOutputTokens: 128000, // vendor list price (OpenAI), flex and priority processing included
		ServiceTiers: map[string]Price{
			"flex":     {InputPerMTok: 0.625, CachedInputPerMTok: 0.0625, OutputPerMTok: 5.00},
			"priority": {InputPerMTok: 2.50, CachedInputPerMTok: 0.25, OutputPerMTok: 20.00},
		}},
	"gpt-5-mini":             {InputPerMTok: 0.25, CachedInputPerMTok: 0.025, OutputPerMTok: 2.00, MaxInputTokens: 272000, MaxOutputTokens: 128000}, // vendor list price (OpenAI)
	"text-embedding-3-small": {InputPerMTok: 0.02, CachedInputPerMTok: 0, OutputPerMTok: 0, MaxInputTokens: 8191, MaxOutputTokens: 0},               // vendor list price (OpenAI); embeddings have no output
	"text-embedding-3-large": {InputPerMTok: 0.13, CachedInputPerMTok: 0, OutputPerMTok: 0, MaxInputTokens: 8191, MaxOutputTokens: 0},               // vendor list price (OpenAI); embeddings have no output
}

// claudeSonnet45 is Claude Sonnet 4.5's row of defaultPrices.
var claudeSonnet45 = Price{InputPerMTok: 3.00, CachedInputPerMTok: 0.30, CacheWriteInputPerMTok: 3.75, OutputPerMTok: 15.00,
	MaxInputTokens: 200000, MaxOutputTokens: 64000,
	Tiers: []PriceTier{{AbovePromptTokens: 200000, InputPerMTok: 6.00, CachedInputPerMTok: 0.60, CacheWriteInputPerMTok: 7.50, OutputPerMTok: 22.50}}}

// DefaultPrices returns the built-in price table, keyed by model name, in USD
// per 1M tokens. It returns a fresh copy on each call, tiers and service
// tiers included: the caller may modify it.
//
// The output prices of gpt-5.5-codex, gpt-4.1, claude-sonnet-4.5,
// gemini-2.5-flash and deepseek-v3.2 are the relay's published output prices;
// all other numbers are vendor list prices. No input price is published for
// gpt-5.5-codex: its input and cached-input prices are 0 here, so its prompt
// tokens cost nothing until the caller sets them through Config.Prices.
// Models missing from the table are unpriced (Report.Priced is false), never
// guessed; load a full catalog with [LoadPrices] to price more of them.
func DefaultPrices() map[string]Price {
	return clonePrices(defaultPrices)
}

// LoadPrices reads a price catalog in the format of LiteLLM's
// model_prices_and_context_window.json: a JSON object mapping a model name
// (often provider-prefixed, e.g. "deepseek/deepseek-chat") to an object with
// per-token prices in USD.
//
// Of each entry it reads, converted to USD per 1M tokens and rounded to
// 1e-9 (so 2e-06 becomes exactly 2):
//
//   - input_cost_per_token, cache_read_input_token_cost,
//     cache_creation_input_token_cost and output_cost_per_token: the
//     Price's rates. A missing cache_read_input_token_cost defaults to the
//     input price; a missing cache_creation_input_token_cost is 0 (cache
//     writes at the input price); a missing input or output price is 0.
//   - for each input_cost_per_token_above_<N>_tokens (N as in "200k", or
//     a plain number), a PriceTier above N prompt tokens (N − 1 for
//     litellm_provider "xai", which bills from N itself) with that input
//     rate and output_cost_per_token_above_<N>_tokens,
//     cache_read_input_token_cost_above_<N>_tokens and
//     cache_creation_input_token_cost_above_<N>_tokens (each missing one
//     0: the rate below the tier).
//   - for the service tiers "flex" and "priority", the same fields with
//     the suffix _flex or _priority (input_cost_per_token_priority,
//     input_cost_per_token_above_272k_tokens_priority, ...), when the entry
//     has any: ServiceTiers["flex"], ServiceTiers["priority"]. A service
//     tier's long-context rate that the entry lacks is the standard
//     long-context rate, as LiteLLM reckons it.
//
// A field that is not a number (the catalog's "sample_spec" entry documents
// fields with strings) is treated as missing; a number that is negative,
// too large to be finite, or above MaxPricePerMTok once scaled is an error
// naming the model, the field and the value. Entries that are not objects,
// have neither an input nor an output price, or are named "sample_spec" are
// skipped.
//
// The context window comes from max_input_tokens and max_output_tokens,
// each defaulting to the legacy max_tokens as the catalog documents; a
// window that is not a positive whole number is unknown (0). Everything
// else in an entry is ignored: litellm_provider, mode, batch prices
// (_batches: the Batch API is not called through the router), one-hour
// cache writes (cache_creation_input_token_cost_above_1hr: such writes are
// charged at the 5-minute rate), audio, image and per-character prices.
//
// Malformed JSON, a top-level value that is not an object, a read error, a
// price that is not one, or a catalog without a single priced entry is an
// error.
func LoadPrices(r io.Reader) (map[string]Price, error) {
	if r == nil {
		return nil, errors.New("relay: LoadPrices: nil reader")
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("relay: reading price catalog: %w", err)
	}
	if !jsonscan.Valid(data) {
		return nil, errors.New("relay: price catalog is not valid JSON")
	}
	root := gjson.ParseBytes(data)
	if !root.IsObject() {
		return nil, errors.New("relay: price catalog must be a JSON object of model name to prices")
	}
	prices := make(map[string]Price)
	var errs []error
	root.ForEach(func(key, entry gjson.Result) bool {
		name := key.String()
		if name == "" || name == "sample_spec" || !entry.IsObject() {
			return true
		}
		c := catalogEntry{entry: entry, bad: func(err error) {
			errs = append(errs, fmt.Errorf("relay: price catalog: model %q: %w", name, err))
		}}
		in, okIn := c.price("input_cost_per_token")
		out, okOut := c.price("output_cost_per_token")
		cached, okCached := c.price("cache_read_input_token_cost")
		if !okIn && !okOut {
			return true
		}
		if !okCached {
			cached = in
		}
		write, _ := c.price("cache_creation_input_token_cost")
		legacy := catalogTokens(entry, "max_tokens")
		p := Price{InputPerMTok: in, CachedInputPerMTok: cached, CacheWriteInputPerMTok: write, OutputPerMTok: out,
			MaxInputTokens:  cmp.Or(catalogTokens(entry, "max_input_tokens"), legacy),
			MaxOutputTokens: cmp.Or(catalogTokens(entry, "max_output_tokens"), legacy)}
		thresholds := c.thresholds()
		p.Tiers, _ = c.tiers(thresholds, "", nil)
		for _, tier := range [...]string{"flex", "priority"} {
			if s, ok := c.serviceTier(thresholds, tier, p.Tiers); ok {
				if p.ServiceTiers == nil {
					p.ServiceTiers = make(map[string]Price, 2)
				}
				p.ServiceTiers[tier] = s
			}
		}
		prices[name] = p
		return true
	})
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if len(prices) == 0 {
		return nil, errors.New("relay: price catalog has no entry with per-token prices")
	}
	return prices, nil
}

// catalogEntry is one entry of a price catalog, being read.
type catalogEntry struct {
	entry gjson.Result
	bad   func(error) // reports a field that is a number but not a price
}

// price reads a price field (see catalogPrice); ok is false when it is
// absent, not a number, or not a price (reported).
func (c *catalogEntry) price(field string) (float64, bool) {
	v, ok, err := catalogPrice(c.entry, field)
	if err != nil {
		c.bad(err)
	}
	return v, ok
}

// catalogThreshold is a long-context threshold of a catalog entry: as its
// field names spell it ("200k") and in tokens.
type catalogThreshold struct {
	label  string
	tokens int
}

// thresholds returns the entry's long-context thresholds, ascending: one
// for each input_cost_per_token_above_<label>_tokens field that is a
// number, <label> being digits with an optional "k" (thousands); for xAI,
// whose tier starts at the threshold itself, one token lower.
func (c *catalogEntry) thresholds() []catalogThreshold {
	var ts []catalogThreshold
	c.entry.ForEach(func(k, v gjson.Result) bool {
		label, ok := strings.CutPrefix(k.Str, "input_cost_per_token_above_")
		if label, ok = strings.CutSuffix(label, "_tokens"); !ok || v.Type != gjson.Number {
			return true
		}
		digits, thousands := strings.CutSuffix(label, "k")
		n, err := strconv.Atoi(digits)
		if err != nil || n < 1 || n > maxUsageTokens || digits[0] == '+' {
			return true
		}
		if thousands {
			n *= 1000
		}
		if c.entry.Get("litellm_provider").Str == "xai" {
			n-- // xAI bills the tier from the threshold itself (LiteLLM's rule)
		}
		if !slices.ContainsFunc(ts, func(t catalogThreshold) bool { return t.tokens == n }) {
			ts = append(ts, catalogThreshold{label, n})
		}
		return true
	})
	slices.SortFunc(ts, func(a, b catalogThreshold) int { return cmp.Compare(a.tokens, b.tokens) })
	return ts
}

// tiers reads the long-context tiers at thresholds from the fields ending
// in suffix ("" for the standard rates, "_priority" for a service tier's),
// each missing rate taken from under (the standard tiers, for a service
// tier; nil: 0). found reports whether one field with the suffix was there.
func (c *catalogEntry) tiers(thresholds []catalogThreshold, suffix string, under []PriceTier) (tiers []PriceTier, found bool) {
	for i, th := range thresholds {
		t := PriceTier{AbovePromptTokens: th.tokens}
		if under != nil {
			t = under[i]
		}
		if c.rates(func(base string) string { return base + "_above_" + th.label + "_tokens" + suffix },
			&t.InputPerMTok, &t.CachedInputPerMTok, &t.CacheWriteInputPerMTok, &t.OutputPerMTok) {
			found = true
		}
		tiers = append(tiers, t)
	}
	return tiers, found
}

// serviceTier reads the rates of service tier tier ("flex"): the fields
// with its suffix; ok is false when the entry has none. Its long-context
// tiers are standard's with the rates it has of its own (nil when it has
// none: the standard tiers then apply as they are).
func (c *catalogEntry) serviceTier(thresholds []catalogThreshold, tier string, standard []PriceTier) (s Price, ok bool) {
	suffix := "_" + tier
	ok = c.rates(func(base string) string { return base + suffix },
		&s.InputPerMTok, &s.CachedInputPerMTok, &s.CacheWriteInputPerMTok, &s.OutputPerMTok)
	if tiers, found := c.tiers(thresholds, suffix, standard); found {
		s.Tiers, ok = tiers, true
	}
	return s, ok
}

// rates reads the four rates from the fields field names after the base
// ones (input_cost_per_token, ...) into input, cached, write and output,
// leaving those whose field is missing; it reports whether one was there.
func (c *catalogEntry) rates(field func(base string) string, input, cached, write, output *float64) (found bool) {
	for _, f := range [...]struct {
		base string
		dst  *float64
	}{{"input_cost_per_token", input}, {"cache_read_input_token_cost", cached},
		{"cache_creation_input_token_cost", write}, {"output_cost_per_token", output}} {
		if v, ok := c.price(field(f.base)); ok {
			*f.dst, found = v, true
		}
	}
	return found
}

// catalogTokens reads a token-count field of a catalog entry: a positive
// whole number, else 0.
func catalogTokens(entry gjson.Result, field string) int {
	v := entry.Get(field)
	if v.Type != gjson.Number || v.Num < 1 || v.Num > 1<<31-1 || v.Num != math.Trunc(v.Num) {
		return 0
	}
	return int(v.Num)
}

// catalogPrice reads a per-token price field of a catalog entry and returns
// it per 1M tokens, rounded to 1e-9 to drop the float noise of the scaling.
// ok is false when the field is absent or not a number; err is set when it
// is a number but not a price (negative, infinite, above MaxPricePerMTok).
func catalogPrice(entry gjson.Result, field string) (perMTok float64, ok bool, err error) {
	v := entry.Get(field)
	if v.Type != gjson.Number {
		return 0, false, nil
	}
	scaled := math.Round(v.Num*1e15) / 1e9 // per token → per 1M, rounded to 1e-9
	if !(v.Num >= 0) || !validPrice(scaled) {
		return 0, false, fmt.Errorf("%s %s is not a price from 0 to %g USD per token", field, v.Raw, MaxPricePerMTok/1e6)
	}
	return scaled, true, nil
}

// lookupPrice finds the price of model in prices. Resolution order, first
// tier that matches wins:
//
//  1. the exact key (the common case: one map access, no allocation);
//  2. a key equal to model ignoring case ("GPT-4.1" → "gpt-4.1");
//  3. the same name after stripping any provider prefix (everything up to the
//     last '/') on either side, ignoring case: a request for "deepseek-chat"
//     matches the key "deepseek/deepseek-chat", and a request for
//     "openai/gpt-4.1" matches the key "gpt-4.1";
//  4. the request's name (prefix stripped) without a date or "-latest" suffix,
//     matched against keys with their prefix stripped, ignoring case:
//     "gpt-4.1-2025-04-14" → "gpt-4.1", "claude-3-5-sonnet-20241022" and
//     "claude-3-5-sonnet@20241022" → "claude-3-5-sonnet",
//     "claude-3-5-sonnet-latest" → "claude-3-5-sonnet". Recognised suffixes are
//     -YYYY-MM-DD, -YYYYMMDD, @YYYYMMDD (year 20xx, valid month and day) and
//     -latest. Only the request side is undated: an undated request is never
//     priced from a dated key, because snapshots can be priced differently.
//
// When several keys match in the best tier, an unprefixed key (no '/') wins
// over a prefixed one, then the lexicographically smallest key: the result
// does not depend on map iteration order. Tiers 2-4 scan the table once
// without allocating; callers with large catalogs on a hot path may memoise
// results per model.
func lookupPrice(prices map[string]Price, model string) (Price, bool) {
	if p, ok := prices[model]; ok {
		return p, true
	}
	if model == "" || len(prices) == 0 {
		return Price{}, false
	}
	base := priceBaseName(model)
	undated := priceUndated(base)
	bestTier, bestKey := 0, ""
	for key := range prices {
		var tier int
		keyBase := priceBaseName(key)
		switch {
		case strings.EqualFold(key, model):
			tier = 2
		case base != "" && strings.EqualFold(keyBase, base):
			tier = 3
		case undated != base && undated != "" && strings.EqualFold(keyBase, undated):
			tier = 4
		default:
			continue
		}
		if bestTier == 0 || tier < bestTier || (tier == bestTier && priceKeyBefore(key, bestKey)) {
			bestTier, bestKey = tier, key
		}
	}
	if bestTier == 0 {
		return Price{}, false
	}
	return prices[bestKey], true
}

// priceKeyBefore reports whether key a is preferred to key b among keys that
// match equally well: unprefixed first, then lexicographically smaller.
func priceKeyBefore(a, b string) bool {
	ap, bp := strings.Contains(a, "/"), strings.Contains(b, "/")
	if ap != bp {
		return !ap
	}
	return a < b
}

// priceBaseName strips a provider prefix: the part after the last '/'.
func priceBaseName(model string) string {
	if i := strings.LastIndexByte(model, '/'); i >= 0 {
		return model[i+1:]
	}
	return model
}

// priceUndated strips one trailing "-latest", "-YYYY-MM-DD", "-YYYYMMDD" or
// "@YYYYMMDD" from name; it returns name unchanged when there is none, or when
// nothing would be left.
func priceUndated(name string) string {
	const latest = "-latest"
	if n := len(name) - len(latest); n > 0 && strings.EqualFold(name[n:], latest) {
		return name[:n]
	}
	// -YYYY-MM-DD
	if n := len(name) - 11; n > 0 && name[n] == '-' && name[n+5] == '-' && name[n+8] == '-' &&
		priceIsDate(name[n+1:n+5], name[n+6:n+8], name[n+9:]) {
		return name[:n]
	}
	// -YYYYMMDD or @YYYYMMDD
	if n := len(name) - 9; n > 0 && (name[n] == '-' || name[n] == '@') &&
		priceIsDate(name[n+1:n+5], name[n+5:n+7], name[n+7:]) {
		return name[:n]
	}
	return name
}

// priceIsDate reports whether year, month and day are digits forming 20YY,
// 01-12 and 01-31.
func priceIsDate(year, month, day string) bool {
	for _, s := range [...]string{year, month, day} {
		for i := 0; i < len(s); i++ {
			if s[i] < '0' || s[i] > '9' {
				return false
			}
		}
	}
	m := int(month[0]-'0')*10 + int(month[1]-'0')
	d := int(day[0]-'0')*10 + int(day[1]-'0')
	return year[:2] == "20" && m >= 1 && m <= 12 && d >= 1 && d <= 31
}

// parseUsage extracts the usage an upstream reported from a JSON response body
// or from the payload of one SSE event (the text after "data:"; a leading
// "data:" is tolerated). It reads only the fields it needs, in one pass over
// the usage object, and does not allocate for a well-formed body.
//
// The usage object is "usage" at the top level (chat/completions, completions,
// embeddings, Responses API bodies, chat stream chunks) or "response.usage"
// (Responses stream events such as response.completed). Fields read, first
// present wins:
//
//	prompt:      prompt_tokens, input_tokens
//	completion:  completion_tokens, output_tokens (absent, as in embeddings: 0)
//	cached:      prompt_tokens_details.cached_tokens, input_tokens_details.cached_tokens,
//	             cache_read_input_tokens (Anthropic)
//	cache write: prompt_tokens_details.cache_write_tokens (OpenRouter),
//	             prompt_tokens_details.cache_creation_tokens (LiteLLM),
//	             cache_creation_input_tokens (Anthropic, LiteLLM)
//	reasoning:   completion_tokens_details.reasoning_tokens, output_tokens_details.reasoning_tokens
//	total:       total_tokens (only used to detect the shapes below)
//
// and, beside the usage object, the "service_tier" string of the object
// that holds it (Usage.ServiceTier; empty when absent or not a string).
//
// ok is false, and Usage zero, when the body is not valid JSON, has no usage
// object or a null one, the usage object has neither a prompt nor a completion
// count, or one of the fields above holds a value that is neither a number nor
// null. Numbers are truncated to integers and clamped to [0, 1<<28].
//
// The result is normalised so that Cached and CacheWrite are parts of
// Prompt and Reasoning of Completion, as OpenAI reports them. Some
// providers count those tokens outside; the rules, in order:
//
//   - Anthropic's own shape (input_tokens with cache_read_input_tokens or
//     cache_creation_input_tokens, no input_tokens_details.cached_tokens):
//     input_tokens excludes cache reads and cache writes, so PromptTokens =
//     input_tokens + cache_read_input_tokens + cache_creation_input_tokens.
//     Everywhere else, cache writes are part of the prompt count (LiteLLM
//     and OpenRouter count them in prompt_tokens).
//   - Cached > Prompt: cached was outside, PromptTokens += CachedTokens.
//   - Reasoning > Completion: reasoning was outside (CompletionTokens +=
//     ReasoningTokens).
//   - total_tokens present and different from prompt + completion: if it
//     equals prompt + completion + reasoning (reasoning > 0; xAI and Gemini's
//     OpenAI-compatible API report reasoning like this), reasoning was
//     outside; else if it equals prompt + completion + cached (cached > 0),
//     cached was outside; else if it equals the sum of all four, both were.
//     When reasoning equals cached the first reading wins.
//   - Cached + CacheWrite > Prompt: the cache writes were outside,
//     PromptTokens += CacheWriteTokens.
//
// A total_tokens that matches none of these readings is ignored.
func parseUsage(body []byte) (Usage, bool) {
	s := usageTrimEvent(unsafe.String(unsafe.SliceData(body), len(body)))
	var u usageRead
	if !u.read(s) {
		return Usage{}, false
	}
	h := &u.top
	switch {
	case h.at == '{':
	case (h.at == 0 || h.at == 'n') && u.resp.at == '{': // absent or null: the response's
		h = &u.resp
	default:
		return Usage{}, false
	}
	us, ok := usageFrom(&h.f)
	if ok {
		us.ServiceTier = serviceTierName(h.tier)
	}
	return us, ok
}

// serviceTierName reads a service tier from its raw JSON value: the
// string, "" when it is not one. The API's names are returned without
// allocating.
func serviceTierName(raw string) string {
	if !jsonscan.IsString(raw) {
		return ""
	}
	for _, name := range [...]string{"default", "flex", "priority", "auto", "scale"} {
		if len(raw) == len(name)+2 && raw[1:len(raw)-1] == name {
			return name
		}
	}
	return string(jsonscan.AppendString(nil, raw, len(raw)))
}

// usageFrom reads the counts of a usage object's fields (see parseUsage).
func usageFrom(f *usageFields) (Usage, bool) {
	prompt, hasPrompt, ok1 := usageNum(f[uPrompt])
	fromInputTokens := false
	if ok1 && !hasPrompt {
		prompt, hasPrompt, ok1 = usageNum(f[uInput])
		fromInputTokens = hasPrompt
	}
	completion, hasCompletion, ok2 := usageNum(f[uCompletion])
	if ok2 && !hasCompletion {
		completion, hasCompletion, ok2 = usageNum(f[uOutput])
	}
	cached, hasCached, ok3 := usageNum(f[uCachedPrompt])
	detailsCached := hasCached
	if ok3 && !hasCached {
		cached, hasCached, ok3 = usageNum(f[uCachedInput])
		detailsCached = hasCached
	}
	if ok3 && !hasCached {
		cached, _, ok3 = usageNum(f[uCacheRead])
	}
	reasoning, hasReasoning, ok4 := usageNum(f[uReasoningCompletion])
	if ok4 && !hasReasoning {
		reasoning, _, ok4 = usageNum(f[uReasoningOutput])
	}
	total, hasTotal, ok5 := usageNum(f[uTotal])
	write, hasWrite, ok6 := usageNum(f[uCacheWriteDetails])
	if ok6 && !hasWrite {
		write, hasWrite, ok6 = usageNum(f[uCacheCreationDetails])
	}
	// Anthropic's shape: input_tokens beside its own cache fields.
	_, hasRead, _ := usageNum(f[uCacheRead])
	_, hasCreation, _ := usageNum(f[uCacheWrite])
	anthropic := fromInputTokens && !detailsCached && !hasWrite && (hasRead || hasCreation)
	if ok6 && !hasWrite {
		write, _, ok6 = usageNum(f[uCacheWrite])
	}
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) || !(hasPrompt || hasCompletion) {
		return Usage{}, false
	}

	u := Usage{PromptTokens: prompt, CompletionTokens: completion, ReasoningTokens: reasoning, CachedTokens: cached, CacheWriteTokens: write}
	if anthropic {
		u.PromptTokens += cached + write
	}
	cachedOut := u.CachedTokens > u.PromptTokens
	reasoningOut := u.ReasoningTokens > u.CompletionTokens
	if hasTotal {
		p, c := u.PromptTokens, u.CompletionTokens
		if cachedOut {
			p += u.CachedTokens
		}
		if reasoningOut {
			c += u.ReasoningTokens
		}
		r, ca := u.ReasoningTokens, u.CachedTokens
		switch {
		case total == p+c:
		case !reasoningOut && r > 0 && total == p+c+r:
			reasoningOut = true
		case !cachedOut && ca > 0 && total == p+c+ca:
			cachedOut = true
		case !reasoningOut && !cachedOut && r > 0 && ca > 0 && total == p+c+r+ca:
			reasoningOut, cachedOut = true, true
		}
	}
	if cachedOut {
		u.PromptTokens += u.CachedTokens
	}
	if u.CachedTokens+u.CacheWriteTokens > u.PromptTokens {
		u.PromptTokens += u.CacheWriteTokens
	}
	if reasoningOut {
		u.CompletionTokens += u.ReasoningTokens
	}
	// Folding the parts in may pass the clamp: clamp again, keeping
	// Cached + CacheWrite ⊆ Prompt and Reasoning ⊆ Completion.
	u.PromptTokens = min(u.PromptTokens, maxUsageTokens)
	u.CompletionTokens = min(u.CompletionTokens, maxUsageTokens)
	u.CachedTokens = min(u.CachedTokens, u.PromptTokens)
	u.CacheWriteTokens = min(u.CacheWriteTokens, u.PromptTokens-u.CachedTokens)
	u.ReasoningTokens = min(u.ReasoningTokens, u.CompletionTokens)
	return u, true
}

// usageTrimEvent trims surrounding whitespace and one leading "data:" field
// name from an SSE event payload.
func usageTrimEvent(s string) string {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "data:") {
		s = strings.TrimSpace(s[len("data:"):])
	}
	return s
}

// The fields of a usage object parseUsage reads, by their paths in it.
const (
	uPrompt               = iota // prompt_tokens
	uInput                       // input_tokens
	uCompletion                  // completion_tokens
	uOutput                      // output_tokens
	uCachedPrompt                // prompt_tokens_details.cached_tokens
	uCachedInput                 // input_tokens_details.cached_tokens
	uCacheRead                   // cache_read_input_tokens
	uReasoningCompletion         // completion_tokens_details.reasoning_tokens
	uReasoningOutput             // output_tokens_details.reasoning_tokens
	uTotal                       // total_tokens
	uCacheWrite                  // cache_creation_input_tokens
	uCacheWriteDetails           // prompt_tokens_details.cache_write_tokens
	uCacheCreationDetails        // prompt_tokens_details.cache_creation_tokens
	numUsageFields
)

// usageFields holds the raw values of a usage object's fields, "" for an
// absent one.
type usageFields [numUsageFields]string

// readValid checks the usage object at s[j] (as jsonscan.Members does,
// inside depth) and fills f from it in the same pass, finding each field
// as gjson.Get finds a path: the first member of a name (a name written
// with escapes counts under its decoded name), and for a path through a
// details object, the first member of that name that is an object holding
// the inner one.
func (f *usageFields) readValid(s string, j, depth int) (int, bool) {
	var seen uint16 // the fields found, by index
	return jsonscan.Members(s, j, depth, func(k string, esc bool, j, depth int) (int, bool) {
		e, ok := jsonscan.ValidValue(s, j, depth)
		if !ok {
			return e, false
		}
		for _, fp := range usageField(usageKey(k, esc)) {
			if seen&(1<<fp.i) != 0 {
				continue
			}
			v := s[j:e]
			if fp.inner != "" {
				v = usageMember(v, fp.inner)
			}
			if v != "" {
				f[fp.i] = v
				seen |= 1 << fp.i
			}
		}
		return e, true
	})
}

// usagePath is a field of a usage object: its index, and for a field
// inside a details object, the name of its member there.
type usagePath struct {
	i     int
	inner string
}

// The fields each member name holds, by usageField.
var (
	usagePrompt         = []usagePath{{uPrompt, ""}}
	usageInput          = []usagePath{{uInput, ""}}
	usageCompletion     = []usagePath{{uCompletion, ""}}
	usageOutput         = []usagePath{{uOutput, ""}}
	usagePromptDetails  = []usagePath{{uCachedPrompt, "cached_tokens"}, {uCacheWriteDetails, "cache_write_tokens"}, {uCacheCreationDetails, "cache_creation_tokens"}}
	usageInputDetails   = []usagePath{{uCachedInput, "cached_tokens"}}
	usageCacheRead      = []usagePath{{uCacheRead, ""}}
	usageCompletionDtls = []usagePath{{uReasoningCompletion, "reasoning_tokens"}}
	usageOutputDetails  = []usagePath{{uReasoningOutput, "reasoning_tokens"}}
	usageTotal          = []usagePath{{uTotal, ""}}
	usageCacheCreation  = []usagePath{{uCacheWrite, ""}}
)

// usageField returns the fields a usage member holds (none for a member
// parseUsage does not read).
func usageField(k string) []usagePath {
	switch k {
	case "prompt_tokens":
		return usagePrompt
	case "input_tokens":
		return usageInput
	case "completion_tokens":
		return usageCompletion
	case "output_tokens":
		return usageOutput
	case "prompt_tokens_details":
		return usagePromptDetails
	case "input_tokens_details":
		return usageInputDetails
	case "cache_read_input_tokens":
		return usageCacheRead
	case "completion_tokens_details":
		return usageCompletionDtls
	case "output_tokens_details":
		return usageOutputDetails
	case "total_tokens":
		return usageTotal
	case "cache_creation_input_tokens":
		return usageCacheCreation
	}
	return nil
}

// usageKey is a member name as gjson matches it: decoded when it has
// escapes (rare: no provider writes them; that case allocates).
func usageKey(k string, esc bool) string {
	if !esc {
		return k
	}
	return string(jsonscan.AppendUnescaped(nil, k, len(k)))
}

// usageMember returns the raw value of the first member name of the
// object v, "" when v is not an object or has none.
func usageMember(v, name string) string {
	out := ""
	jsonscan.Each(v, 0, func(k, x string) bool {
		if usageKey(k, strings.IndexByte(k, '\\') >= 0) == name {
			out = x
			return false
		}
		return true
	})
	return out
}

// usageRead is what parseUsage finds in a response body or event, in the
// pass that checks that it is a JSON object: the usage at the top level
// and, from the first "response" object that has a "usage" member, the
// response's. Either one's fields are read when it is an object.
type usageRead struct {
	top, resp usageHolder
}

// usageHolder is what parseUsage finds in one object: its first "usage"
// member (at: the first byte of its value, 0 when there is none; f its
// fields) and its first "service_tier" member (tier, the raw value).
type usageHolder struct {
	at   byte
	tier string
	f    usageFields
}

// member reads the member k at s[j] of the holder's object when it is
// "usage" or "service_tier", and skips any other; it returns the member's
// end, as jsonscan.Members wants.
func (h *usageHolder) member(s, k string, j, depth int) (int, bool) {
	switch k {
	case "usage":
		if h.at == 0 {
			if h.at = s[j]; h.at == '{' {
				return h.f.readValid(s, j, depth)
			}
		}
	case "service_tier":
		e, ok := jsonscan.ValidValue(s, j, depth)
		if ok && h.tier == "" {
			h.tier = s[j:e]
		}
		return e, ok
	}
	return jsonscan.ValidValue(s, j, depth)
}

func (u *usageRead) read(s string) bool {
	return jsonscan.Object(s, func(k string, esc bool, j, depth int) (int, bool) {
		k = usageKey(k, esc)
		if k != "response" || u.resp.at != 0 || s[j] != '{' {
			return u.top.member(s, k, j, depth)
		}
		var h usageHolder
		e, ok := jsonscan.Members(s, j, depth, func(k string, esc bool, j, depth int) (int, bool) {
			return h.member(s, usageKey(k, esc), j, depth)
		})
		if h.at != 0 {
			u.resp = h
		}
		return e, ok
	})
}

// usageNum reads a token count from its raw value. present is false when
// the field is absent or null; ok is false when it holds anything but a
// number. The count is truncated and clamped to [0, maxUsageTokens].
func usageNum(raw string) (n int, present, ok bool) {
	switch {
	case raw == "" || raw == "null":
		return 0, false, true
	case raw[0] != '-' && (raw[0] < '0' || raw[0] > '9'):
		return 0, false, false
	}
	if len(raw) <= 9 { // digits only: no float needed
		n := 0
		for i := 0; i < len(raw); i++ {
			if raw[i] < '0' || raw[i] > '9' {
				n = -1
				break
			}
			n = n*10 + int(raw[i]-'0')
		}
		if n >= 0 {
			return min(n, maxUsageTokens), true, true
		}
	}
	f, _ := strconv.ParseFloat(raw, 64) // a valid JSON number; ±Inf when out of range
	switch {
	case !(f > 0): // negative, zero or NaN
		return 0, true, true
	case f >= maxUsageTokens:
		return maxUsageTokens, true, true
	}
	return int(f), true, true
}
