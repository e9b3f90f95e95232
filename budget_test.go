package relay

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay/store"
)

// budgetPrices makes every token of "m" cost $1 (and of "cheap" 10¢), so
// costs are easy to read.
var budgetPrices = map[string]Price{
	"m":     {InputPerMTok: 1e6, OutputPerMTok: 1e6},
	"cheap": {InputPerMTok: 1e5, OutputPerMTok: 1e5},
}

// usageBase is an in-memory upstream that answers with the given usage,
// after gate (when not nil) is closed, and counts its calls.
type usageBase struct {
	calls      atomic.Int64
	gate       chan struct{}
	prompt     int
	completion int
	models     sync.Map // model asked -> count
}

func (b *usageBase) RoundTrip(r *http.Request) (*http.Response, error) {
	b.calls.Add(1)
	body, _ := io.ReadAll(r.Body)
	model := string(jsonField(body, "model"))
	n, _ := b.models.LoadOrStore(model, new(atomic.Int64))
	n.(*atomic.Int64).Add(1)
	if b.gate != nil {
		select {
		case <-b.gate:
		case <-r.Context().Done():
			return nil, r.Context().Err()
		}
	}
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(strings.NewReader(fmt.Sprintf(`{"model":%q,"usage":{"prompt_tokens":%d,"completion_tokens":%d}}`, model, b.prompt, b.completion)))}, nil
}

func (b *usageBase) asked(model string) int64 {
	if n, ok := b.models.Load(model); ok {
		return n.(*atomic.Int64).Load()
	}
	return 0
}

func jsonField(body []byte, key string) string {
	i := strings.Index(string(body), `"`+key+`":"`)
	if i < 0 {
		return ""
	}
	rest := string(body)[i+len(key)+4:]
	return rest[:strings.IndexByte(rest, '"')]
}

// budgetRequest is a chat request for model m with max_tokens 10.
func budgetRequest(ctx context.Context, model, team string) *http.Request {
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://relay/v1/chat/completions",
		strings.NewReader(`{"model":"`+model+`","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`))
	if team != "" {
		req.Header.Set("X-Relay-Budget", team)
	}
	return req
}

// TestBudgetNeverOverspendsUnderConcurrency: 200 concurrent requests against
// a cap that fits exactly 37 reservations: 37 reach the upstream, 163 are
// refused without a call, and spend is the sum of the 37 actual costs.
func TestBudgetNeverOverspendsUnderConcurrency(t *testing.T) {
	for run := range 10 {
		base := &usageBase{gate: make(chan struct{}), prompt: 8, completion: 5}
		reps := &reports{}
		r, err := New(Config{
			Base: base, Prices: budgetPrices, OnReport: reps.add,
			Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
			Retry:     RetryConfig{MaxAttempts: 1},
			Budgets:   []Budget{{Name: "cap", Limit: 37 * 18, Window: Window{Every: time.Hour}}}, // a reservation: 8 prompt + 10 max = $18
		})
		require.NoError(t, err)
		var refused atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 200 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				resp, err := r.RoundTrip(budgetRequest(context.Background(), "m", ""))
				if err != nil {
					require.ErrorIs(t, err, ErrBudgetExceeded)
					refused.Add(1)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}()
		}
		close(start)
		require.Eventually(t, func() bool { return refused.Load() == 163 && base.calls.Load() == 37 }, 10*time.Second, time.Millisecond,
			"run %d: %d refused, %d calls", run, refused.Load(), base.calls.Load())
		close(base.gate)
		wg.Wait()
		assert.EqualValues(t, 37, base.calls.Load())
		spend := r.Spend()
		require.Len(t, spend, 1)
		assert.InDelta(t, 37*13.0, spend[0].Spent, 1e-9, "spend is the 37 actual costs ($13 each)")
		assert.Zero(t, spend[0].Reserved)
		var cost float64
		for _, rep := range reps.all() {
			cost += rep.Cost
			if rep.Err != nil {
				assert.Equal(t, "cap", rep.Budget)
				assert.Zero(t, rep.Attempts)
			}
		}
		assert.InDelta(t, spend[0].Spent, cost, 1e-9)
	}
}

