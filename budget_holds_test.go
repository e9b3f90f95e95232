package relay

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// spendOf returns the Spend row of budget name and key, if any.
func spendOf(r *Router, name, key string) (BudgetSpend, bool) {
	for _, s := range r.Spend() {
		if s.Budget == name && s.Key == key {
			return s, true
		}
	}
	return BudgetSpend{}, false
}

// sendBudgeted sends a budgetRequest for model m and reads its answer, on
// a goroutine of its own.
func sendBudgeted(r *Router) <-chan error {
	done := make(chan error, 1)
	go func() {
		resp, err := r.RoundTrip(budgetRequest(context.Background(), "m", ""))
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	return done
}

// TestPassedOverCandidateHoldsNothing: a request is reserved against a
// candidate's budget ledgers before its rate limits are looked at. When
// the admission step passes that candidate over (here: upstream a has
// spent its RPM) and the request goes to b, a's PerUpstream ledger gives
// the hold back at once. (It kept $18 reserved until the request ended,
// and refused requests to a meanwhile.)
func TestPassedOverCandidateHoldsNothing(t *testing.T) {
	clock := newFakeClock()
	base := &usageBase{prompt: 8, completion: 10}
	r, _ := newTestRouter(t, Config{Base: base, Prices: budgetPrices, Clock: clock, Strategy: StrategyPriority,
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1", RPM: 1}, {Name: "b", BaseURL: "http://b.test/v1"}},
		Budgets:   []Budget{{Name: "up", Scope: PerUpstream(), Limit: 40, Window: Window{Every: time.Hour}}}})

	// The first request takes a's only request of the minute.
	resp, err := r.RoundTrip(budgetRequest(context.Background(), "m", ""))
	require.NoError(t, err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	a, ok := spendOf(r, "up", "a")
	require.True(t, ok)
	require.InDelta(t, 18, a.Spent, 1e-9, "the first request went to a")

	// The second passes a over (no RPM left) and waits at b.
	base.gate = make(chan struct{})
	done := sendBudgeted(r)
	require.Eventually(t, func() bool { return base.calls.Load() == 2 }, 5*time.Second, time.Millisecond)
	a, _ = spendOf(r, "up", "a")
	b, ok := spendOf(r, "up", "b")
	require.True(t, ok)
	assert.InDelta(t, 18, b.Reserved, 1e-9, "b holds the request in flight there")
	assert.Zero(t, a.Reserved, "a holds a reservation for a request that went to b")
	close(base.gate)
	require.NoError(t, <-done)
	a, _ = spendOf(r, "up", "a")
	b, _ = spendOf(r, "up", "b")
	assert.InDelta(t, 18, a.Spent, 1e-9)
	assert.InDelta(t, 18, b.Spent, 1e-9)
	assert.Zero(t, a.Reserved+b.Reserved, "nothing held once every request ended")
}

// TestPassedOverDearerCandidateHoldLowered: a budget that covers both the
// candidate passed over and the one picked keeps the picked one's worst
// case, not the larger one the scan reserved first. Upstream a (price
// factor 2: $36) has spent its RPM; the request goes to b ($18), and the
// AllTraffic ledger holds $18 while it is in flight. (It held $36 until
// the request ended.)
func TestPassedOverDearerCandidateHoldLowered(t *testing.T) {
	clock := newFakeClock()
	base := &usageBase{prompt: 8, completion: 10}
	r, _ := newTestRouter(t, Config{Base: base, Prices: budgetPrices, Clock: clock, Strategy: StrategyPriority,
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1", RPM: 1, PriceFactor: 2}, {Name: "b", BaseURL: "http://b.test/v1"}},
		Budgets:   []Budget{{Name: "all", Limit: 1000, Window: Window{Every: time.Hour}}}})
	require.NoError(t, <-sendBudgeted(r)) // takes a's only request of the minute: $36
	all, ok := spendOf(r, "all", "")
	require.True(t, ok)
	require.InDelta(t, 36, all.Spent, 1e-9)

	base.gate = make(chan struct{})
	done := sendBudgeted(r)
	require.Eventually(t, func() bool { return base.calls.Load() == 2 }, 5*time.Second, time.Millisecond)
	all, _ = spendOf(r, "all", "")
	assert.InDelta(t, 18, all.Reserved, 1e-9, "the request in flight at b holds b's worst case")
	close(base.gate)
	require.NoError(t, <-done)
	all, _ = spendOf(r, "all", "")
	assert.InDelta(t, 54, all.Spent, 1e-9)
	assert.Zero(t, all.Reserved)
}
