package relay

import (
	"context"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// roundTripRecover sends a budgetRequest through r and returns what
// RoundTrip panicked with, if it did.
func roundTripRecover(r *Router) (p any, err error) {
	defer func() { p = recover() }()
	var resp *http.Response
	resp, err = r.RoundTrip(budgetRequest(context.Background(), "m", ""))
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return nil, err
}

// TestHookPanicGivesBackWhatTheRequestHeld: a hook that panics during the
// attempt loop (OnAttempt, its done function, OnWait) makes RoundTrip
// panic with its value, as before, but only once the request has unwound
// as a cancelled one: its in-flight slot, its rate tokens and its budget
// hold are given back, and the next request goes. (The panic went out of
// RoundTrip at once: the upstream's only slot and the hold stayed taken
// for good, and every later request waited for the slot.)
func TestHookPanicGivesBackWhatTheRequestHeld(t *testing.T) {
	for _, hook := range []string{"OnAttempt", "done", "OnWait", "OnBreaker", "Scope"} {
		t.Run(hook, func(t *testing.T) {
			clock := newFakeClock()
			var armed atomic.Bool
			boom := func() {
				if armed.CompareAndSwap(true, false) {
					panic("boom from " + hook)
				}
			}
			var h Hooks
			switch hook {
			case "OnAttempt":
				h.OnAttempt = func(context.Context, AttemptInfo, *http.Request) func(AttemptDone) { boom(); return nil }
			case "done":
				h.OnAttempt = func(context.Context, AttemptInfo, *http.Request) func(AttemptDone) {
					return func(AttemptDone) { boom() }
				}
			case "OnWait":
				h.OnWait = func(WaitEvent) { boom() }
			case "OnBreaker":
				h.OnBreaker = func(BreakerEvent) { boom() }
			}
			budget := Budget{Name: "all", Limit: 1000, Window: Window{Every: time.Hour}}
			if hook == "Scope" {
				budget.Scope = func(Request, string, string) (string, bool) { boom(); return "", true }
			}
			base := &usageBase{prompt: 8, completion: 10}
			rpm := 0
			if hook == "OnWait" {
				rpm = 1 // the second request waits for a token
			}
			r, reps := newTestRouter(t, Config{Base: base, Prices: budgetPrices, Clock: clock, Hooks: h,
				Limits:    Limits{MaxWait: time.Hour},
				Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1", MaxInFlight: 1, RPM: rpm}},
				Budgets:   []Budget{budget}})
			u := r.ups[0]
			if hook == "OnWait" {
				_, err := roundTripRecover(r) // takes the minute's token
				require.NoError(t, err)
			}
			armed.Store(true)
			if hook == "OnBreaker" {
				// Open, its cooldown over: the request's admission moves it
				// to half-open, with the hook called there.
				openFor(r, u, clock.Now().Add(time.Second), clock.Now())
				clock.Advance(time.Second)
			}
			panicked := make(chan any, 1)
			go func() { p, _ := roundTripRecover(r); panicked <- p }()
			if hook == "OnWait" {
				require.Eventually(t, func() bool { return u.lim.turns.n.Load() == 1 }, 5*time.Second, time.Millisecond)
				clock.Advance(time.Minute)
			}
			assert.Equal(t, "boom from "+hook, <-panicked, "RoundTrip panics with the hook's value")
			sent := 1
			if hook == "OnWait" {
				sent = 2
			}
			require.Eventually(t, func() bool { return len(reps.all()) == sent }, 5*time.Second, time.Millisecond, "the request's report")
			assert.Zero(t, u.inflight.Load(), "in-flight count")
			assert.Zero(t, u.lim.slots.inUse(), "in-flight slots taken")
			all, _ := spendOf(r, "all", "")
			assert.Zero(t, all.Reserved, "budget held")
			calls := base.calls.Load()
			if hook == "OnWait" {
				clock.Advance(time.Minute)
			}
			done := make(chan error, 1)
			go func() { _, err := roundTripRecover(r); done <- err }()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(10 * time.Second):
				t.Fatal("the next request never got the slot")
			}
			assert.Equal(t, calls+1, base.calls.Load())
			if hook == "OnBreaker" {
				assert.Equal(t, StateClosed, stateOf(r, u, clock.Now()), "the breaker after the next request's success")
			}
		})
	}
}

