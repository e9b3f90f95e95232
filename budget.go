package relay

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/tokenrelay/relay/store"
)

// ErrBudgetExceeded: the request's worst-case cost did not fit in what is
// left of a budget (Error.Budget names it); no upstream was called.
var ErrBudgetExceeded = errors.New("relay: budget exceeded")

// Budget caps the spend of the requests it covers, in the billing currency
// (Config.Currency), over a window.
//
// Reserve, then settle: before any upstream call, each covering budget
// reserves the request's worst-case cost (its prompt tokens at the input
// price plus its max_tokens, or Config.Limits.DefaultMaxTokens, at the
// output price, at the rates of the long-context tier its prompt falls in
// and of the service tier it asks for, a dearer cache-read or cache-write
// price taken for the input price, for the model and upstream chosen, after
// the upstream's price factor); a request whose reservation does not fit in what is left does not
// go out. When the request's report is made, the reservation is replaced by
// the actual cost (a refund, or a top-up when the upstream billed more than
// the worst case, as when it counted more prompt tokens than the router;
// completion tokens over the request's max tokens are not charged, see
// Report.UsageCapped); a request that got no usage costs nothing. A retried or
// hedged request reserves once (topped up if a later attempt's route costs
// more). So, however many requests run at once, settled spend never exceeds
// Limit while every request costs at most its reservation, and exceeds it
// by at most the excess of those that cost more.
//
// A request to a model without a price (none in Config.Prices) is
// reserved and charged at UnpricedPrice; with UnpricedPrice nil, the budget
// refuses it (ErrBudgetExceeded), since it could not count its spend. New
// refuses a budget with UnpricedPrice nil that covers a model the
// configuration names (an upstream's Models, a ClusterPolicy's, a
// Downgrade, ContextFallbacks) without a price, and any such budget when
// Prices is empty but not nil. To tell which of those models a budget
// covers, New calls its Scope with a request for the model that carries
// no header, once per upstream serving it (a Scope that panics covers it).
type Budget struct {
	// Name identifies the budget in errors, reports and Spend; unique.
	Name string
	// Scope picks the requests the budget covers and the ledger each one
	// charges (AllTraffic, PerModel, PerUpstream, PerHeader, or your own).
	// If nil, AllTraffic.
	Scope Scope
	// Limit is what the budget allows per window, in the billing currency;
	// it must be positive.
	Limit float64
	// Window is the period over which spend is counted.
	Window Window
	// Downgrade, when set, is the model a request is routed to when its
	// reservation does not fit: a cheaper route before a refusal. If that
	// does not fit either, the request is refused.
	Downgrade string
	// UnpricedPrice is the price the budget reserves and charges a request
	// to a model without a price at (Report.CostUSD stays 0: it is not the
	// model's price). &Price{} lets such requests through uncounted. If
	// nil, the budget refuses them.
	UnpricedPrice *Price
	// HoldFor bounds how long a reservation holds when its request never
	// settles it (its replica died, or a shared ledger applied a Reserve
	// it answered too late): a Ledger stops counting it after that. A
	// request still running past it keeps going and is charged in full
	// when it ends, but no longer holds its worst case meanwhile. If 0,
	// 10 minutes.
	HoldFor time.Duration
}

// Scope says which requests a budget covers and which of its ledgers each
// charges: given the request and where an attempt would go (the model sent
// and the upstream's name), it returns the ledger's key, or false when the
// budget does not cover it. One budget thus holds a ledger per key (per
// team, per model...), each with the budget's Limit. It is called
// concurrently and must be fast; it must not modify r.Header.
type Scope func(r Request, model, upstream string) (key string, ok bool)

// AllTraffic covers every request, in one ledger.
func AllTraffic() Scope {
	return func(Request, string, string) (string, bool) { return "", true }
}

// PerModel covers requests by the model sent, one ledger per model; with
// models given, only those.
func PerModel(models ...string) Scope {
	return func(_ Request, model, _ string) (string, bool) {
		return model, len(models) == 0 || slices.Contains(models, model)
	}
}

// PerUpstream covers requests by the upstream they go to, one ledger per
// upstream; with names given, only those.
func PerUpstream(names ...string) Scope {
	return func(_ Request, _, upstream string) (string, bool) {
		return upstream, len(names) == 0 || slices.Contains(names, upstream)
	}
}

