package relay

import (
	"bytes"
	"context"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/tokenrelay/relay/internal/jsonscan"
	"github.com/tokenrelay/relay/store"
)

// A request whose output-token limit does not fit its model's window, or
// that its budgets cannot pay for, can be sent with a smaller limit
// instead of being moved or refused: the clamp (Config.Clamp). The limit
// is rewritten in the outgoing body, and the budgets reserve the clamped
// value.

// ClampConfig configures the clamp of a request's output-token limit
// (max_tokens, max_completion_tokens, max_output_tokens). Off by default.
//
// A request whose limit is larger than its routed model's output window
// (Price.MaxOutputTokens), while its prompt fits the model's input window,
// is sent to that model with the window as its limit, before any
// fallback model is considered; when the prompt does not fit the routed
// model, the fallbacks come first as without the clamp, and only when no
// model fits the whole request is the limit clamped on the first one whose
// input window fits the prompt. A request that sets no limit is never
// clamped for a window (nothing refuses it).
//
// A request that a budget refuses is sent with the limit its budgets can
// pay for: what is left of each budget covering it (after the prompt's
// input cost) at the model's output price, the smallest of them, on the
// candidate that allows the most; before the budget's Downgrade model is
// tried (the Downgrade itself clamped to its window when the limit is over
// it). A request that sets no limit is reserved at
// Limits.DefaultMaxTokens; clamped, it gets a limit written into its body
// (max_completion_tokens on chat, max_output_tokens on Responses,
// max_tokens on completions).
//
// A clamp never leaves less than MinTokens: a request that could only be
// clamped below it is refused, or moved, as without the clamp.
// Report.Clamp says what was clamped and why; Decision.Clamp shows a
// window's clamp (budgets are not consulted by Decide).
type ClampConfig struct {
	// MaxTokens turns the clamp on.
	MaxTokens bool
	// MinTokens is the smallest limit a clamp leaves. If 0, 16.
	MinTokens int
}

// Clamp is what the clamp did to a request's output-token limit
// (Report.Clamp, Decision.Clamp); the zero Clamp is none.
type Clamp struct {
	From   int    // the limit the request set; 0 when it set none
	To     int    // the limit sent
	Reason string // ConstraintContextWindow or ConstraintBudget
	Budget string // for ConstraintBudget, the budget whose remainder bounded it
}

// defaultClampMin is ClampConfig.MinTokens's default.
const defaultClampMin = 16

// clampSettings is a checked ClampConfig.
type clampSettings struct {
	on  bool
	min int
}

func resolveClamp(c ClampConfig, bad func(string, ...any)) clampSettings {
	notNegative(bad, "Clamp.MinTokens", c.MinTokens)
	return clampSettings{on: c.MaxTokens, min: orDefault(c.MinTokens, defaultClampMin)}
}

// clamping is a trip's clamp, and which limit fields its body has.
type clamping struct {
	Clamp
	fields uint8 // bit i: the body has limitFields[i] as a number
}

// limitFields are the body fields that hold a request's output-token limit.
var limitFields = [...]string{"max_tokens", "max_completion_tokens", "max_output_tokens"}

// clampable reports whether an endpoint's requests have an output limit
// to clamp.
func clampable(endpoint string) bool {
	return endpoint == EndpointChat || endpoint == EndpointResponses || endpoint == EndpointCompletions
}

// setClamp lowers the request's limit to to, for reason: the outgoing
// bodies carry it (bodyFor), and budgets reserve it.
func (t *trip) setClamp(to int, reason, budget string) {
	q := &t.c.req
	if t.clamp == nil {
		t.clamp = &clamping{Clamp: Clamp{From: q.MaxTokens}, fields: numberFields(t.body)}
	}
	t.clamp.To, t.clamp.Reason, t.clamp.Budget = to, reason, budget
	q.MaxTokens = to
}

// numberFields returns which of limitFields body has, as numbers, at its
// top level.
func numberFields(body []byte) (mask uint8) {
	var keyBuf [32]byte
	jsonscan.Each(body, 0, func(k, v []byte) bool {
		if bytes.IndexByte(k, '\\') >= 0 {
			k = jsonscan.AppendUnescaped(keyBuf[:0], k, len(k))
		}
		if len(v) == 0 || !(v[0] == '-' || '0' <= v[0] && v[0] <= '9') {
			return true
		}
		if i := slices.Index(limitFields[:], string(k)); i >= 0 {
			mask |= 1 << i
		}
		return true
	})
	return mask
}

// appendSets appends the body edits of the clamp: every limit field the
// body has set to the clamped value, or, when it has none, the endpoint's.
func (cl *clamping) appendSets(sets []topSet, endpoint string) []topSet {
	raw := strconv.AppendInt(nil, int64(cl.To), 10)
	if cl.fields == 0 {
		key := "max_completion_tokens"
		switch endpoint {
		case EndpointResponses:
			key = "max_output_tokens"
		case EndpointCompletions:
			key = "max_tokens"
		}
		return append(sets, topSet{key: key, raw: raw})
	}
	for i, f := range limitFields {
		if cl.fields&(1<<i) != 0 {
			sets = append(sets, topSet{key: f, raw: raw})
		}
	}
	return sets
}

