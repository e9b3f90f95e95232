package relay

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay/store"
)

// TestDowngradeChecksContextWindow: a budget's Downgrade model is tried
// before a refusal only if the request fits its context window (a request
// is never sent to a model whose window it cannot fit). Here the downgrade
// model takes 2 prompt tokens and the request has more: it is refused,
// not sent to "tiny" (it was).
func TestDowngradeChecksContextWindow(t *testing.T) {
	base := &usageBase{prompt: 8, completion: 10}
	prices := map[string]Price{
		"m":    {InputPerMTok: 1e6, OutputPerMTok: 1e6},
		"tiny": {InputPerMTok: 1, OutputPerMTok: 1, MaxInputTokens: 2},
	}
	r, reps := newTestRouter(t, Config{Base: base, Prices: prices, Retry: RetryConfig{MaxAttempts: 1},
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
		Budgets:   []Budget{{Name: "all", Limit: 5, Window: Window{Every: time.Hour}, Downgrade: "tiny"}}})
	resp, err := r.RoundTrip(budgetRequest(context.Background(), "m", ""))
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	rep := reps.all()[0]
	require.Greater(t, rep.PromptTokens, 2)
	assert.Zero(t, base.asked("tiny"), "a request of %d prompt tokens was sent to a model whose window takes 2", rep.PromptTokens)
	assert.ErrorIs(t, err, ErrBudgetExceeded)
}

// openingState is a memState that opens upstream "a" for the fleet (as
// another replica would) the first time "a" is asked for at or after at.
type openingState struct {
	*memState
	at     time.Time
	opened bool
}

func (s *openingState) Admit(ctx context.Context, u store.Limits, a store.Ask, now time.Time) (store.Verdict, error) {
	if u.Name == "a" && !s.at.IsZero() && !now.Before(s.at) && !s.opened {
		s.opened = true
		s.memState.Open(ctx, "a", now.Add(time.Hour), now)
	}
	return s.memState.Admit(ctx, u, a, now)
}

// TestFleetOpenedRescanKeepsMaxWait: a request waits the whole of
// MaxWait (30 s) for a's tokens; when they are due, a is found open for the
// fleet, and the request scans again with what is left of the wait, which
// is nothing: it is ErrRateLimited. (The rescan took a.maxWait == 0 as
// "all of it" and waited another 30 s for b: twice MaxWait.)
func TestFleetOpenedRescanKeepsMaxWait(t *testing.T) {
	clock := newAutoClock()
	st := &openingState{memState: newMemState()}
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		io.Copy(io.Discard, r.Body)
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody}, nil
	})
	r, _ := newTestRouter(t, Config{Base: base, Clock: clock, State: st, StateTimeout: time.Second,
		Limits: Limits{MaxWait: 30 * time.Second},
		Upstreams: []Upstream{
			{Name: "a", BaseURL: "http://a.test/v1", RPM: 2}, // a token every 30 s
			{Name: "b", BaseURL: "http://b.test/v1", RPM: 1}, // a token every 60 s
		}})
	for range 3 { // a's two tokens and b's one
		_, _, err := send(t, r, chatBody("gpt-4.1", "x"))
		require.NoError(t, err)
	}
	require.Empty(t, clock.Waits())
	start := clock.Now()
	st.at = start.Add(30 * time.Second) // a opens for the fleet just as its token is due
	_, _, err := send(t, r, chatBody("gpt-4.1", "x"))
	waited := clock.Now().Sub(start)
	t.Logf("err %v after %v (waits %v)", err, waited, clock.Waits())
	require.True(t, st.opened)
	assert.LessOrEqual(t, waited, 30*time.Second, "the request waited past MaxWait")
	assert.ErrorIs(t, err, ErrRateLimited)
}

// usageJSON answers every call at once with the given usage.
func usageJSON(prompt, completion int) roundTripFunc {
	return func(r *http.Request) (*http.Response, error) {
		io.Copy(io.Discard, r.Body)
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
			Body: io.NopCloser(strings.NewReader(fmt.Sprintf(`{"usage":{"prompt_tokens":%d,"completion_tokens":%d}}`, prompt, completion)))}, nil
	}
}

