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
// fields s (spent) and r (reserved), and per budget and window the set of
// its scope keys, {relay:<prefix>:b:<budget>}:k:<window end>. Both live
// until WithBudgetRetention (24 hours) after the window ends. Amounts are
// int64 nano-units, added by Redis (HINCRBY) and compared exactly.

func (s *State) account(k relay.BudgetKey) (account, set string) {
	tag := s.budgetTag(k.Budget)
	end := strconv.FormatInt(k.Window.UnixNano(), 10)
	return tag + ":a:" + end + ":" + k.Key, tag + ":k:" + end
}

var errNegative = errors.New("negative amount")

// Reserve adds amount to k's reservations if spent + reserved + amount
// stays within limit, atomically for the whole fleet: of the replicas
// that reserve at once, never two take the last of a budget. A negative
// amount is an error.
func (s *State) Reserve(ctx context.Context, k relay.BudgetKey, limit, amount int64) (bool, error) {
	if amount < 0 {
		return false, fmt.Errorf("redisstate: reserve %s: %w %d", k.Budget, errNegative, amount)
	}
	if limit < amount {
		return false, nil
	}
	acc, set := s.account(k)
	n, err := s.eval(ctx, reserveScript, []string{acc, set},
		limit, amount, s.ttl(k.Window, s.ledger), k.Key).Int64()
	if err != nil {
		return false, wrap("reserve "+k.Budget, err)
	}
	return n == 1, nil
}

// Settle removes reserved from k's reservations (not below zero) and adds
// spent to its spend, atomically. A settlement for a window other than
// the current one lands in that window's ledger (the in-process ledger
// drops it); it changes nothing in the current one.
func (s *State) Settle(ctx context.Context, k relay.BudgetKey, reserved, spent int64) error {
	if reserved < 0 || spent < 0 {
		return fmt.Errorf("redisstate: settle %s: %w", k.Budget, errNegative)
	}
	acc, set := s.account(k)
	var minus any = 0
	if reserved > 0 {
		minus = "-" + strconv.FormatInt(reserved, 10)
	}
	err := s.eval(ctx, settleScript, []string{acc, set},
		minus, spent, s.ttl(k.Window, s.ledger), k.Key).Err()
	return wrap("settle "+k.Budget, err)
}

// Usage returns k's spend and reservations (zero for a ledger never
// charged, or expired).
func (s *State) Usage(ctx context.Context, k relay.BudgetKey) (spent, reserved int64, err error) {
	acc, _ := s.account(k)
	v, err := s.do(ctx, "hmget", acc, "s", "r").Slice()
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