// clampWindow clamps, when the clamp is on, the limit of a request that
// does not fit the window of its routed model: to that model's output
// window when its prompt fits the input window; else, when no model of
// the route nor of Config.ContextFallbacks fits the whole request, to the
// output window of the first one whose input window fits the prompt. A
// clamp below the minimum is not made (fitWindow then moves or refuses
// the request as without the clamp).
func (t *trip) clampWindow(rt Route) {
	s, q := &t.r.s, &t.c.req
	if !s.clamp.on || !clampable(q.Endpoint) || !t.c.json || q.PromptTokens == 0 || q.MaxTokens <= 0 || rt.Model == "" ||
		s.fits(rt.Model, q.PromptTokens, q.MaxTokens) {
		return
	}
	if to := t.windowClamp(rt.Model); to > 0 {
		t.setClamp(to, ConstraintContextWindow, "")
		return
	}
	models := slices.Concat(rt.Fallbacks, s.contextFallbacks)
	if slices.ContainsFunc(models, func(m string) bool { return m != "" && s.fits(m, q.PromptTokens, q.MaxTokens) }) {
		return // a model fits the whole request: fitWindow moves it there
	}
	for _, m := range models {
		if to := t.windowClamp(m); to > 0 {
			t.setClamp(to, ConstraintContextWindow, "")
			return
		}
	}
}

// windowClamp returns, when the clamp is on, the limit the request gets on
// model m: m's output window, when its prompt fits m's input window and
// the window is below the request's limit and at least the minimum; else 0.
func (t *trip) windowClamp(m string) int {
	s, q := &t.r.s, &t.c.req
	if !s.clamp.on || !clampable(q.Endpoint) || !t.c.json || m == "" || q.MaxTokens <= 0 {
		return 0
	}
	in, out := s.window(m)
	if (in > 0 && q.PromptTokens > in) || out <= 0 || out >= q.MaxTokens || out < s.clamp.min {
		return 0
	}
	return out
}

// clampBudget answers a budget's refusal of every candidate, when the
// clamp is on: the request's limit is lowered to what its budgets can pay
// for on the candidate that allows the most, once before the budget's
// Downgrade model is tried and once after. It reports whether it did: the
// admission then reserves and charges the clamped limit.
func (t *trip) clampBudget(ctx context.Context, cands []candidate) bool {
	s, q, res := &t.r.s, &t.c.req, &t.res
	if !s.clamp.on || res.refused == nil || res.unpriced != "" || !clampable(q.Endpoint) || !t.c.json {
		return false // (a body the router cannot edit cannot carry a clamp)
	}
	if res.clamps > 0 && (!res.downgrade || res.clamps > 1) {
		return false
	}
	res.clamps++
	n := max(int(t.c.choices), 1)
	cur := (t.tokens - q.PromptTokens) / n // the limit reserved: max tokens, or DefaultMaxTokens
	best, by := 0, ""
	now := s.clock.Now()
	for i := range cands {
		out, name := t.affordable(ctx, &cands[i], now)
		per := out / n
		if _, w := s.window(cands[i].model); w > 0 {
			per = min(per, w) // (a request that set no limit gets none over the window)
		}
		if per > best {
			best, by = per, name
		}
	}
	if best >= cur || best < s.clamp.min {
		return false
	}
	t.setClamp(best, ConstraintBudget, by)
	return true
}

// affordable returns the most output tokens (all choices together) the
// budgets covering c can pay for now, after the prompt's input cost, and
// the budget that bounds it; math.MaxInt32 when no budget bounds the
// output.
func (t *trip) affordable(ctx context.Context, c *candidate, now time.Time) (out int, by string) {
	s := &t.r.s
	out = math.MaxInt32
	for i := range s.budgets {
		b := &s.budgets[i]
		key, covers := t.scope(b, c.model, c.up.cfg.Name)
		if !covers {
			continue
		}
		p, ok := b.price(s.prices, c.model)
		if !ok {
			return 0, b.Name
		}
		k := store.BudgetKey{Budget: b.Name, Key: key, Window: b.windowEnd(now)}
		spent, reserved, err := t.r.usage(ctx, b, k)
		if err != nil {
			return 0, b.Name
		}
		room := b.limit - spent - reserved
		if h := t.res.find(k); h != nil && h.k.Window.Equal(k.Window) {
			room += h.amount() // what the request holds there already counts for it
		}
		if m := t.outputFor(p, c.up.factor*s.currency.PerUSD, room); m < out {
			out, by = m, b.Name
		}
	}
	return out, by
}

// outputFor returns the most output tokens whose reservation at p (scaled
// by scale, the upstream's factor in the billing currency) fits in room
// nano-units, up to math.MaxInt32; 0 when not even the prompt fits.
func (t *trip) outputFor(p Price, scale float64, room int64) int {
	cost := func(out int) int64 { return nanos(t.reservation(p, out) * scale) }
	if cost(0) > room {
		return 0
	}
	perTok := p.rates(t.c.req.PromptTokens, t.requestedServiceTier()).output * scale * 1e3 // nano-units per token
	if perTok <= 0 {
		return math.MaxInt32
	}
	out := int(min(math.Floor(float64(room-cost(0))/perTok), math.MaxInt32))
	for range 4 { // rounding: the reservation is what must fit
		if out <= 0 || cost(out) <= room {
			break
		}
		out--
	}
	return max(out, 0)
}
