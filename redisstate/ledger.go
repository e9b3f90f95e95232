package redisstate

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tokenrelay/relay"
)

// The ledger keeps, per budget, scope key and window, one hash
// {relay:<prefix>:b:<budget>}:a:<window end, Unix ns>:<scope key> with
// fields s (spent), r (reserved) and h:<id> (each live hold's amount), a
// sorted set {...}:e:<window end>:<scope key> of the holds' ids scored by
// their deadlines (Unix ms), and per budget and window the set of its
// scope keys, {relay:<prefix>:b:<budget>}:k:<window end>. They live until
// WithBudgetRetention (24 hours) after the window ends. Amounts are int64
// nano-units, added by Redis (HINCRBY) and compared exactly; one hold is
// at most 2^53 (about 9 million in the billing currency). A hold past its
// deadline is ended by the next Reserve or Usage of its ledger (64 at a
// time), by the State's clock.

func (s *State) account(k relay.BudgetKey) (account, set string) {
	tag := s.budgetTag(k.Budget)
	end := strconv.FormatInt(k.Window.UnixNano(), 10)
	return tag + ":a:" + end + ":" + k.Key, tag + ":k:" + end
}

// expiries is the key of k's set of hold deadlines.
func (s *State) expiries(k relay.BudgetKey) string {
	return s.budgetTag(k.Budget) + ":e:" + strconv.FormatInt(k.Window.UnixNano(), 10) + ":" + k.Key
}

var errNegative = errors.New("negative amount")

// maxHold bounds one hold's amount: the scripts compute a top-up's
// difference in Lua numbers, exact to 2^53.
const maxHold = 1 << 53

// Reserve sets hold h.ID of k to h.Amount if spent + reserved stays within
// limit with it, atomically for the whole fleet: of the replicas that
// reserve at once, never two take the last of a budget. The hold counts
// until h.Expires (by the State's clock), or until it is settled. A
// negative amount, or one over 2^53, is an error.
func (s *State) Reserve(ctx context.Context, k relay.BudgetKey, limit int64, h relay.Hold) (bool, error) {
	if h.Amount < 0 || h.Amount > maxHold {
		return false, fmt.Errorf("redisstate: reserve %s: %w %d", k.Budget, errAmount, h.Amount)
	}
	if limit < h.Amount {
		return false, nil
	}
	acc, set := s.account(k)
	n, err := s.eval(ctx, reserveScript, []string{acc, set, s.expiries(k)},
		limit, h.ID, h.Amount, h.Expires.UnixMilli(), s.clock().UnixMilli(), s.ttl(k.Window, s.ledger), k.Key).Int64()
	if err != nil {
		return false, wrap("reserve "+k.Budget, err)
	}
	return n == 1, nil
}

var errAmount = errors.New("amount out of range")

// Settle ends hold id of k (nothing when there is none: never made,
// settled, or expired) and adds spent to its spend, atomically. A
// settlement for a window other than the current one lands in that
// window's ledger (the in-process ledger drops it); it changes nothing in
// the current one.
func (s *State) Settle(ctx context.Context, k relay.BudgetKey, id string, spent int64) error {
	if spent < 0 {
		return fmt.Errorf("redisstate: settle %s: %w", k.Budget, errNegative)
	}
	acc, set := s.account(k)
	err := s.eval(ctx, settleScript, []string{acc, set, s.expiries(k)},
		id, spent, s.ttl(k.Window, s.ledger), k.Key).Err()
	return wrap("settle "+k.Budget, err)
}

// Usage returns k's spend and what its live holds reserve (zero for a
// ledger never charged, or expired).
func (s *State) Usage(ctx context.Context, k relay.BudgetKey) (spent, reserved int64, err error) {
	acc, set := s.account(k)
	v, err := s.eval(ctx, usageScript, []string{acc, set, s.expiries(k)}, s.clock().UnixMilli()).Slice()
	if err != nil {
		return 0, 0, wrap("usage "+k.Budget, err)
	}
	var out [2]int64
	for i := range min(len(v), 2) {
		str, ok := v[i].(string)
		if !ok {
			continue // nil: no such field
		}
		if out[i], err = strconv.ParseInt(str, 10, 64); err != nil {
			return 0, 0, wrap("usage "+k.Budget, err)
		}
	}
	return out[0], out[1], nil
}

// Keys returns the scope keys budget has ledgers for in the window ending
// at end.
func (s *State) Keys(ctx context.Context, budget string, end time.Time) ([]string, error) {
	_, set := s.account(relay.BudgetKey{Budget: budget, Window: end})
	v, err := s.do(ctx, "smembers", set).StringSlice()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, wrap("keys "+budget, err)
	}
	return v, nil
}
