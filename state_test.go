package relay

import (
	"context"
	"io"
	"maps"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay/internal/statetest"
	"github.com/tokenrelay/relay/store"
)

// memState is a store several routers share, as replicas share one on
// Redis, which a test can switch down (Down) and whose admissions it counts
// (Admits).
type memState = statetest.Switch

func newMemState() *memState { return statetest.NewSwitch() }

// errDown is what a memState's calls fail with while it is down.
var errDown = statetest.ErrStateDown

// openUntil returns the end of the open period name's circuit has in st
// at now, zero when it does not keep an attempt out.
func openUntil(t *testing.T, st store.State, name string, now time.Time) time.Time {
	t.Helper()
	v, err := st.Admit(context.Background(), store.Limits{Name: name}, store.Ask{}, now)
	require.NoError(t, err)
	if !v.Open || !v.Until.After(now) {
		return time.Time{}
	}
	return v.Until.In(now.Location())
}

// spend takes n requests of u's limits in the router's store at now, as
// other requests of the fleet would.
func spend(t *testing.T, r *Router, u *upstream, n int, now time.Time) {
	t.Helper()
	for range n {
		v, err := r.st.Admit(context.Background(), u.lim.fleet, store.Ask{}, now)
		require.NoError(t, err)
		require.True(t, v.Taken, "the limits held fewer than %d requests", n)
	}
}

// openFor opens u's circuit until until, in the router's store and its
// view, as a run of failures would (its hooks are not told).
func openFor(r *Router, u *upstream, until, now time.Time) {
	r.st.Open(context.Background(), u.cfg.Name, until, now)
	u.circ.view.Store(until.UnixNano())
	u.circ.changes.Add(1)
	u.lat.reset()
}

// failures records n failed attempts on u at now.
func failures(r *Router, u *upstream, n int, now time.Time) {
	for range n {
		r.record(context.Background(), nil, &candidate{up: u}, nil, outcomeFailure, 0, now)
	}
}

// stateOf returns u's circuit state in the router's view as of now.
func stateOf(r *Router, u *upstream, now time.Time) BreakerState {
	return u.circ.stateAt(now, r.s.breaker.probePath != "")
}

// replicasOf returns n routers of cfg, sharing its State as replicas do.
func replicasOf(t *testing.T, n int, cfg Config) []*Router {
	t.Helper()
	cfg.Replicas = n
	var out []*Router
	for range n {
		r, err := New(cfg)
		require.NoError(t, err)
		out = append(out, r)
	}
	return out
}

// sendTo sends one chat request through r and reads its answer.
func sendTo(r http.RoundTripper) error {
	req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
	resp, err := r.RoundTrip(req)
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return err
}

// fleet is n routers sharing one State over one in-memory upstream that
// counts its calls.
type fleet struct {
	routers []*Router
	calls   atomic.Int64
	status  atomic.Int32
	reps    *reports
}

func newFleet(t *testing.T, n int, st store.State, clock Clock, up Upstream) *fleet {
	f := &fleet{reps: &reports{}}
	f.status.Store(200)
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		f.calls.Add(1)
		io.Copy(io.Discard, r.Body)
		return &http.Response{StatusCode: int(f.status.Load()), Header: http.Header{},
			Body: io.NopCloser(strings.NewReader(`{"usage":{"prompt_tokens":8,"completion_tokens":2}}`))}, nil
	})
	for range n {
		cfg := Config{Base: base, Clock: clock, Upstreams: []Upstream{up}, Replicas: n, OnReport: f.reps.add,
			Retry: RetryConfig{MaxAttempts: 1}, Limits: Limits{MaxWait: -1}, StateTimeout: time.Second}
		if st != nil {
			cfg.State = st
		}
		r, err := New(cfg)
		require.NoError(t, err)
		f.routers = append(f.routers, r)
	}
	return f
}

func (f *fleet) send(i int) error { return sendTo(f.routers[i%len(f.routers)]) }