// PerHeader covers requests that carry the header (e.g. "X-Relay-Budget:
// team-a"), one ledger per value.
func PerHeader(name string) Scope {
	name = http.CanonicalHeaderKey(name)
	return func(r Request, _, _ string) (string, bool) {
		v := headerValue(r.Header, name)
		return v, v != ""
	}
}

// Window is the period a budget's spend is counted over: back-to-back
// windows of Every (aligned to the Unix epoch, so a 24 h window starts at
// 00:00 UTC), or the calendar Day or Month in Location (midnight to
// midnight, daylight-saving changes included). Exactly one of Every and
// Calendar is set.
type Window struct {
	Every    time.Duration  // the length of back-to-back windows
	Calendar Period         // or a calendar period
	Location *time.Location // for Calendar; nil is UTC
}

// Period is a calendar period.
type Period uint8

// Calendar periods.
const (
	NoPeriod Period = iota
	Day
	Month
)

// start returns the start of the window that ends at end.
func (w Window) start(end time.Time) time.Time {
	if w.Every > 0 {
		return end.Add(-w.Every)
	}
	y, m, d := end.Date()
	if w.Calendar == Month {
		return dayStart(y, m-1, 1, end.Location())
	}
	return dayStart(y, m, d-1, end.Location())
}

// end returns the end of the window that holds t.
func (w Window) end(t time.Time) time.Time {
	if w.Every > 0 {
		n := t.UnixNano()
		e := n - n%int64(w.Every) + int64(w.Every)
		return time.Unix(0, e).UTC()
	}
	loc := w.Location
	if loc == nil {
		loc = time.UTC
	}
	t = t.In(loc)
	y, m, d := t.Date()
	if w.Calendar == Month {
		return dayStart(y, m+1, 1, loc)
	}
	return dayStart(y, m, d+1, loc)
}

// dayStart returns the first instant of a day in loc (y, m, d normalized
// as time.Date does): midnight, or, where a daylight-saving change skips
// midnight (America/Santiago), the first minute the day has, and where
// one repeats midnight (Asia/Gaza, 2021-10-29), the first of the two.
// (time.Date gives a skipped midnight as an instant of the day before,
// and a repeated one as the second.)
func dayStart(y int, m time.Month, d int, loc *time.Location) time.Time {
	t := time.Date(y, m, d, 0, 0, 0, 0, loc)
	wy, wm, wd := time.Date(y, m, d, 12, 0, 0, 0, loc).Date()
	for i := 0; i < 24*60; i++ {
		if ty, tm, td := t.Date(); ty == wy && tm == wm && td == wd {
			break
		}
		t = t.Add(time.Minute)
	}
	// Where midnight repeats (a clock set back from 01:00 to 00:00),
	// time.Date gives the second 00:00: the day began an hour before.
	for i := 0; i < 24*60; i++ {
		if py, pm, pd := t.Add(-time.Minute).Date(); py != wy || pm != wm || pd != wd {
			break
		}
		t = t.Add(-time.Minute)
	}
	return t
}

// Currency is the billing currency: the one budgets are set in and
// Report.Cost is given in.
type Currency struct {
	// Code is the ISO 4217 code, e.g. "CNY"; "" is "USD".
	Code string
	// PerUSD is how many units of the currency one USD of effective cost
	// (CostUSD, after the upstream's price factor) bills. If 0, 1.
	PerUSD float64
}

// maxBudgetLimit bounds Budget.Limit, in units of the billing currency:
// half of what int64 nano-units hold, so that spend, reservations and one
// more request add up without wrapping.
const maxBudgetLimit = 4e9

// nanos converts an amount of the billing currency to nano-units,
// rounding up (a reservation is never short).
func nanos(v float64) int64 {
	if v <= 0 {
		return 0
	}
	if v >= math.MaxInt64/1e9 {
		return math.MaxInt64
	}
	return int64(math.Ceil(v * 1e9))
}

// budgetSettings is a checked Budget.
type budgetSettings struct {
	Budget
	limit   int64 // nano-units
	holdFor time.Duration
	cur     atomic.Pointer[[2]time.Time] // the current window's start and end, cached
}

// windowEnd returns the end of the window that holds now, computing a
// calendar window once per window.
func (b *budgetSettings) windowEnd(now time.Time) time.Time {
	if w := b.cur.Load(); w != nil && !now.Before(w[0]) && now.Before(w[1]) {
		return w[1]
	}
	end := b.Window.end(now)
	start := b.Window.start(end)
	b.cur.Store(&[2]time.Time{start, end})
	return end
}