// TestBudgetSettles: the reservation is replaced by the actual cost, below,
// equal to or above it; a request that got no usage costs nothing.
func TestBudgetSettles(t *testing.T) {
	for _, c := range []struct {
		name               string
		prompt, completion int
		status             int
		want               float64
	}{
		{"below", 8, 2, 200, 10},
		{"equal", 8, 10, 200, 18},
		{"above", 28, 10, 200, 38}, // the upstream counted more prompt tokens than the router
		{"failed", 0, 0, 503, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
				return &http.Response{StatusCode: c.status, Header: http.Header{},
					Body: io.NopCloser(strings.NewReader(fmt.Sprintf(`{"usage":{"prompt_tokens":%d,"completion_tokens":%d}}`, c.prompt, c.completion)))}, nil
			})
			r, reps := newTestRouter(t, Config{Base: base, Prices: budgetPrices, Clock: newAutoClock(),
				Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}, {Name: "b", BaseURL: "http://b.test/v1"}},
				Budgets:   []Budget{{Name: "all", Limit: 1000, Window: Window{Every: time.Hour}}}})
			resp, err := r.RoundTrip(budgetRequest(context.Background(), "m", ""))
			require.NoError(t, err)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			spend := r.Spend()[0]
			assert.InDelta(t, c.want, spend.Spent, 1e-9)
			assert.Zero(t, spend.Reserved)
			assert.InDelta(t, c.want, reps.all()[0].Cost, 1e-9)
		})
	}
}

// TestBudgetStreamEstimatedAndHedged: an estimated stream settles its
// estimate; a hedged request reserves once and settles both attempts.
func TestBudgetStreamEstimatedAndHedged(t *testing.T) {
	up := newSSEUpstream(t, []byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hello there\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"))
	r, reps := newTestRouter(t, Config{Prices: budgetPrices, Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}},
		Stream:  StreamConfig{KeepUsageOption: true},
		Budgets: []Budget{{Name: "all", Limit: 1000, Window: Window{Every: time.Hour}}}})
	req := budgetRequest(context.Background(), "m", "")
	req.Body = io.NopCloser(strings.NewReader(`{"model":"m","stream":true,"max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`))
	resp, err := r.RoundTrip(req)
	require.NoError(t, err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	rep := reps.all()[0]
	require.True(t, rep.Usage.Estimated)
	assert.InDelta(t, rep.Cost, r.Spend()[0].Spent, 1e-9)
	assert.Positive(t, rep.Cost)

	// Hedged: both attempts answered, both billed, one reservation.
	a, b := newGatedUpstream(t), newGatedUpstream(t)
	clock := newFakeClock()
	var held []int64
	ledger := &spyLedger{Ledger: store.NewLocal(), reserved: &held}
	hr, hreps := newTestRouter(t, Config{Clock: clock, Hedge: HedgeConfig{Delay: 100 * time.Millisecond}, Ledger: ledger,
		Prices:    map[string]Price{"gpt-4.1": {InputPerMTok: 1e6, OutputPerMTok: 1e6}},
		Upstreams: []Upstream{{Name: "a", BaseURL: a.URL}, {Name: "b", BaseURL: b.URL}},
		Budgets:   []Budget{{Name: "all", Limit: 1e6, Window: Window{Every: time.Hour}}}})
	hr.hedges.bal.Store(hedgeBudgetCap)
	done := sendWithID(t, hr, "1")
	<-clock.armed
	require.Eventually(t, func() bool { return a.Calls() == 1 }, 5*time.Second, time.Millisecond)
	clock.Advance(100 * time.Millisecond)
	require.Eventually(t, func() bool { return b.Calls() == 1 }, 5*time.Second, time.Millisecond)
	a.open("1")
	b.open("1")
	require.NotNil(t, <-done)
	require.Eventually(t, func() bool { return len(hreps.all()) == 1 }, 5*time.Second, time.Millisecond)
	hrep := hreps.all()[0]
	assert.True(t, hrep.Hedged)
	assert.Len(t, held, 1, "one reservation for the hedged request")
	assert.InDelta(t, hrep.Cost, hr.Spend()[0].Spent, 1e-9)
}