// TestSharedStateOneLimitForTheFleet: four replicas share an upstream's RPM
// of 120: within the minute the upstream receives 120 requests, not 480 as
// with per-process state.
func TestSharedStateOneLimitForTheFleet(t *testing.T) {
	for _, shared := range []bool{true, false} {
		clock := newFakeClock()
		var st store.State
		if shared {
			st = newMemState()
		}
		f := newFleet(t, 4, st, clock, Upstream{Name: "a", BaseURL: "http://a.test/v1", RPM: 120})
		var wg sync.WaitGroup
		var ok atomic.Int64
		for g := range 32 {
			wg.Go(func() {
				for i := range 400 / 32 {
					if f.send(g+i*32) == nil {
						ok.Add(1)
					}
				}
			})
		}
		wg.Wait()
		if shared {
			assert.EqualValues(t, 120, f.calls.Load(), "one limit for the fleet")
		} else {
			assert.Greater(t, f.calls.Load(), int64(3*120), "each replica spends the whole limit: about 4× for the fleet")
		}
		assert.Equal(t, ok.Load(), f.calls.Load())
	}
}

// TestSharedStateDownFallsBack: with the State down from the start, every
// request still completes, decided from each replica's share (the limit
// divided by Replicas); the reports and the counter say so; when it
// answers again, it decides again.
func TestSharedStateDownFallsBack(t *testing.T) {
	clock := newFakeClock()
	st := newMemState()
	st.Down.Store(true)
	f := newFleet(t, 4, st, clock, Upstream{Name: "a", BaseURL: "http://a.test/v1", RPM: 120})
	for i := range 200 {
		f.send(i)
	}
	assert.EqualValues(t, 4*30, f.calls.Load(), "RPM/Replicas per replica while the State is down")
	for _, rep := range f.reps.all() {
		assert.True(t, rep.StateFallback)
	}
	assert.Positive(t, f.routers[0].StateFallbacks())
	st.Down.Store(false)
	clock.Advance(time.Minute)
	f.calls.Store(0)
	before := len(f.reps.all())
	for i := range 4 {
		require.NoError(t, f.send(i))
	}
	assert.EqualValues(t, 4, f.calls.Load())
	for _, rep := range f.reps.all()[before:] {
		assert.False(t, rep.StateFallback, "the State decides again")
	}
	assert.Positive(t, st.Admits.Load())
}

// TestFallbackStartsWhereTheFleetIs: the fleet spends its minute of RPM
// 120 (each replica's local share is kept in step with it), then the
// State stops answering. Each replica decides from its share, RPM 30,
// starting where the fleet was: empty. Over the next 10 s the fleet sends
// what the limit refills, 120·10/60 = 20, not each replica's full share
// at once. (The share was a full bucket: 4×30 more went out at once.)
func TestFallbackStartsWhereTheFleetIs(t *testing.T) {
	clock := newFakeClock()
	st := newMemState()
	f := newFleet(t, 4, st, clock, Upstream{Name: "a", BaseURL: "http://a.test/v1", RPM: 120})
	for i := range 200 {
		f.send(i)
	}
	require.EqualValues(t, 120, f.calls.Load())
	st.Down.Store(true)
	f.calls.Store(0)
	for s := range 10 {
		for i := range 40 {
			f.send(s*40 + i)
		}
		clock.Advance(time.Second)
	}
	for i := range 40 {
		f.send(i)
	}
	assert.LessOrEqual(t, f.calls.Load(), int64(20), "the fleet's bound during the outage: its refill, 2 a second")
	assert.GreaterOrEqual(t, f.calls.Load(), int64(16), "each replica's share refills at RPM/Replicas")
}

// TestSharedStateBreaker: failures seen by one replica open the circuit for
// the fleet; in half-open exactly one claim of the probe is handed out.
func TestSharedStateBreaker(t *testing.T) {
	clock := newFakeClock()
	st := newMemState()
	up := Upstream{Name: "a", BaseURL: "http://a.test/v1"}
	f := newFleet(t, 4, st, clock, up)
	f.status.Store(503)
	for range 6 {
		f.send(0) // replica 0 alone sees the failures
	}
	require.EqualValues(t, 6, f.calls.Load())
	require.False(t, openUntil(t, st, "a", clock.Now()).IsZero(), "the fleet's circuit is open")
	clock.Advance(31 * time.Second)
	var won atomic.Int64
	for i := range 4 {
		v, err := st.Admit(context.Background(), f.routers[i].ups[0].lim.fleet, store.Ask{Probe: time.Second}, clock.Now())
		require.NoError(t, err)
		if v.Probe != "" {
			won.Add(1)
		}
	}
	assert.EqualValues(t, 1, won.Load(), "one replica probes")
}