func resolveBudgets(list []Budget, bad func(string, ...any)) []budgetSettings {
	out := make([]budgetSettings, 0, len(list))
	seen := map[string]bool{}
	for _, b := range list {
		switch {
		case b.Name == "":
			bad("a budget has no Name")
		case seen[b.Name]:
			bad("budget %q is configured twice", b.Name)
		case !(b.Limit > 0):
			bad("budget %q: Limit %g must be positive", b.Name, b.Limit)
		case b.Limit > maxBudgetLimit:
			// Amounts are int64 nano-units, and sums of them must not wrap.
			bad("budget %q: Limit %g is over %g units; set it in a larger unit of the currency (Currency.PerUSD)", b.Name, b.Limit, float64(maxBudgetLimit))
		case (b.Window.Every > 0) == (b.Window.Calendar != NoPeriod) || b.Window.Every < 0 || b.Window.Calendar > Month:
			bad("budget %q: set exactly one of Window.Every (positive) and Window.Calendar (Day or Month)", b.Name)
		case b.HoldFor < 0:
			bad("budget %q: HoldFor %s is negative", b.Name, b.HoldFor)
		default:
			if b.Scope == nil {
				b.Scope = AllTraffic()
			}
			if b.HoldFor == 0 {
				b.HoldFor = defaultHoldFor
			}
			out = append(out, budgetSettings{Budget: b, limit: nanos(b.Limit), holdFor: b.HoldFor})
		}
		seen[b.Name] = true
	}
	return out
}

// defaultHoldFor is Budget.HoldFor's default.
const defaultHoldFor = 10 * time.Minute

// held is one reservation a request holds.
type held struct {
	b  *budgetSettings
	k  store.BudgetKey // in the window where the request first reserved: top-ups go there too
	id string          // the hold's id in its ledgers, unique in the fleet (reservations.newID)
	// What it holds in the router's ledger, and in the in-process fallback
	// ledger (when the shared one did not answer): a top-up may land in
	// the other one, and each part is settled where it was reserved.
	shared, local int64
	// uncertain: a shared ledger did not answer a Reserve in time; it may
	// still have made the hold, so the settlement ends it there too.
	uncertain bool
}

// amount is all that h holds.
func (h *held) amount() int64 { return h.shared + h.local }

// reservations are what one request holds in its budgets, and the budget
// that last refused it.
type reservations struct {
	id        string // the request's: the hold ids of its holds start with it
	n         int    // holds it made
	list      []held
	buf       [4]held
	refused   *budgetSettings
	unpriced  string // the model without a price the refusing budget could not count, if that was why
	seenKeys  bool
	downgrade bool  // the request was moved to a budget's Downgrade model
	clamps    uint8 // budget clamps tried (clampBudget)
}

// scope calls b's Scope for the trip's request. A panic in it is the
// trip's, as a hook's is (trip.catch): the budget then does not cover the
// request, which unwinds, and RoundTrip panics with the value.
func (t *trip) scope(b *budgetSettings, model, upstream string) (key string, covers bool) {
	defer t.catch()
	return b.Scope(t.c.req, model, upstream)
}

// reserve makes sure the trip holds, in every budget covering c, at least
// c's worst-case cost, reserving (or topping up) what is missing. It
// reports false, with the refusing budget noted, when one does not fit. A
// shared ledger that does not answer is decided by the local share
// (reserveLedger).
func (t *trip) reserve(ctx context.Context, c *candidate, now time.Time) bool {
	bs := t.r.s.budgets
	if len(bs) == 0 {
		return true
	}
	res := &t.res
	if res.list == nil {
		res.list = res.buf[:0]
	}
	for i := range bs {
		b := &bs[i]
		key, covers := t.scope(b, c.model, c.up.cfg.Name)
		if !covers {
			continue
		}
		need, ok := t.worstCase(b, c)
		if !ok {
			res.refused, res.unpriced = b, c.model // it could not count the request's spend
			return false
		}
		k := store.BudgetKey{Budget: b.Name, Key: key, Window: b.windowEnd(now)}
		h := res.find(k)
		if h != nil && h.amount() >= need {
			continue
		}
		have, onlyLocal := int64(0), false
		switch {
		case h != nil && !h.k.Window.Equal(k.Window):
			// A top-up after the hold's window ended: the hold moves to
			// the current window (a ledger keeps its current window, and
			// one settlement must release all of it).
			t.r.settleLedger(t, h, 0)
			*h = held{b: b, k: k, id: res.newID()}
		case h != nil:
			have, onlyLocal = h.amount(), h.local > 0 && h.shared == 0
		}
		isNew := h == nil
		if isNew {
			res.list = append(res.list, held{b: b, k: k, id: res.newID()})
			h = &res.list[len(res.list)-1]
		}
		if !t.r.reserveLedger(ctx, t, h, need-have, onlyLocal, now.Add(b.holdFor)) {
			if isNew && !h.uncertain {
				res.list = res.list[:len(res.list)-1] // nothing held, nothing to settle
			}
			res.refused, res.unpriced = b, ""
			return false
		}
	}
	return true
}

