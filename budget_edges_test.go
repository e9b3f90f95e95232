package relay

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	_ "time/tzdata"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Edge cases of budgets: usage folding, windows across DST, per-upstream
// views, top-ups after a window rolls, caps, eviction and hedge losers.

// A Usage parsed from a response is what Price.Cost prices: with cached
// tokens reported outside prompt_tokens (cached > prompt) and a count at the
// cap, parseUsage clamps again after folding them in (it returned
// PromptTokens above the cap, which Cost re-clamped).
func TestParseUsageCapFolding(t *testing.T) {
	for _, body := range []string{
		`{"usage":{"prompt_tokens":1000,"completion_tokens":0,"prompt_tokens_details":{"cached_tokens":300000000}}}`,
		`{"usage":{"input_tokens":1000,"output_tokens":0,"cache_read_input_tokens":300000000}}`,
	} {
		u, ok := parseUsage([]byte(body))
		require.True(t, ok)
		p := Price{InputPerMTok: 1, CachedInputPerMTok: 0.5}
		want := (float64(u.PromptTokens-u.CachedTokens)*1 + float64(u.CachedTokens)*0.5) / 1e6
		assert.Equal(t, u, u.normalized(), "parsed usage is not a fixed point of normalisation: %+v", u)
		assert.Equal(t, want, p.Cost(u), "Cost disagrees with the formula on the Report's own Usage %+v", u)
	}
}

