// Package statetest holds stores for tests of the router's side of a
// shared store: a store.State that can be switched down, as when the
// Redis behind a shared State is down, so that a test sees the router
// decide from its local share and tell Hooks.OnStateFallback.
package statetest

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/tokenrelay/relay/store"
)

// ErrStateDown is what every call of a Switch fails with while it is down.
var ErrStateDown = errors.New("statetest: shared state down")

// Switch is a store.State that several routers share, as replicas share
// one on Redis: State (a store.Local when made by NewSwitch) decides,
// except while Down is set: then every call fails with ErrStateDown.
// Admits counts the admissions that reached State.
type Switch struct {
	store.State
	Down   atomic.Bool
	Admits atomic.Int64
}

// NewSwitch returns a Switch, up, on an in-process store.
func NewSwitch() *Switch { return &Switch{State: store.NewLocal()} }

// DownState returns a Switch that is down.
func DownState() *Switch {
	s := NewSwitch()
	s.Down.Store(true)
	return s
}

func (s *Switch) err() error {
	if s.Down.Load() {
		return ErrStateDown
	}
	return nil
}

func (s *Switch) Admit(ctx context.Context, u store.Limits, a store.Ask, now time.Time) (store.Verdict, error) {
	if err := s.err(); err != nil {
		return store.Verdict{}, err
	}
	s.Admits.Add(1)
	return s.State.Admit(ctx, u, a, now)
}

func (s *Switch) Refund(ctx context.Context, u store.Limits, requests, tokens int, now time.Time) error {
	if err := s.err(); err != nil {
		return err
	}
	return s.State.Refund(ctx, u, requests, tokens, now)
}

func (s *Switch) Hold(ctx context.Context, upstream string, until, now time.Time) error {
	if err := s.err(); err != nil {
		return err
	}
	return s.State.Hold(ctx, upstream, until, now)
}

func (s *Switch) Outcome(ctx context.Context, upstream string, p store.CircuitPolicy, o store.Outcome, now time.Time) (store.Change, error) {
	if err := s.err(); err != nil {
		return store.Change{}, err
	}
	return s.State.Outcome(ctx, upstream, p, o, now)
}

func (s *Switch) Open(ctx context.Context, upstream string, until, now time.Time) error {
	if err := s.err(); err != nil {
		return err
	}
	return s.State.Open(ctx, upstream, until, now)
}

func (s *Switch) Reserve(ctx context.Context, k store.BudgetKey, limit int64, h store.Hold, now time.Time) (store.Reservation, error) {
	if err := s.err(); err != nil {
		return store.Reservation{}, err
	}
	return s.State.Reserve(ctx, k, limit, h, now)
}

func (s *Switch) Settle(ctx context.Context, k store.BudgetKey, id string, spent int64, now time.Time) error {
	if err := s.err(); err != nil {
		return err
	}
	return s.State.Settle(ctx, k, id, spent, now)
}

func (s *Switch) Usage(ctx context.Context, k store.BudgetKey, now time.Time) (int64, int64, error) {
	if err := s.err(); err != nil {
		return 0, 0, err
	}
	return s.State.Usage(ctx, k, now)
}

func (s *Switch) Keys(ctx context.Context, budget string, end time.Time) ([]string, error) {
	if err := s.err(); err != nil {
		return nil, err
	}
	return s.State.Keys(ctx, budget, end)
}
