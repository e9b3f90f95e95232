package relay

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokenrelay/relay/store"
)

// The router decides every admission, wait and settlement against one
// store (package store): Config.State when one is set, shared by the
// replicas of a service, else an in-process store.Local. The admission
// code (admit.go, queue.go, breaker.go, budget.go) is written once
// against it; this file is the only one that knows whether the store is
// shared.
//
// A shared store is called on the request path, each call bounded by
// Config.StateTimeout. When a call fails or times out, the router decides
// that call from its local share: an in-process store.Local whose limits
// are the fleet's divided by Config.Replicas, and which every verdict of
// the shared store keeps in step with the fleet (store.Local.Mirror), so
// that it starts where the fleet is, not from a full bucket. The call is
// counted in Router.StateFallbacks and Report.StateFallback, and the next
// call tries the shared store again: a store that is down never fails a
// request.

// stores is the router's store and its local share.
type stores struct {
	st store.State // decides
	// ledger keeps the budgets: Config.Ledger, else st.
	ledger store.Ledger
	// local is the local share, which decides while a shared st or
	// ledger does not answer; nil when both are in-process.
	local *store.Local
	// sharedSt and sharedLedger: st, ledger are shared (their calls are
	// bounded by StateTimeout and may fail).
	sharedSt, sharedLedger bool
	fallbacks              atomic.Uint64
	budgets                budgetShares // what the fleet had left of each budget, last it answered
	pending                pendingSettles
}

// initStores sets the router's stores up from its settings.
func (r *Router) initStores() {
	s := &r.s
	r.st, r.ledger = s.state, s.ledger
	if r.st == nil {
		r.st = store.NewLocal()
	}
	if r.ledger == nil {
		r.ledger = r.st
	}
	r.sharedSt, r.sharedLedger = s.state != nil, s.ledger != nil || s.state != nil
	if r.sharedSt || r.sharedLedger {
		r.local = store.NewLocal()
	}
}

// StateFallbacks returns how many calls to Config.State (or a shared
// Config.Ledger) failed or timed out, each decided from the local share
// instead.
func (r *Router) StateFallbacks() uint64 { return r.fallbacks.Load() }

// shared runs call on a shared store, bounded by StateTimeout and by ctx.
// It reports whether the store answered; a failure is counted for the
// request t (nil when no request made the call) under op (see
// StateFallbackEvent): the caller then decides from the local share.
func (r *Router) shared(ctx context.Context, t *trip, op string, call func(context.Context) error) bool {
	sctx, cancel := context.WithTimeout(ctx, r.s.stateTimeout)
	err := call(sctx)
	cancel()
	if err != nil {
		r.stateFailed(t, op, err)
	}
	return err == nil
}

// stateFailed counts a failed call of a shared store (op, see
// StateFallbackEvent) for the request t, if a request made it, and tells
// Hooks.OnStateFallback.
func (r *Router) stateFailed(t *trip, op string, err error) {
	r.fallbacks.Add(1)
	var ctx context.Context
	if t != nil {
		t.stateFallback.Store(true)
		ctx = t.ctx
	}
	if h := r.s.hooks.OnStateFallback; h != nil {
		ev := StateFallbackEvent{Context: ctx, Op: op, Err: err}
		if t != nil {
			t.onStateFallback(h, ev)
		} else {
			h(ev)
		}
	}
}

// onStateFallback calls Hooks.OnStateFallback; a panic is kept (see
// trip.catch).
func (t *trip) onStateFallback(h func(StateFallbackEvent), ev StateFallbackEvent) {
	defer t.catch()
	h(ev)
}

// Where an admission took its tokens.
const (
	tookNone  uint8 = iota
	tookStore       // the router's store
	tookShare       // the local share, while the shared store did not answer
)

