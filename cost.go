package relay

import (
	"cmp"
	"errors"
	"fmt"
	"io"
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
// InputPerMTok prices prompt tokens that were not served from the upstream's
// prompt cache, CachedInputPerMTok prices cache reads, and OutputPerMTok prices
// completion tokens (reasoning tokens included: they are billed as output).
// A CachedInputPerMTok of 0 means "no cache discount": cached tokens are then
// priced at InputPerMTok (see [Price.Cost]).
//
// MaxInputTokens and MaxOutputTokens are the model's context window, as
// LiteLLM's catalog gives it: the most prompt tokens it takes and the most
// output tokens a request may ask for; 0 is unknown (not checked). The
// router never sends a request to a model whose window it does not fit.
//
// New and LoadPrices refuse a price that is negative, NaN, infinite or
// above MaxPricePerMTok, and a negative window, naming the model, the
// field and the value: such a price would make costs negative, NaN or
// infinite, and a budget that is never charged.
type Price struct {
	InputPerMTok, CachedInputPerMTok, OutputPerMTok float64
	MaxInputTokens, MaxOutputTokens                 int
}

// Usage is what an upstream billed, normalised so that each token is counted
// once: CachedTokens is a part of PromptTokens and ReasoningTokens is a part of
// CompletionTokens, as in OpenAI's usage object.
//
// Usage parsed from a response is always normalised (see parseUsage for the
// rules applied to providers that report cached or reasoning tokens outside the
// prompt or completion count); [Price.Cost] normalises a hand-built Usage the
// same way before pricing it.
type Usage struct {
	PromptTokens, CompletionTokens, ReasoningTokens, CachedTokens int

	Estimated bool // true when counted locally because the upstream sent no usage
}

// Cost returns what u costs at price p, in USD:
//
//	((prompt − cached)·Input + cached·CachedInput + completion·Output) / 1e6
//
// Reasoning tokens are not added: they are already part of the completion
// count. When CachedInputPerMTok is 0 cached tokens are priced at InputPerMTok
// (a price without a published cache discount charges cache reads as ordinary
// input), so a price table only needs to set CachedInputPerMTok where the
// vendor offers a discount.
//
// u is normalised first, as parseUsage does: negative counts become 0,
// CachedTokens > PromptTokens means the cached tokens were reported outside the
// prompt count (PromptTokens += CachedTokens), and ReasoningTokens >
// CompletionTokens likewise (CompletionTokens += ReasoningTokens).
// The zero Price costs nothing.
func (p Price) Cost(u Usage) float64 {
	u = u.normalized()
	cachedRate := p.CachedInputPerMTok
	if cachedRate == 0 {
		cachedRate = p.InputPerMTok
	}
	uncached := u.PromptTokens - u.CachedTokens
	micro := float64(uncached)*p.InputPerMTok +
		float64(u.CachedTokens)*cachedRate +
		float64(u.CompletionTokens)*p.OutputPerMTok
	return micro / 1e6
}

// MaxPricePerMTok is the highest price New and LoadPrices accept, in USD
// per 1M tokens (a million dollars a token): far above any model's, and
// low enough that no request's cost can overflow to infinity.
const MaxPricePerMTok = 1e12

// validPrice reports whether v is a price: a number from 0 to
// MaxPricePerMTok (NaN is not).
func validPrice(v float64) bool { return v >= 0 && v <= MaxPricePerMTok }

// checkPrices reports, for New, each price of the table that is not
// validPrice and each negative window, naming the model, the field and the
// value, in model order.
func checkPrices(prices map[string]Price, bad func(string, ...any)) {
	var models []string
	for m, p := range prices {
		if !validPrice(p.InputPerMTok) || !validPrice(p.CachedInputPerMTok) || !validPrice(p.OutputPerMTok) ||
			p.MaxInputTokens < 0 || p.MaxOutputTokens < 0 {
			models = append(models, m)
		}
	}
	slices.Sort(models)
	for _, m := range models {
		p := prices[m]
		for _, f := range [...]struct {
			name string
			v    float64
		}{{"InputPerMTok", p.InputPerMTok}, {"CachedInputPerMTok", p.CachedInputPerMTok}, {"OutputPerMTok", p.OutputPerMTok}} {
			if !validPrice(f.v) {
				bad("Prices[%q].%s %g is not a price from 0 to %g USD per 1M tokens", m, f.name, f.v, float64(MaxPricePerMTok))
			}
		}
		if p.MaxInputTokens < 0 || p.MaxOutputTokens < 0 {
			bad("Prices[%q]: MaxInputTokens %d and MaxOutputTokens %d must not be negative", m, p.MaxInputTokens, p.MaxOutputTokens)
		}
	}
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

// normalized applies the rules that need nothing but the four counts: clamp
// to [0, maxUsageTokens], then fold cached tokens reported outside the prompt
// count (Cached > Prompt) and reasoning tokens reported outside the completion
// count (Reasoning > Completion) into their totals.
func (u Usage) normalized() Usage {
	u.PromptTokens = usageClamp(u.PromptTokens)
	u.CompletionTokens = usageClamp(u.CompletionTokens)
	u.ReasoningTokens = usageClamp(u.ReasoningTokens)
	u.CachedTokens = usageClamp(u.CachedTokens)
	if u.CachedTokens > u.PromptTokens {
		u.PromptTokens += u.CachedTokens
	}
	if u.ReasoningTokens > u.CompletionTokens {
		u.CompletionTokens += u.ReasoningTokens
	}
	return u
}

// billable is the usage a request is charged for (its costs, its
// budgets): u, but when the request set max tokens and u has more
// completion tokens than it allowed (max tokens times its choices: "n", or
// a completions request's "best_of" when larger, as every one is billed),
// the completion tokens over that bound, reasoning included, are not
// charged: an upstream billing more than the request allowed is broken.
// capped reports it. Without max tokens, u is charged as it is, each count
// clamped to maxUsageTokens.
func (t *trip) billable(u Usage) (_ Usage, capped bool) {
	q := &t.c.req
	u = u.normalized()
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
	"gpt-4.1": {InputPerMTok: 2.00, CachedInputPerMTok: 0.50, OutputPerMTok: 8.00, MaxInputTokens: 1047576, MaxOutputTokens: 32768},
	// Output: relay published output price. Input / cache read: vendor list price (Anthropic).
	"claude-sonnet-4.5": {InputPerMTok: 3.00, CachedInputPerMTok: 0.30, OutputPerMTok: 15.00, MaxInputTokens: 200000, MaxOutputTokens: 64000},
	// Same model and prices as "claude-sonnet-4.5", under the ID Anthropic's API uses
	// (dated IDs such as claude-sonnet-4-5-20250929 resolve to it).
	"claude-sonnet-4-5": {InputPerMTok: 3.00, CachedInputPerMTok: 0.30, OutputPerMTok: 15.00, MaxInputTokens: 200000, MaxOutputTokens: 64000},
	// Output: relay published output price. Input / cached: vendor list price
	// (Google, text). LiteLLM's catalog lists 0.03 for cache reads; 0.075 is the
	// figure this table was specified with.
	"gemini-2.5-flash": {InputPerMTok: 0.30, CachedInputPerMTok: 0.075, OutputPerMTok: 2.50, MaxInputTokens: 1048576, MaxOutputTokens: 65535},
	// Output: relay published output price. Input (cache miss) / cache hit: vendor list price (DeepSeek).
	"deepseek-v3.2": {InputPerMTok: 0.28, CachedInputPerMTok: 0.028, OutputPerMTok: 0.42, MaxInputTokens: 128000, MaxOutputTokens: 8192},

	"gpt-4o": {InputPerMTok: 2.50, CachedInputPerMTok: 1.25, OutputPerMTok: 10.00, MaxInputTokens: 128000, MaxOutputTokens: 16384}, // vendor list price (OpenAI)
	// vendor list price (OpenAI). The first gpt-4o snapshot costs more than
	// gpt-4o; without this row lookupPrice would strip its date and price it as gpt-4o.
	"gpt-4o-2024-05-13":      {InputPerMTok: 5.00, CachedInputPerMTok: 5.00, OutputPerMTok: 15.00, MaxInputTokens: 128000, MaxOutputTokens: 4096},
	"gpt-4o-mini":            {InputPerMTok: 0.15, CachedInputPerMTok: 0.075, OutputPerMTok: 0.60, MaxInputTokens: 128000, MaxOutputTokens: 16384},   // vendor list price (OpenAI)
	"gpt-4.1-mini":           {InputPerMTok: 0.40, CachedInputPerMTok: 0.10, OutputPerMTok: 1.60, MaxInputTokens: 1047576, MaxOutputTokens: 32768},   // vendor list price (OpenAI)
	"gpt-4.1-nano":           {InputPerMTok: 0.10, CachedInputPerMTok: 0.025, OutputPerMTok: 0.40, MaxInputTokens: 1047576, MaxOutputTokens: 32768},  // vendor list price (OpenAI)
	"gpt-5":                  {InputPerMTok: 1.25, CachedInputPerMTok: 0.125, OutputPerMTok: 10.00, MaxInputTokens: 272000, MaxOutputTokens: 128000}, // vendor list price (OpenAI)
	"gpt-5-mini":             {InputPerMTok: 0.25, CachedInputPerMTok: 0.025, OutputPerMTok: 2.00, MaxInputTokens: 272000, MaxOutputTokens: 128000},  // vendor list price (OpenAI)
	"text-embedding-3-small": {InputPerMTok: 0.02, CachedInputPerMTok: 0, OutputPerMTok: 0, MaxInputTokens: 8191, MaxOutputTokens: 0},                // vendor list price (OpenAI); embeddings have no output
	"text-embedding-3-large": {InputPerMTok: 0.13, CachedInputPerMTok: 0, OutputPerMTok: 0, MaxInputTokens: 8191, MaxOutputTokens: 0},                // vendor list price (OpenAI); embeddings have no output
}

// DefaultPrices returns the built-in price table, keyed by model name, in USD
// per 1M tokens. It returns a fresh copy on each call: the caller may modify it.
//
// The output prices of gpt-5.5-codex, gpt-4.1, claude-sonnet-4.5,
// gemini-2.5-flash and deepseek-v3.2 are the relay's published output prices;
// all other numbers are vendor list prices. No input price is published for
// gpt-5.5-codex: its input and cached-input prices are 0 here, so its prompt
// tokens cost nothing until the caller sets them through Config.Prices.
// Models missing from the table are unpriced (Report.Priced is false), never
// guessed; load a full catalog with [LoadPrices] to price more of them.
func DefaultPrices() map[string]Price {
	m := make(map[string]Price, len(defaultPrices))
	for k, v := range defaultPrices {
		m[k] = v
	}
	return m
}

// LoadPrices reads a price catalog in the format of LiteLLM's
// model_prices_and_context_window.json: a JSON object mapping a model name
// (often provider-prefixed, e.g. "deepseek/deepseek-chat") to an object with
// per-token prices in USD.
//
// Of each entry it reads input_cost_per_token, output_cost_per_token and
// cache_read_input_token_cost, converted to USD per 1M tokens and rounded to
// 1e-9 (so 2e-06 becomes exactly 2). A missing cache_read_input_token_cost
// defaults to the input price; a missing input or output price is 0. A field
// that is not a number (the catalog's "sample_spec" entry documents fields
// with strings) is treated as missing; a number that is negative, too large
// to be finite, or above MaxPricePerMTok once scaled is an error naming the
// model, the field and the value. Entries that are not objects, have
// neither an input nor an output price, or are named "sample_spec" are
// skipped.
//
// The context window comes from max_input_tokens and max_output_tokens,
// each defaulting to the legacy max_tokens as the catalog documents; a
// window that is not a positive whole number is unknown (0). Everything
// else in an entry (litellm_provider, mode, batch and priority prices) is
// ignored.
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
		price := func(field string) (float64, bool) {
			v, ok, err := catalogPrice(entry, field)
			if err != nil {
				errs = append(errs, fmt.Errorf("relay: price catalog: model %q: %w", name, err))
			}
			return v, ok
		}
		in, okIn := price("input_cost_per_token")
		out, okOut := price("output_cost_per_token")
		cached, okCached := price("cache_read_input_token_cost")
		if !okIn && !okOut {
			return true
		}
		if !okCached {
			cached = in
		}
		legacy := catalogTokens(entry, "max_tokens")
		prices[name] = Price{InputPerMTok: in, CachedInputPerMTok: cached, OutputPerMTok: out,
			MaxInputTokens:  cmp.Or(catalogTokens(entry, "max_input_tokens"), legacy),
			MaxOutputTokens: cmp.Or(catalogTokens(entry, "max_output_tokens"), legacy)}
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
//	prompt:     prompt_tokens, input_tokens
//	completion: completion_tokens, output_tokens (absent, as in embeddings: 0)
//	cached:     prompt_tokens_details.cached_tokens, input_tokens_details.cached_tokens,
//	            cache_read_input_tokens (Anthropic)
//	reasoning:  completion_tokens_details.reasoning_tokens, output_tokens_details.reasoning_tokens
//	total:      total_tokens (only used to detect the shapes below)
//
// ok is false, and Usage zero, when the body is not valid JSON, has no usage
// object or a null one, the usage object has neither a prompt nor a completion
// count, or one of the fields above holds a value that is neither a number nor
// null. Numbers are truncated to integers and clamped to [0, 1<<28].
//
// The result is normalised so that Cached ⊆ Prompt and Reasoning ⊆
// Completion, as OpenAI reports them. Some providers count those tokens
// outside; the rules, in order:
//
//   - Anthropic's own shape (input_tokens with cache_read_input_tokens):
//     input_tokens excludes cache reads and cache writes, so PromptTokens =
//     input_tokens + cache_read_input_tokens + cache_creation_input_tokens.
//     Cache writes are then priced as ordinary input (Anthropic bills them at
//     a premium Usage cannot express, so the cost is a lower bound).
//   - Cached > Prompt: cached was outside, PromptTokens += CachedTokens.
//   - Reasoning > Completion: reasoning was outside (CompletionTokens +=
//     ReasoningTokens).
//   - total_tokens present and different from prompt + completion: if it
//     equals prompt + completion + reasoning (reasoning > 0; xAI and Gemini's
//     OpenAI-compatible API report reasoning like this), reasoning was
//     outside; else if it equals prompt + completion + cached (cached > 0),
//     cached was outside; else if it equals the sum of all four, both were.
//     When reasoning equals cached the first reading wins.
//
// A total_tokens that matches none of these readings is ignored.
func parseUsage(body []byte) (Usage, bool) {
	s := usageTrimEvent(unsafe.String(unsafe.SliceData(body), len(body)))
	var u usageRead
	if !u.read(s) {
		return Usage{}, false
	}
	switch {
	case u.top == '{':
		return usageFrom(&u.f)
	case u.top == 0 || u.top == 'n': // absent or null: the response's
		if u.inResp == '{' {
			return usageFrom(&u.fResp)
		}
	}
	return Usage{}, false
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
	if ok3 && !hasCached {
		cached, hasCached, ok3 = usageNum(f[uCachedInput])
	}
	anthropic := false
	if ok3 && !hasCached {
		cached, hasCached, ok3 = usageNum(f[uCacheRead])
		anthropic = hasCached && fromInputTokens
	}
	reasoning, hasReasoning, ok4 := usageNum(f[uReasoningCompletion])
	if ok4 && !hasReasoning {
		reasoning, _, ok4 = usageNum(f[uReasoningOutput])
	}
	total, hasTotal, ok5 := usageNum(f[uTotal])
	cacheWrite, ok6 := 0, true
	if anthropic {
		cacheWrite, _, ok6 = usageNum(f[uCacheWrite])
	}
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) || !(hasPrompt || hasCompletion) {
		return Usage{}, false
	}

	u := Usage{PromptTokens: prompt, CompletionTokens: completion, ReasoningTokens: reasoning, CachedTokens: cached}
	if anthropic {
		u.PromptTokens += cached + cacheWrite
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
	if reasoningOut {
		u.CompletionTokens += u.ReasoningTokens
	}
	// Folding the parts in may pass the clamp: clamp again, keeping
	// Cached ⊆ Prompt and Reasoning ⊆ Completion.
	u.PromptTokens = min(u.PromptTokens, maxUsageTokens)
	u.CompletionTokens = min(u.CompletionTokens, maxUsageTokens)
	u.CachedTokens = min(u.CachedTokens, u.PromptTokens)
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
	uPrompt              = iota // prompt_tokens
	uInput                      // input_tokens
	uCompletion                 // completion_tokens
	uOutput                     // output_tokens
	uCachedPrompt               // prompt_tokens_details.cached_tokens
	uCachedInput                // input_tokens_details.cached_tokens
	uCacheRead                  // cache_read_input_tokens
	uReasoningCompletion        // completion_tokens_details.reasoning_tokens
	uReasoningOutput            // output_tokens_details.reasoning_tokens
	uTotal                      // total_tokens
	uCacheWrite                 // cache_creation_input_tokens
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
		i, inner := usageField(usageKey(k, esc))
		if i < 0 || seen&(1<<i) != 0 {
			return e, true
		}
		v := s[j:e]
		if inner != "" {
			v = usageMember(v, inner)
		}
		if v != "" {
			f[i] = v
			seen |= 1 << i
		}
		return e, true
	})
}