// Window.end is after t ("the end of the window that holds t") also in a
// zone whose DST starts at midnight (Chile: 24:00 -> 01:00), where
// time.Date gives the skipped midnight as 23:00 the day before.
func TestDayWindowEndAtMidnightDSTGap(t *testing.T) {
	scl, err := time.LoadLocation("America/Santiago")
	require.NoError(t, err)
	w := Window{Calendar: Day, Location: scl}
	// 2026-09-05 23:30 in Santiago (-04): the day ends at 01:00 -03 on the 6th = 04:00 UTC.
	now := time.Date(2026, 9, 6, 3, 30, 0, 0, time.UTC)
	end := w.end(now)
	assert.True(t, end.After(now), "window end %v (%v UTC) is not after now %v", end, end.UTC(), now)
	assert.Equal(t, time.Date(2026, 9, 6, 4, 0, 0, 0, time.UTC), end.UTC())

	// Through the router: Spend reports a window that ended before now.
	clock := newFakeClock()
	clock.now = now
	base := &usageBase{prompt: 8, completion: 10}
	r, _ := newTestRouter(t, Config{Base: base, Prices: budgetPrices, Clock: clock,
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
		Budgets:   []Budget{{Name: "daily", Limit: 1000, Window: w}}})
	resp, err := r.RoundTrip(budgetRequest(context.Background(), "m", ""))
	require.NoError(t, err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	s := r.Spend()
	require.Len(t, s, 1)
	assert.True(t, s[0].WindowEnd.After(now), "Spend().WindowEnd %v is before now %v", s[0].WindowEnd.UTC(), now)
}

// Request.Budget.Spent for a PerUpstream budget: the request can only go to
// upstream "a", whose ledger is 90% spent, and the policy is told so (it
// was told 0: the view keyed the scope by no upstream).
func TestBudgetViewPerUpstream(t *testing.T) {
	base := &usageBase{prompt: 8, completion: 10}
	var seen atomic.Value
	pol := PolicyFunc(func(q Request) Route {
		s, ok := q.Budget.Spent("up")
		seen.Store([2]any{s, ok})
		return Route{Model: q.Model}
	})
	r, _ := newTestRouter(t, Config{Base: base, Prices: budgetPrices, Policy: pol,
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
		Budgets:   []Budget{{Name: "up", Scope: PerUpstream(), Limit: 40, Window: Window{Every: time.Hour}}}})
	for range 2 {
		resp, err := r.RoundTrip(budgetRequest(context.Background(), "m", ""))
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	_, err := r.Decide(budgetRequest(context.Background(), "m", ""))
	require.NoError(t, err)
	sp := r.Spend()
	require.Len(t, sp, 1)
	assert.InDelta(t, 36, sp[0].Spent, 1e-9)
	got := seen.Load().([2]any)
	t.Logf("Spend: %+v; the policy saw Spent(\"up\") = %v, %v", sp[0], got[0], got[1])
	assert.InDelta(t, 0.9, got[0].(float64), 1e-9, "the request's ledger (upstream a) is 90%% spent")
}

// A retry's top-up after the hold's window ended: request 1 reserves $18
// at upstream a just before an hourly boundary and gets a 503; request 2,
// after the boundary, opens the new window; request 1's retry to b (price
// factor 2: $36) moves its hold to the new window and goes. (The top-up
// was made in the ended window, which the in-process ledger refused: b was
// never tried and the caller got the 503.)
func TestTopUpAfterWindowRollRefused(t *testing.T) {
	t.Run("control: same hour", func(t *testing.T) { reviewTopUp(t, time.Date(2026, 1, 2, 3, 30, 0, 0, time.UTC)) })
	t.Run("across the boundary", func(t *testing.T) { reviewTopUp(t, time.Date(2026, 1, 2, 3, 59, 59, 999_000_000, time.UTC)) })
}

func reviewTopUp(t *testing.T, start time.Time) {
	clock := newFakeClock()
	clock.now = start
	var aCalls, bCalls atomic.Int64
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		io.Copy(io.Discard, r.Body)
		status := 200
		if r.URL.Host == "a.test" {
			if aCalls.Add(1) == 1 {
				status = 503
			}
		} else {
			bCalls.Add(1)
		}
		body := `{"usage":{"prompt_tokens":8,"completion_tokens":10}}`
		if status != 200 {
			body = `{"error":{"message":"overloaded"}}`
		}
		return &http.Response{StatusCode: status, Header: http.Header{"Content-Type": {"application/json"}},
			Body: io.NopCloser(strings.NewReader(body))}, nil
	})
	r, reps := newTestRouter(t, Config{Base: base, Prices: budgetPrices, Clock: clock,
		Retry: RetryConfig{MaxAttempts: 2},
		Upstreams: []Upstream{
			{Name: "a", BaseURL: "http://a.test/v1", RPM: 1},
			{Name: "b", BaseURL: "http://b.test/v1", PriceFactor: 2},
		},
		Budgets: []Budget{{Name: "all", Limit: 1000, Window: Window{Every: time.Hour}}}})
	type result struct {
		resp *http.Response
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := r.RoundTrip(budgetRequest(context.Background(), "m", ""))
		done <- result{resp, err}
	}()
	d := <-clock.armed // request 1 got its 503 and backs off
	require.Greater(t, d, time.Millisecond)
	clock.Advance(time.Millisecond) // the new window begins; the backoff is not over
	resp2, err := r.RoundTrip(budgetRequest(context.Background(), "m", ""))
	require.NoError(t, err)
	io.Copy(io.Discard, resp2.Body)
	resp2.Body.Close()
	require.EqualValues(t, 1, bCalls.Load(), "request 2 went to b (a is at its RPM)")
	clock.Advance(d)
	res := <-done
	require.NoError(t, res.err)
	io.Copy(io.Discard, res.resp.Body)
	res.resp.Body.Close()
	rep := reps.all()[1]
	t.Logf("request 1: status %d, attempts %d, upstream %s, err %v; spend %+v", res.resp.StatusCode, rep.Attempts, rep.Upstream, rep.Err, r.Spend())
	assert.EqualValues(t, 2, bCalls.Load(), "request 1's retry should have gone to b: the budget has room")
	assert.Equal(t, 200, res.resp.StatusCode)
}