// admitIn asks the store for an admission on the fleet's limits (share:
// this replica's, for the local share), and says where the tokens were
// taken, if they were. What the local share admitted while the shared
// store did not answer (owed; nil for an admission that takes no tokens)
// goes with the next call that reaches it.
func (r *Router) admitIn(ctx context.Context, t *trip, fleet, share *store.Limits, o *owed, a store.Ask, now time.Time) (store.Verdict, uint8) {
	if !r.sharedSt {
		v, _ := r.st.Admit(ctx, *fleet, a, now)
		return v, tookStore
	}
	var v store.Verdict
	if o != nil {
		a.Owed = o.load(fleet, now)
	}
	if r.shared(ctx, t, "admit", func(ctx context.Context) (err error) {
		v, err = r.st.Admit(ctx, *fleet, a, now)
		return err
	}) {
		if o != nil {
			o.paid(fleet, a.Owed)
		}
		r.local.Mirror(*share, v, a.Force, now)
		return v, tookStore
	}
	a.Owed = store.Owed{}
	v, _ = r.local.Admit(ctx, *share, a, now)
	if v.Taken && o != nil {
		o.add(fleet, 1, a.Tokens, now)
	}
	return v, tookShare
}

// owed is what this replica's local share admitted on an upstream's
// limits while the shared store did not answer, not yet told to it: as
// the backlog those admissions would have made in the fleet's buckets
// (GCRA's arrival times, at the fleet's rates), so that what the refill
// has made up for since is not owed any more.
type owed struct {
	requests, tokens atomic.Int64 // Unix ns
}

// load returns what is owed at now.
func (o *owed) load(fleet *store.Limits, now time.Time) store.Owed {
	return store.Owed{Requests: owedAt(&o.requests, fleet.RPM, now), Tokens: owedAt(&o.tokens, fleet.TPM, now)}
}

func owedAt(tat *atomic.Int64, limit int, now time.Time) int {
	if limit <= 0 {
		return 0
	}
	left := tat.Load() - now.UnixNano()
	if left <= 0 {
		return 0
	}
	return int(math.Ceil(float64(left) * float64(limit) / float64(time.Minute)))
}

// add records an admission of the local share: a request of tokens.
func (o *owed) add(fleet *store.Limits, requests, tokens int, now time.Time) {
	owe(&o.requests, fleet.RPM, requests, now.UnixNano())
	owe(&o.tokens, fleet.TPM, min(max(tokens, 1), max(fleet.TPM, 1)), now.UnixNano())
}

// paid takes what the store was told off (p), never below nothing; a
// negative p adds to it.
func (o *owed) paid(fleet *store.Limits, p store.Owed) {
	owe(&o.requests, fleet.RPM, -p.Requests, 0)
	owe(&o.tokens, fleet.TPM, -p.Tokens, 0)
}

// owe moves a backlog's arrival time by n tokens of a bucket of limit a
// minute, from now at the earliest (n > 0) or down to now at the latest
// (n < 0).
func owe(tat *atomic.Int64, limit, n int, now int64) {
	if limit <= 0 || n == 0 {
		return
	}
	d := int64(float64(n) * float64(time.Minute) / float64(limit))
	for {
		old := tat.Load()
		v := max(old, now) + d
		if n < 0 {
			v = max(old+d, now)
		}
		if tat.CompareAndSwap(old, v) {
			return
		}
	}
}

// refundIn gives requests and tokens back where they were taken (took).
// A refund is made even when the request's context has ended (a waiter
// whose caller gave up gives back what it took): it is detached from
// ctx's cancellation, bounded by StateTimeout alone.
func (r *Router) refundIn(ctx context.Context, t *trip, u *upstream, took uint8, requests, tokens int, now time.Time) {
	switch {
	case took == tookShare:
		r.local.Refund(ctx, u.lim.share, requests, tokens, now)
		u.lim.owed.paid(&u.lim.fleet, store.Owed{Requests: requests, Tokens: tokens}) // given back before the store was told
	case !r.sharedSt:
		r.st.Refund(ctx, u.lim.fleet, requests, tokens, now)
	default:
		r.shared(context.WithoutCancel(ctx), t, "refund", func(ctx context.Context) error {
			return r.st.Refund(ctx, u.lim.fleet, requests, tokens, now)
		})
	}
}