// TestSharedStateKeepsOthersOff: with two upstreams, a circuit the fleet
// opened keeps every replica on the healthy one.
func TestSharedStateKeepsOthersOff(t *testing.T) {
	clock := newFakeClock()
	st := newMemState()
	var sick, well atomic.Int64
	var sickOK atomic.Bool
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		status := 200
		if strings.Contains(r.URL.Host, "sick") {
			sick.Add(1)
			if !sickOK.Load() {
				status = 503
			}
		} else {
			well.Add(1)
		}
		return &http.Response{StatusCode: status, Header: http.Header{}, Body: http.NoBody}, nil
	})
	routers := replicasOf(t, 4, Config{Base: base, Clock: clock, State: st, Strategy: StrategyPriority, Retry: RetryConfig{MaxAttempts: 1},
		Upstreams: []Upstream{{Name: "sick", BaseURL: "http://sick.test/v1"}, {Name: "well", BaseURL: "http://well.test/v1"}}})
	send := func(r *Router) { sendTo(r) }
	for range 6 {
		send(routers[0])
	}
	require.EqualValues(t, 6, sick.Load())
	for _, r := range routers[1:] {
		for range 5 {
			send(r)
		}
	}
	assert.EqualValues(t, 6, sick.Load(), "no other replica sent to the upstream the fleet's circuit holds out")
	assert.EqualValues(t, 15, well.Load())

	// After the cooldown, one replica's probe succeeds, and the fleet takes
	// the upstream back.
	clock.Advance(31 * time.Second)
	sickOK.Store(true)
	send(routers[1])
	require.EqualValues(t, 7, sick.Load(), "the probe")
	send(routers[2])
	send(routers[3])
	assert.EqualValues(t, 9, sick.Load(), "re-admitted for every replica after one probe")
}

// TestFleetCooldownDoubles: each failed probe of the fleet's circuit,
// whichever replica sends it, doubles the open period: 1, 2, 4 s (it
// stayed at the first cooldown: a dead upstream was probed every cooldown
// for ever).
func TestFleetCooldownDoubles(t *testing.T) {
	clock := newFakeClock()
	st := newMemState()
	routers := replicasOf(t, 4, Config{Clock: clock, State: st, StateTimeout: time.Second, Retry: RetryConfig{MaxAttempts: 1},
		Base: roundTripFunc(func(*http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: 503, Header: http.Header{}, Body: http.NoBody}, nil
		}),
		Breaker:   BreakerConfig{Failures: 1, Cooldown: time.Second, MaxCooldown: time.Minute, P99: -1},
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}}})
	send := func(r *Router) { sendTo(r) }
	send(routers[0])
	send(routers[0])
	var periods []time.Duration
	for i := range 4 {
		until := openUntil(t, st, "a", clock.Now())
		require.False(t, until.IsZero())
		periods = append(periods, until.Sub(clock.Now()))
		clock.Advance(until.Sub(clock.Now()))
		send(routers[(i+1)%4]) // the probe, from another replica each time: it fails
	}
	assert.Equal(t, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second}, periods)
}