// spyLedger records the reservations asked of a Ledger.
type spyLedger struct {
	store.Ledger
	mu       sync.Mutex
	reserved *[]int64
}

func (l *spyLedger) Reserve(ctx context.Context, k store.BudgetKey, limit int64, h store.Hold, now time.Time) (store.Reservation, error) {
	l.mu.Lock()
	*l.reserved = append(*l.reserved, h.Amount)
	l.mu.Unlock()
	return l.Ledger.Reserve(ctx, k, limit, h, now)
}

// TestBudgetWindowsRollOver: a window's spend starts again at its end, on
// the injected clock; a calendar month ends at local midnight, across a
// daylight-saving change.
func TestBudgetWindowsRollOver(t *testing.T) {
	clock := newFakeClock()
	base := &usageBase{prompt: 8, completion: 10}
	r, _ := newTestRouter(t, Config{Base: base, Prices: budgetPrices, Clock: clock, Retry: RetryConfig{MaxAttempts: 1},
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
		Budgets:   []Budget{{Name: "hourly", Limit: 36, Window: Window{Every: time.Hour}}}})
	call := func() error {
		resp, err := r.RoundTrip(budgetRequest(context.Background(), "m", ""))
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return err
	}
	require.NoError(t, call())
	require.NoError(t, call())
	require.ErrorIs(t, call(), ErrBudgetExceeded)
	clock.Advance(time.Hour)
	require.NoError(t, call(), "a new window")
	assert.InDelta(t, 18, r.Spend()[0].Spent, 1e-9)

	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Skip("no time zone database:", err)
	}
	month := Window{Calendar: Month, Location: ny}
	// 2026-03-08 is a daylight-saving change in New York; March ends at
	// local midnight of April 1st, 04:00 UTC (EDT).
	assert.Equal(t, time.Date(2026, 4, 1, 4, 0, 0, 0, time.UTC), month.end(time.Date(2026, 3, 5, 12, 0, 0, 0, time.UTC)).UTC())
	assert.Equal(t, time.Date(2026, 4, 1, 4, 0, 0, 0, time.UTC), month.end(time.Date(2026, 4, 1, 3, 59, 0, 0, time.UTC)).UTC())
	assert.Equal(t, time.Date(2026, 5, 1, 4, 0, 0, 0, time.UTC), month.end(time.Date(2026, 4, 1, 4, 0, 0, 0, time.UTC)).UTC())
	day := Window{Calendar: Day, Location: ny}
	assert.Equal(t, time.Date(2026, 3, 9, 4, 0, 0, 0, time.UTC), day.end(time.Date(2026, 3, 8, 12, 0, 0, 0, time.UTC)).UTC(), "a 23-hour day")
	assert.Equal(t, time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC), Window{Every: 24 * time.Hour}.end(time.Date(2026, 1, 1, 13, 0, 0, 0, time.UTC)))
}