// TestBudgetLimitCappedInNanoUnits: budgets are kept in int64
// nano-units, so a Limit over maxBudgetLimit units (20 billion VND) is
// refused by New, with the way out in the message, instead of being capped
// silently (the ledger then wrapped and admitted a 5th 5-billion request);
// the same budget in thousands of VND works to the unit.
func TestBudgetLimitCappedInNanoUnits(t *testing.T) {
	base := &usageBase{prompt: 8, completion: 10}
	per := 200000.0 / 18 * 1e6 // $200,000 a request
	cfg := Config{Base: base, Currency: Currency{Code: "VND", PerUSD: 25000},
		Prices:    map[string]Price{"m": {InputPerMTok: per, OutputPerMTok: per}},
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
		Budgets:   []Budget{{Name: "vnd", Limit: 2e10, Window: Window{Calendar: Month}}}}
	_, err := New(cfg)
	require.ErrorContains(t, err, "larger unit")
	cfg.Currency = Currency{Code: "kVND", PerUSD: 25} // thousands of VND
	cfg.Budgets[0].Limit = 2e7
	r, _ := newTestRouter(t, cfg)
	for i := range 4 {
		resp, err := r.RoundTrip(budgetRequest(context.Background(), "m", ""))
		require.NoError(t, err, "request %d: 4 x 5e6 kVND fit a 2e7 kVND limit", i+1)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	_, err = r.RoundTrip(budgetRequest(context.Background(), "m", ""))
	assert.ErrorIs(t, err, ErrBudgetExceeded, "a 5th request exceeds the limit")
}

// The in-process ledger forgets the ledgers of ended windows that hold nothing
// (every PerHeader value ever seen kept an account, so a gateway whose
// callers set the header grew without bound).
func TestLocalLedgerNeverEvictsEndedKeys(t *testing.T) {
	clock := newFakeClock()
	base := &usageBase{prompt: 1, completion: 1}
	r, _ := newTestRouter(t, Config{Base: base, Prices: budgetPrices, Clock: clock,
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
		Budgets:   []Budget{{Name: "team", Scope: PerHeader("X-Relay-Budget"), Limit: 100, Window: Window{Every: time.Hour}}}})
	big := strings.Repeat("x", 64<<10)
	var ends []time.Time
	for hour := range 3 {
		ends = append(ends, clock.Now().Truncate(time.Hour).Add(time.Hour))
		for i := range 200 {
			resp, err := r.RoundTrip(budgetRequest(context.Background(), "m", big+strconv.Itoa(hour*1000+i)))
			require.NoError(t, err)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		clock.Advance(time.Hour)
	}
	n := 0
	for _, end := range ends {
		keys, err := r.ledger.Keys(context.Background(), "team", end)
		require.NoError(t, err)
		n += len(keys)
	}
	assert.Empty(t, r.Spend(), "no ledger in the current window")
	assert.LessOrEqual(t, n, 200, "accounts kept for windows that ended: %d (each keyed by a 64 KiB header value: %d MiB)", n, n*64/1024)
}

// PerUpstream budget, hedged request: the first attempt reserved $18 in
// upstream a's ledger, the hedge $18 in b's; both answered ($18 each, so each
// attempt cost exactly its reservation). Each cost goes to its own
// upstream's ledger (both went to the winner's: a $36 against a $20 limit).
func TestHedgeLoserChargedToWinnersLedger(t *testing.T) {
	reps := &reports{}
	r, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://127.0.0.1:1"}, {Name: "b", BaseURL: "http://127.0.0.1:1"}},
		Hedge: HedgeConfig{Delay: time.Second}, Prices: budgetPrices, OnReport: reps.add,
		Budgets: []Budget{{Name: "up", Scope: PerUpstream(), Limit: 20, Window: Window{Every: time.Hour}}}})
	require.NoError(t, err)
	tr := newTrip(r, httptest.NewRequest("POST", "/v1/chat/completions", nil))
	tr.c.req = Request{Endpoint: EndpointChat, Model: "m", PromptTokens: 8, MaxTokens: 10, Header: http.Header{}, Budget: noBudgets{}}
	tr.tokens = 18
	now := time.Now()
	ca, cb := candidate{up: r.ups[0], model: "m"}, candidate{up: r.ups[1], model: "m"}
	require.True(t, tr.reserve(context.Background(), &ca, now))
	require.True(t, tr.reserve(context.Background(), &cb, now), "the hedge reserves in b's ledger")
	mk := func(c candidate, n int) attempt {
		return attempt{cand: c, hedge: n, resp: &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
			Body: io.NopCloser(strings.NewReader(`{"usage":{"prompt_tokens":8,"completion_tokens":10}}`))}}
	}
	results := make(chan attempt, 2)
	results <- mk(ca, 0)
	results <- mk(cb, 1)
	win := tr.raceHedge(results, [2]context.CancelFunc{func() {}, func() {}})
	resp, err := tr.finalize(win)
	require.NoError(t, err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Eventually(t, func() bool { return len(reps.all()) == 1 }, 10*time.Second, time.Millisecond)
	rep := reps.all()[0]
	t.Logf("report: upstream %s cost %v hedge usage %+v; spend %+v", rep.Upstream, rep.Cost, rep.HedgeUsage, r.Spend())
	for _, s := range r.Spend() {
		assert.LessOrEqual(t, s.Spent, s.Limit, "ledger %q: settled spend over the limit", s.Key)
	}
}

