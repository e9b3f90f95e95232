package store

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"
)

// SettledKeep is how long a ledger remembers a settled hold, so that a
// Reserve of it applied after its Settle (the late reply of a call whose
// caller gave up on it) is refused.
const SettledKeep = time.Minute

// ledger is Local's Ledger. It keeps the current window of each budget's
// keys: a call for a window that has ended is dropped (a settlement adds
// nothing, a reservation is refused, usage is zero).
type ledger struct {
	mu     sync.Mutex
	m      map[string]map[string]*account // budget, key
	latest map[string]time.Time           // by budget: the newest window seen
}

type account struct {
	window          time.Time
	spent, reserved int64
	holds           map[string]hold
	soonest         int64 // the earliest expiry of a hold (Unix ns); 0: none
	settled         map[string]int64
	order           []tomb // settled holds, oldest first
}

type hold struct{ amount, expires int64 }

type tomb struct {
	id      string
	expires int64
}

func (l *ledger) init() {
	l.m = map[string]map[string]*account{}
	l.latest = map[string]time.Time{}
}

// at returns k's account for k's window, starting it if k's window is
// newer; nil when k's window has ended.
func (l *ledger) at(k BudgetKey) *account {
	keys := l.m[k.Budget]
	if keys == nil {
		keys = map[string]*account{}
		l.m[k.Budget] = keys
	}
	if last, ok := l.latest[k.Budget]; !ok || last.Before(k.Window) {
		// A new window: the ledgers of ended ones that hold nothing go
		// (a PerHeader scope would otherwise keep every key ever seen).
		l.latest[k.Budget] = k.Window
		for key, a := range keys {
			if a.window.Before(k.Window) && a.reserved == 0 {
				delete(keys, key)
			}
		}
	}
	a := keys[k.Key]
	switch {
	case a == nil && k.Window.Before(l.latest[k.Budget]):
		return nil // an ended window (its ledger may have gone with it)
	case a == nil:
		a = &account{window: k.Window}
		keys[k.Key] = a
	case a.window.Before(k.Window):
		*a = account{window: k.Window}
	case k.Window.Before(a.window):
		return nil
	}
	return a
}

// expire ends the holds past their expiry, and forgets the settled holds
// kept longer than SettledKeep.
func (a *account) expire(now int64) {
	if a.soonest != 0 && a.soonest <= now {
		a.soonest = 0
		for id, h := range a.holds {
			switch {
			case h.expires <= now:
				a.reserved -= h.amount
				delete(a.holds, id)
			case a.soonest == 0 || h.expires < a.soonest:
				a.soonest = h.expires
			}
		}
	}
	n := 0
	for n < len(a.order) && a.order[n].expires <= now {
		if a.settled[a.order[n].id] == a.order[n].expires {
			delete(a.settled, a.order[n].id)
		}
		n++
	}
	if n > 0 {
		a.order = append(a.order[:0], a.order[n:]...)
	}
}

func (l *ledger) Reserve(_ context.Context, k BudgetKey, limit int64, h Hold, now time.Time) (Reservation, error) {
	if h.Amount < 0 {
		return Reservation{}, fmt.Errorf("store: reserve %s: negative amount %d", k.Budget, h.Amount)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.at(k)
	if a == nil {
		return Reservation{Left: limit}, nil
	}
	t := now.UnixNano()
	a.expire(t)
	left := limit - a.spent - a.reserved
	if _, gone := a.settled[h.ID]; gone {
		return Reservation{Left: left}, nil
	}
	old := a.holds[h.ID]
	delta := h.Amount - old.amount
	if delta > 0 && delta > left {
		return Reservation{Left: left}, nil
	}
	if a.holds == nil {
		a.holds = map[string]hold{}
	}
	exp := h.Expires.UnixNano()
	if h.Expires.IsZero() {
		exp = math.MaxInt64
	}
	a.holds[h.ID] = hold{amount: h.Amount, expires: exp}
	if a.soonest == 0 || exp < a.soonest {
		a.soonest = exp
	}
	a.reserved += delta
	return Reservation{OK: true, Left: left - delta}, nil
}

func (l *ledger) Settle(_ context.Context, k BudgetKey, id string, spent int64, now time.Time) error {
	if spent < 0 {
		return fmt.Errorf("store: settle %s: negative amount %d", k.Budget, spent)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.at(k)
	if a == nil {
		return nil
	}
	t := now.UnixNano()
	a.expire(t)
	if id != "" {
		if h, ok := a.holds[id]; ok {
			a.reserved -= h.amount
			delete(a.holds, id)
		}
		if a.settled == nil {
			a.settled = map[string]int64{}
		}
		a.settled[id] = t + int64(SettledKeep)
		a.order = append(a.order, tomb{id, t + int64(SettledKeep)})
	}
	a.spent = min(a.spent, math.MaxInt64-spent) + spent // saturating
	return nil
}

func (l *ledger) Usage(_ context.Context, k BudgetKey, now time.Time) (int64, int64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if a := l.m[k.Budget][k.Key]; a != nil && a.window.Equal(k.Window) {
		a.expire(now.UnixNano())
		return a.spent, a.reserved, nil
	}
	return 0, 0, nil
}

func (l *ledger) Keys(_ context.Context, budget string, end time.Time) ([]string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var keys []string
	for k, a := range l.m[budget] {
		if a.window.Equal(end) {
			keys = append(keys, k)
		}
	}
	return keys, nil
}
