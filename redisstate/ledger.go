package redisstate

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tokenrelay/relay/store"
)

// The ledger keeps, per budget, scope key and window, one hash
// {relay:<prefix>:b:<budget>}:a:<window end, Unix ns>:<scope key> with
// fields s (spent), r (reserved) and h:<id> (each live hold's amount), a
// sorted set {...}:e:<window end>:<scope key> of the holds' ids scored by
// their deadlines (Unix ms), a sorted set {...}:x:<window end>:<scope
// key> of the holds settled in the last minute (store.SettledKeep), and
// per budget and window the set of its scope keys,
// {relay:<prefix>:b:<budget>}:k:<window end>. They live until
// WithBudgetRetention (24 hours) after the window ends. Amounts are int64
// nano-units, added by Redis (HINCRBY) and compared exactly; one hold is
// at most 2^53 (about 9 million in the billing currency). A hold past its
// deadline is ended by the next Reserve, Settle or Usage of its ledger (64
// at a time), by the time the caller gives.

// ledgerKeys returns the keys of k's ledger: account, keys of the window,
// expiry set, settled set.
func (s *State) ledgerKeys(k store.BudgetKey) (*budgetTag, []string) {
	b := s.budget(k.Budget)
	end := strconv.FormatInt(k.Window.UnixNano(), 10)
	return b, []string{b.tag + ":a:" + end + ":" + k.Key, b.tag + ":k:" + end, b.tag + ":e:" + end + ":" + k.Key, b.tag + ":x:" + end + ":" + k.Key}
}

// maxHold bounds one hold's amount: the scripts compute a top-up's
// difference in Lua numbers, exact to 2^53.
const maxHold = 1 << 53

var errAmount = errors.New("amount out of range")

// Reserve sets hold h.ID of k to h.Amount if spent + reserved stays within
// limit with it, atomically for the whole fleet: of the replicas that
// reserve at once, never two take the last of a budget. The hold counts
// until h.Expires, or until it is settled; a hold settled in the last
// minute is not made again. A negative amount, or one over 2^53, is an
// error.
func (s *State) Reserve(ctx context.Context, k store.BudgetKey, limit int64, h store.Hold, now time.Time) (store.Reservation, error) {
	if h.Amount < 0 || h.Amount > maxHold {
		return store.Reservation{}, fmt.Errorf("redisstate: reserve %s: %w %d", k.Budget, errAmount, h.Amount)
	}
	deadline := h.Expires.UnixMilli()
	if h.Expires.IsZero() {
		deadline = math.MaxInt64 >> 10
	}
	b, keys := s.ledgerKeys(k)
	r, err := s.eval(ctx, &b.ff, reserveScript, keys,
		limit, h.ID, h.Amount, deadline, now.UnixMilli(), ttl(k.Window, now, s.ledger), k.Key).Slice()
	if err != nil {
		return store.Reservation{}, wrap("reserve "+k.Budget, err)
	}
	if len(r) != 3 {
		return store.Reservation{}, fmt.Errorf("redisstate: reserve %s: unexpected reply %v", k.Budget, r)
	}
	ok, _ := r[0].(int64)
	spent, err1 := amount(r[1])
	reserved, err2 := amount(r[2])
	if err := errors.Join(err1, err2); err != nil {
		return store.Reservation{}, wrap("reserve "+k.Budget, err)
	}
	return store.Reservation{OK: ok == 1, Left: limit - spent - reserved}, nil
}

// amount parses an amount a script returned.
func amount(v any) (int64, error) {
	str, _ := v.(string)
	if str == "" {
		return 0, nil
	}
	return strconv.ParseInt(str, 10, 64)
}

// Settle ends hold id of k (nothing when there is none: never made,
// settled, or expired; none when id is "") and adds spent to its spend,
// atomically. A settlement for a window other than the current one lands
// in that window's ledger; it changes nothing in the current one.
func (s *State) Settle(ctx context.Context, k store.BudgetKey, id string, spent int64, now time.Time) error {
	if spent < 0 {
		return fmt.Errorf("redisstate: settle %s: %w %d", k.Budget, errAmount, spent)
	}
	b, keys := s.ledgerKeys(k)
	err := s.eval(ctx, &b.ff, settleScript, keys,
		id, spent, ttl(k.Window, now, s.ledger), k.Key, now.UnixMilli(), store.SettledKeep.Milliseconds()).Err()
	return wrap("settle "+k.Budget, err)
}

// Usage returns k's spend and what its live holds reserve (zero for a
// ledger never charged, or expired).
func (s *State) Usage(ctx context.Context, k store.BudgetKey, now time.Time) (spent, reserved int64, err error) {
	b, keys := s.ledgerKeys(k)
	v, err := s.eval(ctx, &b.ff, usageScript, keys, now.UnixMilli()).Slice()
	if err != nil {
		return 0, 0, wrap("usage "+k.Budget, err)
	}
	var out [2]int64
	for i := range min(len(v), 2) {
		if out[i], err = amount(v[i]); err != nil {
			return 0, 0, wrap("usage "+k.Budget, err)
		}
	}
	return out[0], out[1], nil
}

// Keys returns the scope keys budget has ledgers for in the window ending
// at end.
func (s *State) Keys(ctx context.Context, budget string, end time.Time) ([]string, error) {
	b, keys := s.ledgerKeys(store.BudgetKey{Budget: budget, Window: end})
	v, err := s.do(ctx, &b.ff, "smembers", keys[1]).StringSlice()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, wrap("keys "+budget, err)
	}
	return v, nil
}