// TestBudgetScopesAndDowngrade: per-header ledgers are separate; a budget
// with Downgrade moves a request that does not fit to the cheaper model;
// ClusterPolicy's CheapWhenSpent moves long prompts to Cheap past the
// threshold, and Decide shows it.
func TestBudgetScopesAndDowngrade(t *testing.T) {
	base := &usageBase{prompt: 8, completion: 10}
	r, reps := newTestRouter(t, Config{Base: base, Prices: budgetPrices, Retry: RetryConfig{MaxAttempts: 1},
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
		Budgets:   []Budget{{Name: "team", Scope: PerHeader("X-Relay-Budget"), Limit: 20, Window: Window{Every: time.Hour}, Downgrade: "cheap"}}})
	send := func(team string) Report {
		resp, err := r.RoundTrip(budgetRequest(context.Background(), "m", team))
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		all := reps.all()
		return all[len(all)-1]
	}
	assert.Equal(t, "m", send("a").Model)
	assert.Equal(t, "m", send("b").Model, "team b has its own ledger")
	rep := send("a")
	assert.Equal(t, "cheap", rep.Model, "team a's $18 reservation does not fit what is left: the cheaper route")
	assert.NoError(t, rep.Err)
	assert.InDelta(t, 1.8, rep.Cost, 1e-9)
	assert.Equal(t, "m", send("").Model, "no header, no budget")
	assert.EqualValues(t, 1, base.asked("cheap"))

	// CheapWhenSpent.
	pol := ClusterPolicy{Cheap: "cheap", CheapWhenSpent: 0.5}
	pr, _ := newTestRouter(t, Config{Base: base, Prices: budgetPrices, Policy: pol, Buckets: Buckets{Mid: 1, Long: 2},
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
		Budgets:   []Budget{{Name: "all", Limit: 30, Window: Window{Every: time.Hour}}}})
	decide := func() Decision {
		d, err := pr.Decide(budgetRequest(context.Background(), "m", ""))
		require.NoError(t, err)
		return d
	}
	assert.Equal(t, "m", decide().Route.Model)
	resp, err := pr.RoundTrip(budgetRequest(context.Background(), "m", ""))
	require.NoError(t, err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	assert.Equal(t, "cheap", decide().Route.Model, "past half the budget, long prompts go to Cheap")
}

// TestBudgetCurrency: costs and budgets in the billing currency: a relay
// that bills ¥1 per $1 of list price, with an 85.3% discount.
func TestBudgetCurrency(t *testing.T) {
	base := &usageBase{prompt: 8, completion: 10}
	r, reps := newTestRouter(t, Config{Base: base, Prices: budgetPrices, Currency: Currency{Code: "CNY", PerUSD: 1},
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1", PriceFactor: 0.147}},
		Budgets:   []Budget{{Name: "yuan", Limit: 100, Window: Window{Every: time.Hour}}}})
	resp, err := r.RoundTrip(budgetRequest(context.Background(), "m", ""))
	require.NoError(t, err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	rep := reps.all()[0]
	assert.InDelta(t, 18.0, rep.ListCostUSD, 1e-9)
	assert.InDelta(t, 18*0.147, rep.CostUSD, 1e-9)
	assert.InDelta(t, 18*0.147, rep.Cost, 1e-9)
	assert.Equal(t, "CNY", rep.Currency)
	assert.InDelta(t, 18*0.147, r.Spend()[0].Spent, 1e-9)
	assert.False(t, math.IsNaN(rep.Cost))
}

// TestBudgetConfigChecked: New refuses a budget without a name, limit or
// window.
func TestBudgetConfigChecked(t *testing.T) {
	_, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}}, Budgets: []Budget{
		{Limit: 1, Window: Window{Every: time.Hour}},
		{Name: "x", Window: Window{Every: time.Hour}},
		{Name: "y", Limit: 1},
		{Name: "z", Limit: 1, Window: Window{Every: time.Hour, Calendar: Day}},
	}})
	require.Error(t, err)
	for _, want := range []string{"a budget has no Name", `budget "x": Limit 0 must be positive`, `budget "y": set exactly one`, `budget "z": set exactly one`} {
		assert.Contains(t, err.Error(), want)
	}
}