// holdIn keeps u out until until, in the store.
func (r *Router) holdIn(ctx context.Context, t *trip, u *upstream, until, now time.Time) {
	r.tell(ctx, t, func(ctx context.Context, s store.State) error { return s.Hold(ctx, u.cfg.Name, until, now) })
}

// tell makes a change this replica decided on (a hold, an open circuit)
// in the store, and in the local share too, so that a fallback keeps to
// it. Its calls are detached from ctx's cancellation (an attempt's
// outcome is recorded when its caller gave up too), bounded by
// StateTimeout alone.
func (r *Router) tell(ctx context.Context, t *trip, change func(context.Context, store.State) error) {
	ctx = context.WithoutCancel(ctx)
	if !r.sharedSt {
		change(ctx, r.st)
		return
	}
	change(ctx, r.local)
	r.shared(ctx, t, "observe", func(ctx context.Context) error { return change(ctx, r.st) })
}

// outcomeIn records an attempt's outcome for u's circuit; the local share
// decides when the shared store does not answer, or when the attempt was
// admitted there.
func (r *Router) outcomeIn(ctx context.Context, t *trip, u *upstream, took uint8, o store.Outcome, now time.Time) store.Change {
	ctx = context.WithoutCancel(ctx)
	p := r.s.breaker.policy
	if !r.sharedSt {
		ch, _ := r.st.Outcome(ctx, u.cfg.Name, p, o, now)
		return ch
	}
	var ch store.Change
	if took != tookShare && r.shared(ctx, t, "observe", func(ctx context.Context) (err error) {
		ch, err = r.st.Outcome(ctx, u.cfg.Name, p, o, now)
		return err
	}) {
		return ch
	}
	ch, _ = r.local.Outcome(ctx, u.cfg.Name, p, o, now)
	return ch
}

// openIn opens u's circuit until until (a reason of this replica's own: its
// p99 latency), in the store.
func (r *Router) openIn(ctx context.Context, t *trip, u *upstream, until, now time.Time) {
	r.tell(ctx, t, func(ctx context.Context, s store.State) error { return s.Open(ctx, u.cfg.Name, until, now) })
}

// usage reads the spend and reservations of b's ledger k: a shared
// ledger's within StateTimeout; when it does not answer, the fleet's as of
// its last answer with this replica's since, Replicas times (see
// budgetShares).
func (r *Router) usage(ctx context.Context, b *budgetSettings, k store.BudgetKey) (spent, reserved int64, err error) {
	if ctx == nil {
		ctx = context.Background()
	}
	now := r.s.clock.Now()
	if !r.sharedLedger {
		return r.ledger.Usage(ctx, k, now)
	}
	if r.shared(ctx, nil, "usage", func(ctx context.Context) (err error) {
		spent, reserved, err = r.ledger.Usage(ctx, k, now)
		return err
	}) {
		r.budgets.sync(r.local, k, b.limit-spent-reserved, r.s.replicas, now)
		return spent, reserved, nil
	}
	spent, reserved, err = r.local.Usage(ctx, k, now)
	n := int64(r.s.replicas)
	if limit, ok := r.budgets.limit(k); ok {
		used := b.limit - n*(limit-spent-reserved) // the fleet's at its last answer, and this replica's since
		reserved = min(n*reserved, max(used, 0))
		return max(used-reserved, 0), reserved, err
	}
	return spent * n, reserved * n, err
}