func maxTokensBody(model string, maxTokens int) string {
	return fmt.Sprintf(`{"model":%q,"max_tokens":%d,"messages":[{"role":"user","content":"hi"}]}`, model, maxTokens)
}

// TestSettledTPMWakesRateQueue: the part of a TPM charge a request did
// not use goes back to the bucket when its report is made (settleTPM), and
// the request waiting at the head of the rate queue gets it at once, as
// every other refund's does (TestRefundDoesNotWakeRateQueue). (It
// waited for its timer, ~10 s here, with its tokens in the bucket.)
func TestSettledTPMWakesRateQueue(t *testing.T) {
	clock := newFakeClock()
	r, _ := newTestRouter(t, Config{Base: usageJSON(1, 1), Clock: clock,
		Limits:    Limits{MaxWait: time.Minute},
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1", TPM: 6000}}})
	u := r.ups[0]
	req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(maxTokensBody("gpt-4.1", 5000)))
	respA, err := r.RoundTrip(req) // takes ~5008 of 6000 tokens; its body is not read yet
	require.NoError(t, err)
	b := goSend(r, context.Background(), "") // charges 1024+: waits for ~10 s of refill
	require.Eventually(t, func() bool { return u.lim.turns.n.Load() == 1 }, 5*time.Second, time.Millisecond)
	io.Copy(io.Discard, respA.Body)
	respA.Body.Close() // A used 2 tokens: ~5006 go back, and B's are there now
	assert.Eventually(t, func() bool { return u.lim.turns.n.Load() == 0 }, 5*time.Second, time.Millisecond,
		"B still waits for its timer with its tokens in the bucket (the clock does not move)")
	clock.Advance(time.Minute)
	require.NoError(t, <-b)
}

// slowSettleLedger is a shared Ledger whose first Settle takes 10 s (a
// slow round trip), during which the router serves another request.
type slowSettleLedger struct {
	store.Ledger
	clock  *fakeClock
	during func()
	done   bool
}

func (l *slowSettleLedger) Settle(ctx context.Context, k store.BudgetKey, id string, spent int64, now time.Time) error {
	err := l.Ledger.Settle(ctx, k, id, spent, now)
	if !l.done {
		l.done = true
		l.clock.Advance(10 * time.Second)
		l.during()
	}
	return err
}

// staleTimeRig is a router on clock with ledger led, one upstream of TPM
// 6000 (100 tokens/s) and a budget, and run, which sends a request of up to
// 2000 output tokens that uses 1501.
func staleTimeRig(t *testing.T, clock *fakeClock, led store.Ledger) (*Router, *reports, func()) {
	r, reps := newTestRouter(t, Config{Base: usageJSON(1, 1500), Clock: clock, Ledger: led,
		Prices:    budgetPrices,
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1", TPM: 6000}},
		Budgets:   []Budget{{Name: "all", Limit: 1e6, Window: Window{Every: 24 * time.Hour}}}})
	return r, reps, func() {
		_, _, err := send(t, r, maxTokensBody("m", 2000))
		require.NoError(t, err)
	}
}

// tpmBacklog returns the backlog of the TPM bucket of upstream "a" (6000
// a minute) in st at now.
func tpmBacklog(t *testing.T, st store.State, now time.Time) time.Duration {
	t.Helper()
	v, err := st.Admit(context.Background(), store.Limits{Name: "a", TPM: 6000}, store.Ask{Tokens: 6000}, now)
	require.NoError(t, err)
	if v.Taken {
		return 0
	}
	return v.Tokens
}

// TestSettleTPMAtCurrentTime: settleTPM gives back a request's unused
// TPM tokens at the time its body ended, and the limits were changed at a
// later time in between (the report waited for a slow ledger here; for a
// hedge's losing body, up to 5 s): the refund does not count the
// interval's refill twice. (x/time/rate moved its last-update time back
// and minted 1000 tokens; the store's buckets are GCRA, whose refunds move
// a bucket's time back only by the tokens given.)
func TestSettleTPMAtCurrentTime(t *testing.T) {
	clock := newFakeClock()
	led := &slowSettleLedger{Ledger: store.NewLocal(), clock: clock}
	r, reps, run := staleTimeRig(t, clock, led)
	t0 := clock.Now()
	led.during = run // request B, 10 s later, while A's report waits for the ledger
	run()            // request A
	t1 := clock.Now()
	require.Equal(t, 10*time.Second, t1.Sub(t0))
	reps2 := reps.all()
	require.Len(t, reps2, 2)
	// The same operations, each refund at the time it is made.
	ref := store.NewLocal()
	lim := store.Limits{Name: "a", TPM: 6000}
	charge := reps2[0].PromptTokens + 2000
	used := 1 + 1500
	ctx := context.Background()
	ref.Admit(ctx, lim, store.Ask{Tokens: charge}, t0) // A
	ref.Admit(ctx, lim, store.Ask{Tokens: charge}, t1) // B
	ref.Refund(ctx, lim, 0, charge-used, t1)           // B's settlement
	ref.Refund(ctx, lim, 0, charge-used, t1)           // A's settlement, made now
	want, got := tpmBacklog(t, ref, t1), tpmBacklog(t, r.st, t1)
	t.Logf("TPM backlog at t1: want %s, got %s", want, got)
	assert.Equal(t, want, got, "tokens minted by a refund dated before the limits' last use")
}

// TestOnSpendPanicSettlesEveryHold: the request is covered by two
// budgets and Hooks.OnSpend panics on the first one's charge (the panic
// goes on to whoever closed the body, as documented). Every hold is still
// settled, the TPM too, and OnReport runs: the hooks are called once all
// is given back. (Settlement stopped half-way: the second budget's hold
// was never released.)
func TestOnSpendPanicSettlesEveryHold(t *testing.T) {
	base := &usageBase{prompt: 8, completion: 5}
	r, reps := newTestRouter(t, Config{Base: base, Prices: budgetPrices,
		Hooks: Hooks{OnSpend: func(e SpendEvent) {
			if e.Budget == "first" {
				panic("observer bug")
			}
		}},
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
		Budgets: []Budget{
			{Name: "first", Limit: 1000, Window: Window{Every: time.Hour}},
			{Name: "second", Limit: 1000, Window: Window{Every: time.Hour}},
		}})
	resp, err := r.RoundTrip(budgetRequest(context.Background(), "m", ""))
	require.NoError(t, err)
	func() {
		defer func() { require.NotNil(t, recover(), "OnSpend's panic goes on to the reader that finished the body") }()
		io.Copy(io.Discard, resp.Body)
	}()
	resp.Body.Close()
	for _, s := range r.Spend() {
		assert.Zero(t, s.Reserved, "budget %s still holds the request's $18 after it ended", s.Budget)
		assert.InDelta(t, 13, s.Spent, 1e-9, "budget %s", s.Budget)
	}
	assert.Len(t, reps.all(), 1, "no report")
}

// TestDayWindowRepeatedMidnight: where DST ends at 01:00 -> 00:00 (Gaza,
// 2021-10-29), the day begins at the first 00:00 (21:00 UTC), and Window.end
// and the cached windowEnd agree on it. (dayStart returned the second
// 00:00: the 28th's window ran an hour into the 29th.)
func TestDayWindowRepeatedMidnight(t *testing.T) {
	gaza, err := time.LoadLocation("Asia/Gaza")
	require.NoError(t, err)
	w := Window{Calendar: Day, Location: gaza}
	before := time.Date(2021, 10, 28, 20, 59, 0, 0, time.UTC) // 23:59 EEST on the 28th
	at := time.Date(2021, 10, 28, 21, 5, 0, 0, time.UTC)      // 00:05 EEST on the 29th
	require.Equal(t, 29, at.In(gaza).Day())
	assert.Equal(t, at.Add(-5*time.Minute), w.end(before).UTC(), "the 28th ends at the 29th's first instant")
	b := &budgetSettings{Budget: Budget{Window: w}}
	b.windowEnd(before)
	assert.Equal(t, w.end(at), b.windowEnd(at), "the same instant, another window")
}

// slowReserveLedger is a shared Ledger whose first Reserve takes 10 s,
// during which the router serves another request.
type slowReserveLedger struct {
	store.Ledger
	clock  *fakeClock
	during func()
	done   bool
}

func (l *slowReserveLedger) Reserve(ctx context.Context, k store.BudgetKey, limit int64, h store.Hold, now time.Time) (store.Reservation, error) {
	if !l.done {
		l.done = true
		l.clock.Advance(10 * time.Second)
		l.during()
	}
	return l.Ledger.Reserve(ctx, k, limit, h, now)
}

// TestAdmissionTakesAtCurrentTime: the same at admission: with a shared
// ledger, scan reads the clock, reserves the budget (a round trip) and then
// takes the TPM tokens at the time read before it, while another request
// took tokens at a later time; the limits give no tokens for it (x/time/rate
// minted 1000).
func TestAdmissionTakesAtCurrentTime(t *testing.T) {
	clock := newFakeClock()
	led := &slowReserveLedger{Ledger: store.NewLocal(), clock: clock}
	r, reps, run := staleTimeRig(t, clock, led)
	t0 := clock.Now()
	led.during = run // request B, while A's reservation is on its way
	run()            // request A
	t1 := clock.Now()
	require.Equal(t, 10*time.Second, t1.Sub(t0))
	all := reps.all()
	require.Len(t, all, 2)
	charge, used := all[0].PromptTokens+2000, 1+1500
	ref := store.NewLocal()
	lim := store.Limits{Name: "a", TPM: 6000}
	ctx := context.Background()
	ref.Admit(ctx, lim, store.Ask{Tokens: charge}, t1) // B
	ref.Refund(ctx, lim, 0, charge-used, t1)           // B's settlement
	ref.Admit(ctx, lim, store.Ask{Tokens: charge}, t1) // A, admitted now
	ref.Refund(ctx, lim, 0, charge-used, t1)           // A's settlement
	want, got := tpmBacklog(t, ref, t1), tpmBacklog(t, r.st, t1)
	t.Logf("TPM backlog at t1: want %s, got %s", want, got)
	assert.LessOrEqual(t, got, want+10*time.Second, "at most A's 10 s earlier take")
	assert.GreaterOrEqual(t, got, want, "tokens minted by a take dated before the limits' last use")
}

// TestChoicesInWorstCase: a chat request with "n": 2 may be billed two
// completions of max_tokens each, and its reservation counts both ($28,
// where one completion's worst case is $18): two such requests in flight
// do not both fit a $40 budget, and the settled spend stays within it.
// (The reservation counted one: both were admitted and settled $56.)
func TestChoicesInWorstCase(t *testing.T) {
	base := &usageBase{gate: make(chan struct{}), prompt: 8, completion: 20} // two choices of 10
	r, reps := newTestRouter(t, Config{Base: base, Prices: budgetPrices, Retry: RetryConfig{MaxAttempts: 1},
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
		Budgets:   []Budget{{Name: "cap", Limit: 40, Window: Window{Every: time.Hour}}}})
	body := `{"model":"m","n":2,"max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(body))
			resp, err := r.RoundTrip(req)
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			errs <- err
		}()
	}
	// Both are admitted or one is refused; wait until that is decided.
	require.Eventually(t, func() bool { return base.calls.Load()+int64(len(reps.all())) == 2 }, 5*time.Second, time.Millisecond)
	close(base.gate)
	<-errs
	<-errs
	spend := r.Spend()
	require.Len(t, spend, 1)
	t.Logf("calls %d, spend %+v", base.calls.Load(), spend[0])
	assert.LessOrEqual(t, spend[0].Spent, 40.0, "settled spend over the limit with every request within its max_tokens")
}