// dropHolds gives back the holds made since the trip held n0 whose
// ledgers do not cover c, the candidate the admission step picked (nil:
// none). The scan reserves a candidate's worst case before it looks at
// the candidate's limits; a candidate it then passed over (no tokens, no
// slot, its cap) would otherwise keep a hold in its own ledgers (a
// PerUpstream or PerModel budget's) until the request ends, refusing
// others meanwhile. Holds made before (an earlier attempt's, a hedge's
// first attempt's) are the request's and stay until it settles.
//
// A hold made since n0 that covers c too is brought down to c's worst case
// when a dearer candidate passed over made it larger (an AllTraffic
// budget, with a fallback to a dearer model or upstream first in line).
func (t *trip) dropHolds(ctx context.Context, n0 int, c *candidate) {
	res := &t.res
	if len(res.list) <= n0 {
		return
	}
	keep := res.list[:n0]
	for _, h := range res.list[n0:] {
		if c != nil {
			if key, covers := t.scope(h.b, c.model, c.up.cfg.Name); covers && key == h.k.Key {
				need, _ := t.worstCase(h.b, c) // (c was admitted: its budgets can count it)
				if h.amount() > need && (h.local == 0 || h.shared == 0) && !h.uncertain {
					// Reserving less always fits; a ledger that does not
					// answer keeps the larger hold, which the settlement ends.
					t.r.reserveLedger(ctx, t, &h, need-h.amount(), h.local > 0, t.r.s.clock.Now().Add(h.b.holdFor))
				}
				keep = append(keep, h)
				continue
			}
		}
		t.r.settleLedger(t, &h, 0)
	}
	res.list = keep
}

// newID returns the id of a new hold of the request: one that no other
// hold of the fleet has (the request's 64 random bits, and the hold's
// number), so that a hold given back (a candidate passed over) and made
// again in the same ledger is a new one, which a ledger does not take for
// the late reply of a settled one.
func (res *reservations) newID() string {
	if res.id == "" {
		res.id = strconv.FormatUint(rand.Uint64(), 36)
	}
	res.n++
	return res.id + "." + strconv.Itoa(res.n)
}

// find returns the hold of k's budget and key, in whatever window.
func (res *reservations) find(k store.BudgetKey) *held {
	for i := range res.list {
		if h := &res.list[i]; h.k.Budget == k.Budget && h.k.Key == k.Key {
			return h
		}
	}
	return nil
}

// worstCase is the reservation of c in b: the trip's reservation at the
// model's price (b's UnpricedPrice for a model without a price), after
// c's upstream's price factor, in nano-units of the
// billing currency. ok is false when the model has no price and b has no
// UnpricedPrice.
func (t *trip) worstCase(b *budgetSettings, c *candidate) (need int64, ok bool) {
	p, ok := b.price(t.r.s.prices, c.model)
	if !ok {
		return 0, false
	}
	out := t.tokens - t.c.req.PromptTokens
	return nanos(t.reservation(p, out) * c.up.factor * t.r.s.currency.PerUSD), true
}

// price is the price b counts model's requests at: the model's own, else
// b's UnpricedPrice; ok is false when there is neither.
func (b *budgetSettings) price(prices map[string]Price, model string) (p Price, ok bool) {
	if p, ok := lookupPrice(prices, model); ok {
		return p, true
	}
	if b.UnpricedPrice == nil {
		return Price{}, false
	}
	return *b.UnpricedPrice, true
}