// keys lists the keys of budget's ledgers in the window ending at end, as
// usage reads them.
func (r *Router) keys(budget string, end time.Time) []string {
	var keys []string
	if !r.sharedLedger {
		keys, _ = r.ledger.Keys(context.Background(), budget, end)
		return keys
	}
	if !r.shared(context.Background(), nil, "usage", func(ctx context.Context) (err error) {
		keys, err = r.ledger.Keys(ctx, budget, end)
		return err
	}) {
		keys, _ = r.local.Keys(context.Background(), budget, end)
	}
	return keys
}

// reserveLedger changes h's reservation by delta (a negative delta lowers
// it), as hold h.id until expires, and reports whether it fits. A shared
// ledger is called within StateTimeout; when it does not answer, the local
// share decides (onlyLocal keeps the change there, where the reservation
// is): with the limit of this replica's share of what the fleet had left
// at its last answer (budgetShares), and a refusal for a ledger it never
// answered for: a budget never falls back to an empty ledger.
func (r *Router) reserveLedger(ctx context.Context, t *trip, h *held, delta int64, onlyLocal bool, expires time.Time) bool {
	now := r.s.clock.Now()
	if !r.sharedLedger {
		res, _ := r.ledger.Reserve(ctx, h.k, h.b.limit, store.Hold{ID: h.id, Amount: h.shared + delta, Expires: expires}, now)
		if res.OK {
			h.shared += delta
		}
		return res.OK
	}
	if !onlyLocal {
		r.settlePending(t) // the spend of an outage goes to the fleet's ledger before a new reservation
		var res store.Reservation
		if r.shared(ctx, t, "reserve", func(ctx context.Context) (err error) {
			res, err = r.ledger.Reserve(ctx, h.k, h.b.limit, store.Hold{ID: h.id, Amount: h.shared + delta, Expires: expires}, now)
			return err
		}) {
			r.budgets.sync(r.local, h.k, res.Left, r.s.replicas, now)
			if res.OK {
				h.shared += delta
			}
			return res.OK
		}
		h.uncertain = true
	}
	limit, ok := r.budgets.limit(h.k)
	if !ok {
		limit, ok = r.budgets.fresh(h.b, h.k, r.s.replicas)
	}
	if !ok {
		return delta <= 0 // nothing known of what the fleet has left: fail closed
	}
	res, _ := r.local.Reserve(ctx, h.k, limit, store.Hold{ID: h.id, Amount: h.local + delta, Expires: expires}, now)
	if res.OK {
		h.local += delta
	}
	return res.OK
}

// settleLedger ends h's reservation in each ledger that holds a part of
// it (or may: a shared Reserve that did not answer), and charges spent to
// the shared ledger when it holds a part, else to the local share (whose
// spend goes to the shared ledger once it answers again). A shared
// settlement that fails is kept and made again after the next one that
// succeeds (pendingSettles): no hold outlives its request's settlement
// by more than the store's outage.
func (r *Router) settleLedger(t *trip, h *held, spent int64) {
	ctx, now := context.Background(), r.s.clock.Now()
	toShared := h.shared > 0 || h.local == 0
	if h.local > 0 {
		toLocal := spent
		if toShared {
			toLocal = 0
		}
		r.local.Settle(ctx, h.k, h.id, toLocal, now)
		if toLocal > 0 {
			r.pending.add(pendingSettle{k: h.k, spent: toLocal})
		}
	}
	if !toShared && !h.uncertain {
		return
	}
	toMain := int64(0)
	if toShared {
		toMain = spent
	}
	if !r.sharedLedger {
		r.ledger.Settle(ctx, h.k, h.id, toMain, now)
		return
	}
	if !r.shared(ctx, t, "settle", func(ctx context.Context) error { return r.ledger.Settle(ctx, h.k, h.id, toMain, now) }) {
		r.pending.add(pendingSettle{k: h.k, id: h.id, spent: toMain})
		return
	}
	r.settlePending(t)
}