// TestSharedStateBudgetAcrossReplicas: four replicas, one budget: no
// overspend.
func TestSharedStateBudgetAcrossReplicas(t *testing.T) {
	st := newMemState()
	base := &usageBase{gate: make(chan struct{}), prompt: 8, completion: 10}
	routers := replicasOf(t, 4, Config{Base: base, State: st, Prices: budgetPrices, Retry: RetryConfig{MaxAttempts: 1},
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
		Budgets:   []Budget{{Name: "cap", Limit: 10 * 18, Window: Window{Every: time.Hour}}}})
	var wg sync.WaitGroup
	var refused atomic.Int64
	for i := range 100 {
		wg.Go(func() {
			resp, err := routers[i%4].RoundTrip(budgetRequest(context.Background(), "m", ""))
			if err != nil {
				refused.Add(1)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	}
	require.Eventually(t, func() bool { return refused.Load() == 90 && base.calls.Load() == 10 }, 10*time.Second, time.Millisecond)
	close(base.gate)
	wg.Wait()
	assert.InDelta(t, 10*18.0, routers[0].Spend()[0].Spent, 1e-9, "the fleet's spend, seen from any replica")
}

// TestBudgetFallbackKeepsTheFleetsBound: four replicas, a budget that fits
// 10 requests; the fleet spends 6 of them, then the State stops
// answering. Each replica decides from its share of what the fleet had
// left (4/4 = 1 request each), never from an empty ledger: the fleet
// spends at most the 10. Once the State answers again, the spend made
// during the outage is written to it, and nothing stays reserved (the
// settlements of holds a Reserve may have made before it timed out are
// made again). (Each
// replica reserved against a quarter of the whole budget in a ledger that
// started empty: the fleet spent 6 + 4×2 = 14.)
func TestBudgetFallbackKeepsTheFleetsBound(t *testing.T) {
	clock := newFakeClock()
	st := newMemState()
	base := &usageBase{prompt: 8, completion: 10}
	routers := replicasOf(t, 4, Config{Base: base, State: st, Prices: budgetPrices, Clock: clock, Retry: RetryConfig{MaxAttempts: 1},
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
		Budgets:   []Budget{{Name: "cap", Limit: 10 * 18, Window: Window{Every: time.Hour}}}})
	send := func(r *Router) error {
		resp, err := r.RoundTrip(budgetRequest(context.Background(), "m", ""))
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return err
	}
	for i := range 6 {
		require.NoError(t, send(routers[i%4]))
	}
	st.Down.Store(true)
	for i := range 20 {
		send(routers[i%4])
	}
	assert.EqualValues(t, 10, base.calls.Load(), "the fleet's bound during the outage: what it had left")
	st.Down.Store(false)
	for _, r := range routers {
		r.Spend() // the settlements the State did not take are made first
	}
	spent, reserved, err := st.Usage(context.Background(), store.BudgetKey{Budget: "cap", Window: clock.Now().Truncate(time.Hour).Add(time.Hour)}, clock.Now())
	require.NoError(t, err)
	assert.Zero(t, reserved, "nothing reserved once every request settled")
	assert.EqualValues(t, 10*18e9, spent, "the outage's spend was written to the fleet's ledger")
}

// scriptedState answers Admit with admit (the rest as memState).
type scriptedState struct {
	*memState
	admit func(u store.Limits, a store.Ask, now time.Time) store.Verdict
}

func (s *scriptedState) Admit(_ context.Context, u store.Limits, a store.Ask, now time.Time) (store.Verdict, error) {
	return s.admit(u, a, now), nil
}

// hostsRouter is a router over upstreams a and b (tried in that order)
// sharing st, on an auto clock, whose calls are counted by host.
func hostsRouter(t *testing.T, st store.State, rpm int) (*Router, func() map[string]int) {
	var mu sync.Mutex
	calls := map[string]int{}
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		mu.Lock()
		calls[r.URL.Host]++
		mu.Unlock()
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(`{}`))}, nil
	})
	r, err := New(Config{Base: base, Clock: newAutoClock(), State: st, StateTimeout: time.Second, Strategy: StrategyPriority,
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1", RPM: rpm}, {Name: "b", BaseURL: "http://b.test/v1", RPM: rpm}},
		Limits:    Limits{MaxWait: time.Second}})
	require.NoError(t, err)
	return r, func() map[string]int { mu.Lock(); defer mu.Unlock(); return maps.Clone(calls) }
}

// TestFleetOpenedDuringWaitTriesOthers: a request waits for a's tokens (the
// sooner of the two); meanwhile the fleet opens a's circuit. It goes to b,
// whose tokens come later, instead of failing.
func TestFleetOpenedDuringWaitTriesOthers(t *testing.T) {
	var start time.Time
	st := &scriptedState{memState: newMemState(), admit: func(u store.Limits, _ store.Ask, now time.Time) store.Verdict {
		if start.IsZero() {
			start = now
		}
		el := now.Sub(start)
		switch {
		case u.Name == "a" && el < 100*time.Millisecond:
			return store.Verdict{Wait: 100*time.Millisecond - el}
		case u.Name == "a":
			return store.Verdict{Open: true, Until: now.Add(time.Minute)}
		case el < 200*time.Millisecond:
			return store.Verdict{Wait: 200*time.Millisecond - el}
		}
		return store.Verdict{Taken: true}
	}}
	r, calls := hostsRouter(t, st, 10)
	resp, _, err := send(t, r, chatBody("gpt-4.1", "x"))
	require.NoError(t, err)
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, map[string]int{"b.test": 1}, calls())
}