// settle replaces the trip's reservations by what it cost: cost (in the
// billing currency) is charged to the ledgers that cover the answering
// attempt; the others get their reservations back.
func (t *trip) settle(parts []costPart) (spends []SpendEvent, late *hookPanic) {
	res := &t.res
	charges := make([]int64, len(res.list))
	var loose []held    // ledgers a part goes to that the trip holds nothing in,
	var looseCh []int64 // and what they are charged
	for _, p := range parts {
		for bi := range t.r.s.budgets {
			b := &t.r.s.budgets[bi]
			spent := p.spent(b, t.r.s.currency.PerUSD)
			if spent <= 0 {
				continue
			}
			key, covers := t.settleScope(b, p.model, p.upstream, &late)
			if !covers {
				continue
			}
			if i := slices.IndexFunc(res.list, func(h held) bool { return h.b == b && h.k.Key == key }); i >= 0 {
				charges[i] += spent
				continue
			}
			loose = append(loose, held{b: b, k: store.BudgetKey{Budget: b.Name, Key: key, Window: b.windowEnd(t.r.s.clock.Now())}})
			looseCh = append(looseCh, spent)
		}
	}
	for i := range res.list {
		spends = t.settleCharge(spends, &res.list[i], charges[i])
	}
	for i := range loose {
		spends = t.settleCharge(spends, &loose[i], looseCh[i]) // (no hold there: only the spend)
	}
	res.list = res.list[:0]
	return spends, late
}

// settleScope is scope for settle. A panic once RoundTrip has returned
// (settle then runs in the caller's Read or Close) is kept in *late, for
// vote to raise once every hold is settled and the report made, rather
// than raised in the middle of settling: the part is then charged to no
// key of that budget, and its hold is given back. Before RoundTrip
// returns, the panic is kept for RoundTrip to raise, as catch does.
func (t *trip) settleScope(b *budgetSettings, model, upstream string, late **hookPanic) (key string, covers bool) {
	defer func() {
		if p := recover(); p != nil {
			if !t.hookPanic.CompareAndSwap(nil, &hookPanic{v: p}) && t.hookPanic.Load() == &tripReturned && *late == nil {
				*late = &hookPanic{v: p}
			}
		}
	}()
	return b.Scope(t.c.req, model, upstream)
}

// costPart is a share of a request's cost, in the billing currency, and
// where it was spent.
type costPart struct {
	model, upstream string
	cost            float64
	// For a model without a price (cost 0), what a budget's
	// UnpricedPrice charges: the usage, and the upstream's price factor.
	unpriced bool
	usage    Usage
	factor   float64
}

// spent is what p charges b, in nano-units of the billing currency.
func (p *costPart) spent(b *budgetSettings, perUSD float64) int64 {
	if !p.unpriced || b.UnpricedPrice == nil {
		return nanos(p.cost)
	}
	return nanos(b.UnpricedPrice.Cost(p.usage) * p.factor * perUSD)
}

// settleCharge ends h and charges it spent, and appends the event for
// Hooks.OnSpend (called once every ledger is settled: a panicking hook
// then leaves no hold behind).
func (t *trip) settleCharge(spends []SpendEvent, h *held, spent int64) []SpendEvent {
	t.r.settleLedger(t, h, spent)
	if t.r.s.hooks.OnSpend != nil && spent > 0 {
		spends = append(spends, SpendEvent{Context: t.ctx, Budget: h.b.Name, Key: h.k.Key, Amount: float64(spent) / 1e9, Currency: t.r.s.currency.Code})
	}
	return spends
}

// downgrade moves a request a budget refused to the budget's Downgrade
// model, once: its candidates join the list. It reports whether it did.
func (t *trip) downgrade(cands *[]candidate) bool {
	b := t.res.refused
	if b == nil || b.Downgrade == "" || t.res.downgrade {
		return false
	}
	to := 0 // a clamp to the model's window (Config.Clamp)
	if q := &t.c.req; q.Endpoint != "" && q.PromptTokens > 0 && !t.r.s.fits(b.Downgrade, q.PromptTokens, q.MaxTokens) {
		if to = t.windowClamp(b.Downgrade); to == 0 {
			return false // it would fail with context_length_exceeded: refused instead
		}
	}
	t.res.downgrade = true
	t.constraint = ConstraintBudget
	n := len(*cands)
	*cands = t.r.appendCandidates(*cands, b.Downgrade, t.r.s.clock.Now(), t.key, true, t.require)
	if len(*cands) == n {
		return false
	}
	if to > 0 {
		t.setClamp(to, ConstraintContextWindow, "")
	}
	return true
}