// budgetShares keeps this replica's share of what the fleet had left of
// each budget ledger at the shared ledger's last answer for it: the limit
// the local share's ledger reserves against while the shared ledger does
// not answer. That limit is what the local ledger held at that answer
// (its reservations and spend of earlier outages, whose spend has gone to
// the shared ledger since) plus 1/Replicas of what the fleet had left; so
// that, while the shared ledger is down, the replicas together reserve at
// most what the fleet had left when it last answered each of them.
type budgetShares struct {
	mu   sync.Mutex
	m    map[store.BudgetKey]int64
	last int64 // when the shared ledger last answered (Unix ns); 0: never
}

// maxBudgetShares bounds the ledgers budgetShares keeps: past it, those of
// ended windows go.
const maxBudgetShares = 4096

// sync records the fleet's answer for k: left of the limit, at now.
func (b *budgetShares) sync(local *store.Local, k store.BudgetKey, left int64, replicas int, now time.Time) {
	spent, reserved, _ := local.Usage(context.Background(), k, now)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[store.BudgetKey]int64{}
	}
	if len(b.m) >= maxBudgetShares {
		for key := range b.m {
			if !key.Window.After(now) {
				delete(b.m, key)
			}
		}
	}
	b.m[k] = spent + reserved + max(left, 0)/int64(max(replicas, 1))
	b.last = now.UnixNano()
}

// limit returns the limit of the local share's ledger k, if the fleet
// ever answered for it.
func (b *budgetShares) limit(k store.BudgetKey) (int64, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	l, ok := b.m[k]
	return l, ok
}

// fresh returns the limit of the local share's ledger k when k's window
// started after the shared ledger last answered (the fleet had spent
// nothing of it then as far as this replica knows): its share of the
// whole budget. A window that started before is not fresh: nothing is
// known of what the fleet spent of it.
func (b *budgetShares) fresh(bs *budgetSettings, k store.BudgetKey, replicas int) (int64, bool) {
	b.mu.Lock()
	last := b.last
	b.mu.Unlock()
	if last == 0 || bs.Window.start(k.Window).UnixNano() < last {
		return 0, false
	}
	return bs.limit / int64(max(replicas, 1)), true
}

// pendingSettles are settlements the shared ledger did not take (it did
// not answer), and the spend the local share charged while it was down:
// made again, in order, after the next settlement it takes.
type pendingSettles struct {
	mu   sync.Mutex
	list []pendingSettle
	n    atomic.Int32 // len(list), read without the lock
}

type pendingSettle struct {
	k     store.BudgetKey
	id    string // the hold to end; "": spend alone
	spent int64
}

// maxPending bounds the settlements kept; past it the oldest go (their
// holds end at their deadline, Budget.HoldFor).
const maxPending = 4096

func (p *pendingSettles) add(s pendingSettle) {
	p.mu.Lock()
	if len(p.list) >= maxPending {
		p.list = p.list[1:]
	}
	p.list = append(p.list, s)
	p.n.Store(int32(len(p.list)))
	p.mu.Unlock()
}

// settleBatch bounds the pending settlements made after one that
// succeeded.
const settleBatch = 16

// settlePending makes the pending settlements again, a few at a time,
// until one fails.
func (r *Router) settlePending(t *trip) {
	p := &r.pending
	for range settleBatch {
		if p.n.Load() == 0 {
			return
		}
		p.mu.Lock()
		if len(p.list) == 0 {
			p.mu.Unlock()
			return
		}
		s := p.list[0]
		p.list = p.list[1:]
		p.n.Store(int32(len(p.list)))
		p.mu.Unlock()
		now := r.s.clock.Now()
		if !r.shared(context.Background(), t, "settle", func(ctx context.Context) error { return r.ledger.Settle(ctx, s.k, s.id, s.spent, now) }) {
			p.mu.Lock()
			p.list = append([]pendingSettle{s}, p.list...)
			p.n.Store(int32(len(p.list)))
			p.mu.Unlock()
			return
		}
	}
}