// TestAllOpenForTheFleetForcesSoonest: when every candidate's circuit is
// open for the fleet, the one that recovers soonest is tried once, as when
// they are open in-process.
func TestAllOpenForTheFleetForcesSoonest(t *testing.T) {
	st := &scriptedState{memState: newMemState(), admit: func(u store.Limits, a store.Ask, now time.Time) store.Verdict {
		switch {
		case a.Force:
			return store.Verdict{Taken: true}
		case u.Name == "b":
			return store.Verdict{Open: true, Until: now.Add(time.Second)}
		}
		return store.Verdict{Open: true, Until: now.Add(time.Minute)}
	}}
	r, calls := hostsRouter(t, st, 0)
	resp, _, err := send(t, r, chatBody("gpt-4.1", "x"))
	require.NoError(t, err)
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, map[string]int{"b.test": 1}, calls())
}

// countingState counts the admissions each request asked for (by the
// request's X-Id, which the test sets as the prompt), and opens upstream
// "a" for the fleet at openAt, as another replica would.
type countingState struct {
	*memState
	mu     sync.Mutex
	asked  int
	openAt time.Time
}

func (s *countingState) Admit(ctx context.Context, u store.Limits, a store.Ask, now time.Time) (store.Verdict, error) {
	s.mu.Lock()
	s.asked++
	if !s.openAt.IsZero() && !now.Before(s.openAt) {
		s.memState.Open(ctx, "a", now.Add(time.Hour), now)
		s.openAt = time.Time{}
	}
	s.mu.Unlock()
	return s.memState.Admit(ctx, u, a, now)
}

// TestOpenCircuitEndsWaitsWithoutStorm: 8 requests wait for the fleet's
// RPM on the only upstream; another replica opens its circuit. Each
// waiter ends its wait with ErrCircuitOpen after at most two admissions
// of its own beyond the verdicts it waited for: the queue asks once per
// verdict, and the open circuit ends every wait. (The waiters scanned
// again without seeing the open circuit and asked at once, in a loop:
// thousands of admissions, then ErrRateLimited.)
func TestOpenCircuitEndsWaitsWithoutStorm(t *testing.T) {
	clock := newFakeClock()
	st := &countingState{memState: newMemState()}
	r, err := New(Config{Clock: clock, State: st, StateTimeout: time.Second, Limits: Limits{MaxWait: time.Minute},
		Base: roundTripFunc(func(*http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody}, nil
		}),
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1", RPM: 60}}})
	require.NoError(t, err)
	u := r.ups[0]
	spend(t, r, u, 60, clock.Now()) // the fleet spent its minute: a token a second
	st.mu.Lock()
	st.asked = 0
	st.mu.Unlock()
	errs := make(chan error, 8)
	for range 8 {
		go func() { errs <- sendTo(r) }()
	}
	require.Eventually(t, func() bool { return u.lim.turns.n.Load() == 8 }, 5*time.Second, time.Millisecond)
	clock.Advance(time.Second) // the head's token: it is served
	require.Eventually(t, func() bool { return u.lim.turns.n.Load() == 7 }, 5*time.Second, time.Millisecond)
	st.mu.Lock()
	st.openAt = clock.Now() // the next admission finds the circuit open
	st.mu.Unlock()
	clock.Advance(time.Second)
	var served, open int
	for range 8 {
		switch err := <-errs; {
		case err == nil:
			served++
		case assert.ErrorIs(t, err, ErrCircuitOpen):
			open++
		}
	}
	// The first served at its verdict's time; of the 7 the open circuit
	// sent back, one forced try (the never-empty rule) found the token
	// due then, the others none.
	assert.Equal(t, 2, served)
	assert.Equal(t, 6, open)
	st.mu.Lock()
	defer st.mu.Unlock()
	// At most 8 asked on arrival (those that came while others of their
	// priority waited asked nothing), 1 served at its verdict's time, 1
	// that found the circuit open, and each waiter's forced try.
	assert.LessOrEqual(t, st.asked, 8+1+1+7, "admissions asked of the State")
}

// TestRefusedAtOnceWhenItsTurnIsTooLate: the fleet's minute of RPM 60 is
// spent (a token a second) and 5 requests wait; with MaxWait 3 s, the
// next request's turn (the 6th token) cannot come in time: it is refused
// at once, without a wait. (Shared, a request behind others saw only the
// head's turn, waited out MaxWait, then failed.)
func TestRefusedAtOnceWhenItsTurnIsTooLate(t *testing.T) {
	for _, shared := range []bool{true, false} {
		clock := newFakeClock()
		cfg := Config{Clock: clock, Limits: Limits{MaxWait: 10 * time.Second},
			Base: roundTripFunc(func(*http.Request) (*http.Response, error) {
				return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody}, nil
			}),
			Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1", RPM: 60}}}
		if shared {
			cfg.State, cfg.StateTimeout = newMemState(), time.Second
		}
		r, err := New(cfg)
		require.NoError(t, err)
		u := r.ups[0]
		spend(t, r, u, 60, clock.Now())
		errs := make(chan error, 10)
		for i := range 10 {
			go func() { errs <- sendTo(r) }()
			if i < 5 {
				require.Eventually(t, func() bool { return int(u.lim.turns.n.Load()) == i+1 }, 5*time.Second, time.Millisecond)
			}
		}
		// MaxWait 10 s: the 6th to 10th tokens come at 6-10 s: all fit.
		// Another 3 s request cannot.
		require.Eventually(t, func() bool { return u.lim.turns.n.Load() == 10 }, 5*time.Second, time.Millisecond)
		late := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
			resp, err := r.RoundTrip(req)
			if err == nil {
				resp.Body.Close()
			}
			late <- err
		}()
		select {
		case err := <-late:
			assert.ErrorIs(t, err, ErrRateLimited, "shared %v", shared)
		case <-time.After(10 * time.Second):
			t.Fatalf("shared %v: a request whose turn comes after MaxWait waits", shared)
		}
		assert.EqualValues(t, 10, u.lim.turns.n.Load(), "shared %v: it never joined the queue", shared)
		for range 10 {
			clock.Advance(time.Second)
		}
		for range 10 {
			require.NoError(t, <-errs)
		}
	}
}

