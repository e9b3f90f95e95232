// Package statetest holds a shared State that is down, for the tests of
// the router's observers (relayotel, relayprom), which see the router fall
// back to in-process state.
package statetest

import (
	"context"
	"errors"
	"time"

	"github.com/tokenrelay/relay"
)

// ErrStateDown is what every fleet call of a DownState fails with.
var ErrStateDown = errors.New("statetest: shared state down")

// DownState returns a relay.State whose every fleet call (Admit, Refund,
// Hold, Failure, Success, Open, Probe) fails with ErrStateDown, as when the
// Redis behind a shared State is down, so that a test can see the router
// decide in-process and tell Hooks.OnStateFallback. Budget spend is kept
// in an in-process ledger (relay.NewLocalLedger).
func DownState() relay.State { return downState{relay.NewLocalLedger()} }

type downState struct{ relay.Ledger }

func (downState) Admit(context.Context, relay.Limits, int, bool, time.Time) (relay.Verdict, error) {
	return relay.Verdict{}, ErrStateDown
}

func (downState) Refund(context.Context, relay.Limits, int, int, time.Time) error {
	return ErrStateDown
}

func (downState) Hold(context.Context, string, time.Time) error { return ErrStateDown }

func (downState) Failure(context.Context, string, relay.CircuitPolicy, time.Time) (time.Time, error) {
	return time.Time{}, ErrStateDown
}

func (downState) Success(context.Context, string, string) error { return ErrStateDown }
func (downState) Open(context.Context, string, time.Time) error { return ErrStateDown }

func (downState) Probe(context.Context, string, time.Duration) (string, error) {
	return "", ErrStateDown
}