// TestHookPanicInHedgeAttempt: with hedging on every attempt runs on a
// goroutine of its own, so a panic in OnAttempt there could not be
// recovered by the caller: the process died. It is caught, the hedge
// does not go out, the first attempt answers, and RoundTrip panics with
// the hook's value once both upstreams' slots are given back.
func TestHookPanicInHedgeAttempt(t *testing.T) {
	clock := newFakeClock()
	base := &usageBase{prompt: 8, completion: 10, gate: make(chan struct{})}
	var hedges atomic.Int32
	h := Hooks{OnAttempt: func(_ context.Context, a AttemptInfo, _ *http.Request) func(AttemptDone) {
		if a.Hedge {
			hedges.Add(1)
			panic("boom from a hedge")
		}
		return nil
	}}
	r, _ := newTestRouter(t, Config{Base: base, Prices: budgetPrices, Clock: clock, Hooks: h, Strategy: StrategyPriority,
		Hedge:     HedgeConfig{Delay: time.Second},
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1", MaxInFlight: 1}, {Name: "b", BaseURL: "http://b.test/v1", MaxInFlight: 1}}})
	panicked := make(chan any, 1)
	go func() { p, _ := roundTripRecover(r); panicked <- p }()
	require.Eventually(t, func() bool { return base.calls.Load() == 1 }, 5*time.Second, time.Millisecond)
	require.Eventually(t, func() bool {
		clock.Advance(time.Second) // the hedge delay, then its later looks
		return hedges.Load() > 0
	}, 5*time.Second, time.Millisecond)
	close(base.gate)
	assert.Equal(t, "boom from a hedge", <-panicked)
	assert.Equal(t, int64(1), base.calls.Load(), "the hedge went out")
	for _, u := range r.ups {
		assert.Zero(t, u.inflight.Load(), "%s: in-flight count", u.cfg.Name)
		assert.Zero(t, u.lim.slots.inUse(), "%s: in-flight slots taken", u.cfg.Name)
	}
}

// TestScopePanicAtSettlementSettlesTheRest: a budget's Scope that panics
// while the answer's end settles the request (RoundTrip has returned, so
// the panic goes to the caller's Read) no longer leaves the other budgets'
// holds to expire and the report unmade: every hold is settled, the other
// budget is charged, OnReport runs, and then the Read panics with the
// value. (Before, the panic left the request's holds in place and made no
// report.)
func TestScopePanicAtSettlementSettlesTheRest(t *testing.T) {
	var armed atomic.Bool
	panicky := Budget{Name: "panicky", Limit: 1000, Window: Window{Every: time.Hour},
		Scope: func(Request, string, string) (string, bool) {
			if armed.Load() {
				panic("boom from Scope")
			}
			return "", true
		}}
	other := Budget{Name: "other", Limit: 1000, Window: Window{Every: time.Hour}}
	r, reps := newTestRouter(t, Config{Base: &usageBase{prompt: 8, completion: 10}, Prices: budgetPrices, Clock: newFakeClock(),
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
		Budgets:   []Budget{panicky, other}})
	resp, err := r.RoundTrip(budgetRequest(context.Background(), "m", ""))
	require.NoError(t, err)
	held, _ := spendOf(r, "other", "")
	require.Positive(t, held.Reserved, "the request holds its worst case")
	armed.Store(true)
	p := func() (p any) {
		defer func() { p = recover() }()
		io.Copy(io.Discard, resp.Body)
		return nil
	}()
	assert.Equal(t, "boom from Scope", p, "the Read that ends the answer panics with the value")
	resp.Body.Close()
	require.Len(t, reps.all(), 1, "the report")
	assert.NoError(t, reps.all()[0].Err)
	o, _ := spendOf(r, "other", "")
	assert.Zero(t, o.Reserved, "the other budget's hold")
	assert.InDelta(t, 18.0, o.Spent, 1e-9, "the other budget is charged the answer's cost")
	pk, _ := spendOf(r, "panicky", "")
	assert.Zero(t, pk.Reserved, "the panicking budget's hold is given back")
}