// BenchmarkBudgetAdmission measures what two budgets (one for all traffic,
// one per team header) add to the admission of a request: the candidate
// order, breaker, limiter and slot as in BenchmarkAcquire, then the
// reservations and their settlement, against the same without budgets.
func BenchmarkBudgetAdmission(b *testing.B) {
	for _, c := range []struct {
		name    string
		budgets []Budget
	}{
		{"none", nil},
		{"two-budgets", []Budget{
			{Name: "all", Limit: 4e9, Window: Window{Every: time.Hour}},
			{Name: "team", Scope: PerHeader("X-Relay-Budget"), Limit: 4e9, Window: Window{Calendar: Day}},
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			r, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}, {Name: "b", BaseURL: "http://b.test/v1"}},
				Budgets: c.budgets, Prices: budgetPrices})
			require.NoError(b, err)
			req := budgetRequest(context.Background(), "m", "team-a")
			t := newTrip(r, req)
			t.c.req = Request{Endpoint: EndpointChat, Model: "m", PromptTokens: 100, Header: req.Header, Budget: noBudgets{}}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				t.res.id = "" // a new request's hold id
				cands := r.plan(t.cbuf[:0], "m", nil, 1, false, nil)
				adm := r.admissionOf(&t.c)
				t.tokens = adm.tokens
				if len(c.budgets) > 0 {
					adm.trip = t
				}
				i, _, err := r.acquire(ctx, cands, 0, adm)
				if err != nil {
					b.Fatal(err)
				}
				a := attempt{cand: cands[i], held: true}
				a.release()
				t.att = a
				t.settle([]costPart{{model: "m", upstream: a.cand.up.cfg.Name, cost: 1}})
			}
		})
	}
}

// lateLedger is a shared Ledger whose Reserve, once late is set, applies
// the hold and then answers too late (a timeout), as a slow Redis does;
// it records the holds it made and the ids settled.
type lateLedger struct {
	store.Ledger
	late    atomic.Bool
	mu      sync.Mutex
	made    []string
	settled []string
}

func (l *lateLedger) Reserve(ctx context.Context, k store.BudgetKey, limit int64, h store.Hold, now time.Time) (store.Reservation, error) {
	res, err := l.Ledger.Reserve(ctx, k, limit, h, now)
	l.mu.Lock()
	l.made = append(l.made, h.ID)
	l.mu.Unlock()
	if l.late.Load() {
		return store.Reservation{}, context.DeadlineExceeded
	}
	return res, err
}

func (l *lateLedger) Settle(ctx context.Context, k store.BudgetKey, id string, spent int64, now time.Time) error {
	if id != "" {
		l.mu.Lock()
		l.settled = append(l.settled, id)
		l.mu.Unlock()
	}
	return l.Ledger.Settle(ctx, k, id, spent, now)
}

// TestBudgetSettlesUncertainHold: a shared Reserve that timed out may
// have made its hold; the request reserves from the local share (what the
// shared ledger had left when it last answered), and its settlement ends
// the shared hold too, by its id, so the shared ledger holds nothing once
// no request is in flight. The spend charged to the local share goes to
// the shared ledger after its next settlement.
func TestBudgetSettlesUncertainHold(t *testing.T) {
	shared := &lateLedger{Ledger: store.NewLocal()}
	base := &usageBase{prompt: 8, completion: 10}
	r, reps := newTestRouter(t, Config{Base: base, Prices: budgetPrices, Ledger: shared,
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
		Budgets:   []Budget{{Name: "all", Limit: 1000, Window: Window{Every: time.Hour}}}})
	send := func() {
		resp, err := r.RoundTrip(budgetRequest(context.Background(), "m", ""))
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	send() // the shared ledger answers: the local share knows what it has left
	shared.late.Store(true)
	for range 3 {
		send()
	}
	require.Len(t, reps.all(), 4)
	shared.mu.Lock()
	made, settled := slices.Clone(shared.made), slices.Clone(shared.settled)
	shared.mu.Unlock()
	require.Len(t, made, 4)
	assert.ElementsMatch(t, made, settled, "every hold the shared ledger made was settled by its id")
	assert.Len(t, slices.Compact(slices.Sorted(slices.Values(made))), 4, "one id per request")
	now := r.s.clock.Now()
	k := store.BudgetKey{Budget: "all", Window: now.Truncate(time.Hour).Add(time.Hour)}
	spent, reserved, _ := shared.Ledger.Usage(context.Background(), k, now)
	assert.Zero(t, reserved, "the shared ledger holds nothing")
	var cost float64
	for _, rep := range reps.all() {
		cost += rep.Cost
	}
	assert.Equal(t, nanos(cost), spent, "every request's spend is in the shared ledger")
	_, lreserved, _ := r.local.Usage(context.Background(), k, now)
	assert.Zero(t, lreserved)
}