// settled reports whether no waiter of q is due at now: the queue is
// empty, or its head's turn comes later and it is not asking.
func (q *turns) settled(now time.Time) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.h) == 0 || (q.asking == nil && !q.stale && q.est.due(1, int64(q.h[0].tpm)) > now.UnixNano())
}

// turnsRig drives one upstream's turns with a fake clock: the limit is
// RPM 60 with its minute spent at the start, so the k-th token comes k
// seconds later.
type turnsRig struct {
	clock *fakeClock
	q     turns
	lim   store.Limits
	st    *store.Local
	mu    sync.Mutex
	order []Priority
}

func newTurnsRig() *turnsRig {
	g := &turnsRig{clock: newFakeClock(), lim: store.Limits{Name: "a", RPM: 60}, st: store.NewLocal()}
	for range 60 {
		g.st.Admit(context.Background(), g.lim, store.Ask{}, g.clock.Now())
	}
	v, _ := g.st.Admit(context.Background(), g.lim, store.Ask{}, g.clock.Now())
	g.q.record(v, &g.lim, g.clock.Now())
	return g
}

// wait queues a waiter of priority p with a deadline d from now; its ask
// admits on the store and records the verdict, as the router's does.
func (g *turnsRig) wait(ctx context.Context, p Priority, d time.Duration) <-chan error {
	errc := make(chan error, 1)
	w := &waiter{prio: p, deadline: g.clock.Now().Add(d).UnixNano(), tooLong: ErrRateLimited}
	go func() {
		errc <- g.q.wait(ctx, g.clock, w, func(now time.Time) (bool, error) {
			v, _ := g.st.Admit(context.Background(), g.lim, store.Ask{}, now)
			g.q.record(v, &g.lim, now)
			if v.Taken {
				g.mu.Lock()
				g.order = append(g.order, p)
				g.mu.Unlock()
			}
			return v.Taken, nil
		})
	}()
	return errc
}