// budgetError is the error of a request a budget refused.
func (t *trip) budgetError(model string) error {
	err := ErrBudgetExceeded
	if m := t.res.unpriced; m != "" {
		err = fmt.Errorf("%w: model %q has no price (Config.Prices) and the budget has no UnpricedPrice", ErrBudgetExceeded, m)
	}
	return &Error{Op: "admit", Budget: t.res.refused.Name, Model: model, Err: err}
}

// Budgets is a policy's view of the budgets covering a request (for the
// model it asked for), so that a rule can move it to a cheaper model as a
// budget runs low.
type Budgets interface {
	// Spent returns the share of the named budget's limit spent or
	// reserved in its current window, in the ledger this request would
	// charge (0.8 is 80%; with a scope that keys by upstream, the largest
	// of the ledgers of the upstreams serving its model), and false when
	// the budget does not cover the request.
	Spent(name string) (share float64, ok bool)
	// Most returns the largest such share among the budgets covering the
	// request; 0 when none does.
	Most() float64
}

// budgetView is the router's Budgets for one request.
type budgetView struct {
	r   *Router
	q   *Request
	ctx context.Context // the request's
}

func (v budgetView) Spent(name string) (float64, bool) {
	for i := range v.r.s.budgets {
		if b := &v.r.s.budgets[i]; b.Name == name {
			return v.share(b)
		}
	}
	return 0, false
}

func (v budgetView) Most() float64 {
	most := 0.0
	for i := range v.r.s.budgets {
		if s, ok := v.share(&v.r.s.budgets[i]); ok {
			most = max(most, s)
		}
	}
	return most
}

// share is the largest share spent of b's ledgers the request may charge:
// those of its model on each upstream serving it (one ledger, unless the
// scope keys by upstream).
func (v budgetView) share(b *budgetSettings) (float64, bool) {
	end := b.windowEnd(v.r.s.clock.Now())
	var keys []string
	for _, u := range v.r.ups {
		if !u.serves(v.q.Model) {
			continue
		}
		if key, covers := b.Scope(*v.q, v.q.Model, u.cfg.Name); covers && !slices.Contains(keys, key) {
			keys = append(keys, key)
		}
	}
	if len(keys) == 0 {
		return 0, false
	}
	most := 0.0
	for _, key := range keys {
		spent, reserved, err := v.r.usage(v.ctx, b, store.BudgetKey{Budget: b.Name, Key: key, Window: end})
		if err == nil {
			most = max(most, float64(spent+reserved)/float64(b.limit))
		}
	}
	return most, true
}

// noBudgets is the view when no budget is configured.
type noBudgets struct{}

func (noBudgets) Spent(string) (float64, bool) { return 0, false }
func (noBudgets) Most() float64                { return 0 }

// BudgetSpend is one ledger of a budget, for a dashboard or a test.
type BudgetSpend struct {
	Budget    string    // the budget's name
	Key       string    // the scope's key ("" for AllTraffic)
	Spent     float64   // settled, in the billing currency
	Reserved  float64   // held by requests in flight
	Limit     float64   // per window
	WindowEnd time.Time // end of the current window
}

// Spend returns, for every budget and every ledger it has in the current
// window, the spend and reservations, in configuration order and then by
// key. With a shared Ledger the figures are the fleet's (settlements it
// did not take when they were made are made again first); each call to it
// is bounded by Config.StateTimeout, and when it does not answer the
// figures are the fleet's as of its last answer with this replica's since,
// Replicas times. It is safe for concurrent use.
func (r *Router) Spend() []BudgetSpend {
	r = r.current()
	r.settlePending(nil)
	now := r.s.clock.Now()
	var out []BudgetSpend
	for i := range r.s.budgets {
		b := &r.s.budgets[i]
		end := b.windowEnd(now)
		keys := r.keys(b.Name, end)
		slices.Sort(keys)
		for _, key := range keys {
			spent, reserved, _ := r.usage(context.Background(), b, store.BudgetKey{Budget: b.Name, Key: key, Window: end})
			out = append(out, BudgetSpend{Budget: b.Name, Key: key, Spent: float64(spent) / 1e9, Reserved: float64(reserved) / 1e9,
				Limit: b.Limit, WindowEnd: end})
		}
	}
	return out
}