// Concurrent requests while windows roll: per window, settled spend never
// exceeds the limit and nothing stays reserved once all are done.
func TestConcurrentSettleAndRoll(t *testing.T) {
	clock := newFakeClock()
	base := &usageBase{prompt: 8, completion: 10}
	r, _ := newTestRouter(t, Config{Base: base, Prices: budgetPrices, Clock: clock, Retry: RetryConfig{MaxAttempts: 1},
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
		Budgets:   []Budget{{Name: "w", Limit: 18 * 5, Window: Window{Every: time.Minute}}}})
	stop := make(chan struct{})
	var roll sync.WaitGroup
	roll.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				clock.Advance(7 * time.Second)
				time.Sleep(50 * time.Microsecond)
			}
		}
	})
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 200 {
				resp, err := r.RoundTrip(budgetRequest(context.Background(), "m", ""))
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				for _, s := range r.Spend() {
					if s.Spent > s.Limit+1e-9 || s.Reserved < 0 {
						t.Errorf("spend %+v", s)
					}
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	roll.Wait()
	for _, s := range r.Spend() {
		assert.Zero(t, s.Reserved)
	}
}

func TestSecondBudgetRefuses(t *testing.T) {
	base := &usageBase{prompt: 8, completion: 10}
	r, reps := newTestRouter(t, Config{Base: base, Prices: budgetPrices, Retry: RetryConfig{MaxAttempts: 1},
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
		Budgets: []Budget{{Name: "all", Limit: 1000, Window: Window{Every: time.Hour}},
			{Name: "team", Scope: PerHeader("X-Relay-Budget"), Limit: 10, Window: Window{Calendar: Month}, Downgrade: "cheap"},
			{Name: "tiny", Scope: PerModel("cheap"), Limit: 1, Window: Window{Calendar: Day}}}})
	_, err := r.RoundTrip(budgetRequest(context.Background(), "m", "t1"))
	require.ErrorIs(t, err, ErrBudgetExceeded)
	assert.Zero(t, base.calls.Load())
	rep := reps.all()[0]
	assert.Equal(t, "tiny", rep.Budget)
	assert.Zero(t, rep.Attempts)
	for _, s := range r.Spend() {
		assert.Zero(t, s.Reserved, "%+v", s)
		assert.Zero(t, s.Spent, "%+v", s)
	}
	t.Logf("%+v %+v", rep, r.Spend())
}

// TestForcedTryOverBudgetIsARefusal: when every circuit is open at
// admission (one opened while the request was routed), the router still
// tries the one that recovers first (a pool never runs empty); when that
// try does not fit the budget, it is a refusal, ErrBudgetExceeded, naming
// the budget. (It was ErrCircuitOpen, which the simulation's budget mode
// caught, once in about 20 runs, as a failure that was not a refusal.)
func TestForcedTryOverBudgetIsARefusal(t *testing.T) {
	clock := newFakeClock()
	r, err := New(Config{Clock: clock, Prices: budgetPrices,
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
		Budgets:   []Budget{{Name: "tight", Limit: 10, Window: Window{Every: time.Hour}}}})
	require.NoError(t, err)
	u := r.ups[0]
	openFor(r, u, clock.Now().Add(time.Minute), clock.Now()) // opened while the request was routed
	req := budgetRequest(context.Background(), "m", "")
	tr := newTrip(r, req)
	tr.c.req = Request{Endpoint: EndpointChat, Model: "m", PromptTokens: 100, Header: req.Header, Budget: noBudgets{}}
	adm := r.admissionOf(&tr.c)
	adm.trip, adm.mayWait = tr, true
	tr.tokens = adm.tokens
	_, err = r.forceSoonest([]candidate{{up: u, model: "m"}}, adm, clock.Now())
	require.ErrorIs(t, err, ErrBudgetExceeded)
	assert.Equal(t, "tight", tr.res.refused.Name)
}