// TestTurnsOrder: the head of the turns is the highest priority, then the
// first come; each is served when its token is due, one a second.
func TestTurnsOrder(t *testing.T) {
	g := newTurnsRig()
	var errs []<-chan error
	for i, p := range []Priority{0, PriorityBatch, PriorityInteractive, 0} {
		errs = append(errs, g.wait(context.Background(), p, time.Hour))
		require.Eventually(t, func() bool { return int(g.q.n.Load()) == i+1 }, 5*time.Second, time.Millisecond)
	}
	for range 4 {
		n := g.q.n.Load()
		g.clock.Advance(time.Second)
		require.Eventually(t, func() bool { return g.q.n.Load() == n-1 }, 5*time.Second, time.Millisecond, "one served a second")
	}
	for _, e := range errs {
		require.NoError(t, <-e)
	}
	assert.Equal(t, []Priority{PriorityInteractive, 0, 0, PriorityBatch}, g.order)
}

// TestTurnsShed: a waiter whose turn would come after its deadline is
// refused when it joins; one that a request of higher priority pushes past
// its deadline is refused then; a waiter whose caller gives up leaves.
func TestTurnsShed(t *testing.T) {
	g := newTurnsRig()
	a := g.wait(context.Background(), PriorityBatch, 2*time.Second) // the 1st token: at 1 s
	require.Eventually(t, func() bool { return g.q.n.Load() == 1 }, 5*time.Second, time.Millisecond)
	b := g.wait(context.Background(), PriorityBatch, 2*time.Second) // the 2nd: at 2 s
	require.Eventually(t, func() bool { return g.q.n.Load() == 2 }, 5*time.Second, time.Millisecond)
	assert.ErrorIs(t, <-g.wait(context.Background(), PriorityBatch, 2*time.Second), ErrRateLimited, "the 3rd token comes at 3 s")
	c := g.wait(context.Background(), PriorityInteractive, time.Hour) // takes the 1st: b's turn moves to 3 s
	assert.ErrorIs(t, <-b, ErrRateLimited)
	ctx, cancel := context.WithCancel(context.Background())
	d := g.wait(ctx, PriorityBatch, time.Hour)
	require.Eventually(t, func() bool { return g.q.n.Load() == 3 }, 5*time.Second, time.Millisecond)
	cancel()
	assert.ErrorIs(t, <-d, context.Canceled)
	g.clock.Advance(time.Second)
	require.NoError(t, <-c)
	g.clock.Advance(time.Second)
	require.NoError(t, <-a)
	assert.Zero(t, g.q.n.Load())
}

// TestTurnsOpenEndsEveryWait: a verdict that the circuit is open ends
// every wait at once, with no admission asked.
func TestTurnsOpenEndsEveryWait(t *testing.T) {
	g := newTurnsRig()
	var errs []<-chan error
	for i := range 5 {
		errs = append(errs, g.wait(context.Background(), 0, time.Hour))
		require.Eventually(t, func() bool { return int(g.q.n.Load()) == i+1 }, 5*time.Second, time.Millisecond)
	}
	g.q.record(store.Verdict{Open: true, Until: g.clock.Now().Add(time.Minute)}, &g.lim, g.clock.Now())
	for _, e := range errs {
		assert.ErrorIs(t, <-e, errFleetOpened)
	}
	assert.Empty(t, g.order)
}

// probeReplica is a router over upstream a sharing st, whose calls answer
// status; with gate set, each call waits for it to close, and sent tells
// when a call arrived.
type probeReplica struct {
	*Router
	calls atomic.Int64
	sent  chan struct{}
	gate  chan struct{}
}

func newProbeReplica(t *testing.T, st store.State, clock Clock, status int, gated bool) *probeReplica {
	return newProbeReplicaWith(t, st, clock, BreakerConfig{Failures: 2, Cooldown: 30 * time.Second, P99: -1},
		RetryConfig{MaxAttempts: 1}, statusOf(status), gated)
}