// usageField returns the field a usage member holds (-1: none) and, for a
// details object, the name of the field's member in it.
func usageField(k string) (int, string) {
	switch k {
	case "prompt_tokens":
		return uPrompt, ""
	case "input_tokens":
		return uInput, ""
	case "completion_tokens":
		return uCompletion, ""
	case "output_tokens":
		return uOutput, ""
	case "prompt_tokens_details":
		return uCachedPrompt, "cached_tokens"
	case "input_tokens_details":
		return uCachedInput, "cached_tokens"
	case "cache_read_input_tokens":
		return uCacheRead, ""
	case "completion_tokens_details":
		return uReasoningCompletion, "reasoning_tokens"
	case "output_tokens_details":
		return uReasoningOutput, "reasoning_tokens"
	case "total_tokens":
		return uTotal, ""
	case "cache_creation_input_tokens":
		return uCacheWrite, ""
	}
	return -1, ""
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
// pass that checks that it is a JSON object: the first "usage" member (top:
// the first byte of its value, 0 when there is none) and, from the first
// "response" object that has a "usage" member, that member (inResp).
// Either one's fields are read when it is an object.
type usageRead struct {
	top, inResp byte
	f, fResp    usageFields
}

func (u *usageRead) read(s string) bool {
	return jsonscan.Object(s, func(k string, esc bool, j, depth int) (int, bool) {
		switch usageKey(k, esc) {
		case "usage":
			if u.top == 0 {
				if u.top = s[j]; u.top == '{' {
					return u.f.readValid(s, j, depth)
				}
			}
		case "response":
			if u.inResp == 0 && s[j] == '{' {
				return jsonscan.Members(s, j, depth, func(k string, esc bool, j, depth int) (int, bool) {
					if u.inResp == 0 && usageKey(k, esc) == "usage" {
						if u.inResp = s[j]; u.inResp == '{' {
							return u.fResp.readValid(s, j, depth)
						}
					}
					return jsonscan.ValidValue(s, j, depth)
				})
			}
		}
		return jsonscan.ValidValue(s, j, depth)
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