// start sends one request on its own goroutine and returns its result's
// channel once the upstream has it.
func (p *probeReplica) start() <-chan error {
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
		resp, err := p.RoundTrip(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	<-p.sent
	return done
}

// TestSharedStaleProbe: replica A claims the fleet's half-open probe and
// its call outlives the claim (the lock's time ends); replica B claims the
// probe after it. A's success does not close the circuit after B's probe
// failed and opened it again: A's claim is of the period before. While
// B's probe is in flight, A's success does close it: a healthy answer,
// with no failure since (else probes slower than the lock would never
// close a circuit under steady traffic).
func TestSharedStaleProbe(t *testing.T) {
	setup := func(t *testing.T, bStatus int, bGated bool) (*memState, *fakeClock, *probeReplica, *probeReplica, <-chan error) {
		clock := newFakeClock()
		st := newMemState()
		a := newProbeReplica(t, st, clock, 200, true)
		b := newProbeReplica(t, st, clock, bStatus, bGated)
		require.NoError(t, st.Open(context.Background(), "a", clock.Now().Add(30*time.Second), clock.Now()))
		clock.Advance(31 * time.Second) // half-open
		aDone := a.start()              // A probes; its call is slow
		clock.Advance(11 * time.Second) // and outlives its claim (10 s)
		return st, clock, a, b, aDone
	}

	t.Run("newer probe failed", func(t *testing.T) {
		st, clock, a, b, aDone := setup(t, 503, false)
		resp, _, err := send(t, b, chatBody("gpt-4.1", "x"))
		require.NoError(t, err)
		require.Equal(t, 503, resp.StatusCode, "B's probe")
		require.EqualValues(t, 1, b.calls.Load())
		require.False(t, openUntil(t, st, "a", clock.Now()).IsZero(), "B's failed probe opened the circuit again")
		close(a.gate)
		require.NoError(t, <-aDone)
		assert.False(t, openUntil(t, st, "a", clock.Now()).IsZero(), "A's stale probe closed the circuit B's failed probe opened")
	})

	t.Run("newer probe in flight", func(t *testing.T) {
		st, clock, a, b, aDone := setup(t, 200, true)
		bDone := b.start()
		close(a.gate)
		require.NoError(t, <-aDone)
		assert.True(t, openUntil(t, st, "a", clock.Now()).IsZero(), "A's probe, slower than its lock, succeeded with no failure since: the circuit closes")
		close(b.gate)
		require.NoError(t, <-bDone)
		assert.True(t, openUntil(t, st, "a", clock.Now()).IsZero(), "B's success leaves it closed")
		c := newProbeReplica(t, st, clock, 200, false)
		resp, _, err := send(t, c, chatBody("gpt-4.1", "x"))
		require.NoError(t, err)
		assert.Equal(t, 200, resp.StatusCode)
		assert.EqualValues(t, 1, c.calls.Load())
	})
}

// TestTripSize: a trip is allocated once per request, in the runtime's
// size class of 1,792 bytes. A field that pushes it past (a probe token
// held in every candidate by value did) costs every request 256 bytes
// more (the 2,048-byte class): keep it under, or move the field out.
func TestTripSize(t *testing.T) {
	assert.LessOrEqual(t, unsafe.Sizeof(trip{}), uintptr(1792))
}

// TestFailedFleetProbeReopensWithoutCounting: with failure counting off
// (Breaker.Failures < 0), a fleet circuit another replica opened still
// opens again, for twice its period, when this replica's probe of it
// fails, instead of staying half-open behind the probe's lock.
func TestFailedFleetProbeReopensWithoutCounting(t *testing.T) {
	clock := newFakeClock()
	st := newMemState()
	r, err := New(Config{
		Base: roundTripFunc(func(req *http.Request) (*http.Response, error) {
			io.Copy(io.Discard, req.Body)
			return &http.Response{StatusCode: 503, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(`{}`))}, nil
		}),
		Clock: clock, State: st, StateTimeout: time.Second,
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
		Breaker:   BreakerConfig{Failures: -1, Cooldown: 30 * time.Second, P99: -1},
		Retry:     RetryConfig{MaxAttempts: 1},
	})
	require.NoError(t, err)
	require.NoError(t, st.Open(context.Background(), "a", clock.Now().Add(30*time.Second), clock.Now()))
	clock.Advance(31 * time.Second) // half-open: this replica claims the probe
	resp, _, err := send(t, r, chatBody("gpt-4.1", "x"))
	require.NoError(t, err)
	require.Equal(t, 503, resp.StatusCode, "the probe failed")
	assert.Equal(t, clock.Now().Add(60*time.Second), openUntil(t, st, "a", clock.Now()),
		"the failed probe opened the circuit again for twice the period")
}
