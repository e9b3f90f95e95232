package relay

import (
	"context"
	"errors"
	"io"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
)

// memState is a State in memory that several routers share, as replicas
// share one on Redis: the reference semantics for the router's side.
type memState struct {
	Ledger
	mu      sync.Mutex
	rpm     map[string]*rate.Limiter
	tpm     map[string]*rate.Limiter
	hold    map[string]time.Time
	open    map[string]time.Time
	fails   map[string]int
	probe   map[string]string          // the token holding the probe lock; "": none (the lock ends with lapse)
	claim   map[string]map[string]bool // the tokens claimed in the open period, which a success may close with
	claims  atomic.Int64               // tokens handed out
	admits  atomic.Int64
	failing atomic.Bool // every call fails, as when Redis is down
}

func newMemState() *memState {
	return &memState{Ledger: NewLocalLedger(), rpm: map[string]*rate.Limiter{}, tpm: map[string]*rate.Limiter{},
		hold: map[string]time.Time{}, open: map[string]time.Time{}, fails: map[string]int{}, probe: map[string]string{},
		claim: map[string]map[string]bool{}}
}

var errDown = errors.New("state down")

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (m *memState) bucket(set map[string]*rate.Limiter, name string, perMin int) *rate.Limiter {
	if perMin <= 0 {
		return nil
	}
	if set[name] == nil {
		set[name] = rate.NewLimiter(rate.Limit(float64(perMin)/60), perMin)
	}
	return set[name]
}

func (m *memState) Admit(_ context.Context, u Limits, tpm int, force bool, now time.Time) (Verdict, error) {
	if m.failing.Load() {
		return Verdict{}, errDown
	}
	m.admits.Add(1)
	m.mu.Lock()
	defer m.mu.Unlock()
	if until, ok := m.open[u.Name]; ok && !force {
		if until.After(now) || m.probe[u.Name] != "" {
			return Verdict{Open: true, Until: later(until, now.Add(time.Second))}, nil
		}
		return Verdict{Open: true, Until: until}, nil
	}
	if h := m.hold[u.Name]; h.After(now) {
		return Verdict{Wait: h.Sub(now)}, nil
	}
	r, t := m.bucket(m.rpm, u.Name, u.RPM), m.bucket(m.tpm, u.Name, u.TPM)
	if t != nil {
		tpm = min(tpm, t.Burst())
	}
	wait := max(bucketDelay(r, now, 1), bucketDelay(t, now, tpm))
	if wait > 0 {
		return Verdict{Wait: wait}, nil
	}
	if r != nil {
		r.AllowN(now, 1)
	}
	if t != nil {
		t.AllowN(now, tpm)
	}
	return Verdict{Taken: true, Failing: m.fails[u.Name] > 0}, nil
}

func (m *memState) Refund(_ context.Context, u Limits, requests, tokens int, now time.Time) error {
	if m.failing.Load() {
		return errDown
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if r := m.bucket(m.rpm, u.Name, u.RPM); r != nil && requests > 0 {
		r.AllowN(now, -requests)
	}
	if t := m.bucket(m.tpm, u.Name, u.TPM); t != nil && tokens > 0 {
		t.AllowN(now, -tokens)
	}
	return nil
}

func (m *memState) Hold(_ context.Context, name string, until time.Time) error {
	if m.failing.Load() {
		return errDown
	}
	m.mu.Lock()
	m.hold[name] = later(m.hold[name], until)
	m.mu.Unlock()
	return nil
}

// Failure counts a failure while the circuit is closed; while it is open
// it counts none; half-open (its open period over), a failure (a probe's,
// or a forced attempt's) opens it again, as on Redis.
func (m *memState) Failure(_ context.Context, name string, p CircuitPolicy, now time.Time) (time.Time, error) {
	if m.failing.Load() {
		return time.Time{}, errDown
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	until, open := m.open[name]
	switch {
	case open && until.After(now):
		return until, nil
	case !open:
		m.fails[name]++
		if m.fails[name] <= p.Failures {
			return time.Time{}, nil
		}
	}
	m.reopen(name, now.Add(p.Cooldown))
	return m.open[name], nil
}

// reopen starts an open period until until: the run ends, and so does
// every claim on the probe of the period before.
func (m *memState) reopen(name string, until time.Time) {
	m.open[name], m.fails[name] = until, 0
	delete(m.probe, name)
	delete(m.claim, name)
}

// Success closes the circuit for a probe claimed in the open period, and
// only ends the failure run for anyone else.
func (m *memState) Success(_ context.Context, name string, probe string) error {
	if m.failing.Load() {
		return errDown
	}
	m.mu.Lock()
	m.fails[name] = 0
	if probe != "" && m.claim[name][probe] {
		delete(m.open, name)
		delete(m.probe, name)
		delete(m.claim, name)
	}
	m.mu.Unlock()
	return nil
}

func (m *memState) Open(_ context.Context, name string, until time.Time) error {
	if m.failing.Load() {
		return errDown
	}
	m.mu.Lock()
	if old, ok := m.open[name]; !ok || until.After(old) {
		m.reopen(name, until)
	}
	m.mu.Unlock()
	return nil
}

func (m *memState) Probe(_ context.Context, name string, _ time.Duration) (string, error) {
	if m.failing.Load() {
		return "", errDown
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, open := m.open[name]; !open || m.probe[name] != "" {
		return "", nil
	}
	token := strconv.FormatInt(m.claims.Add(1), 10)
	m.probe[name] = token
	if m.claim[name] == nil {
		m.claim[name] = map[string]bool{}
	}
	m.claim[name][token] = true
	return token, nil
}

// lapse ends the probe lock of name as its TTL would: the claim stays one
// of the open period's.
func (m *memState) lapse(name string) {
	m.mu.Lock()
	delete(m.probe, name)
	m.mu.Unlock()
}

// fleet is n routers sharing one State over one in-memory upstream that
// counts its calls.
type fleet struct {
	routers []*Router
	calls   atomic.Int64
	status  atomic.Int32
	reps    *reports
}

func newFleet(t *testing.T, n int, st State, clock Clock, up Upstream) *fleet {
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
			Retry: RetryConfig{MaxAttempts: 1}, Limits: LimitConfig{MaxWait: -1}, StateTimeout: time.Second}
		if st != nil {
			cfg.State = st
		}
		r, err := New(cfg)
		require.NoError(t, err)
		f.routers = append(f.routers, r)
	}
	return f
}

func (f *fleet) send(i int) error {
	req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
	resp, err := f.routers[i%len(f.routers)].RoundTrip(req)
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return err
}

// TestSharedStateOneLimitForTheFleet: four replicas share an upstream's RPM
// of 120: within the minute the upstream receives 120 requests, not 480 as
// with per-process state.
func TestSharedStateOneLimitForTheFleet(t *testing.T) {
	for _, shared := range []bool{true, false} {
		clock := newFakeClock()
		var st State
		if shared {
			st = newMemState()
		}
		f := newFleet(t, 4, st, clock, Upstream{Name: "a", BaseURL: "http://a.test/v1", RPM: 120})
		var wg sync.WaitGroup
		var ok atomic.Int64
		for g := range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 400 / 32 {
					if f.send(g+i*32) == nil {
						ok.Add(1)
					}
				}
			}()
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

// TestSharedStateDownFallsBack: with the State down, every request still
// completes, decided in-process with the limit divided by Replicas; the
// reports and the counter say so; when it answers again, it decides again.
func TestSharedStateDownFallsBack(t *testing.T) {
	clock := newFakeClock()
	st := newMemState()
	st.failing.Store(true)
	f := newFleet(t, 4, st, clock, Upstream{Name: "a", BaseURL: "http://a.test/v1", RPM: 120})
	for i := range 200 {
		f.send(i)
	}
	assert.EqualValues(t, 4*30, f.calls.Load(), "RPM/Replicas per replica while the State is down")
	for _, rep := range f.reps.all() {
		assert.True(t, rep.StateFallback)
	}
	assert.Positive(t, f.routers[0].StateFallbacks())
	st.failing.Store(false)
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
	assert.Positive(t, st.admits.Load())
}

// TestSharedStateBreaker: failures seen by one replica open the circuit for
// the fleet; the others stay off the upstream; in half-open one replica
// probes, and its success re-admits the upstream for all.
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
	st.mu.Lock()
	openUntil := st.open["a"]
	st.mu.Unlock()
	require.False(t, openUntil.IsZero(), "the fleet's circuit is open")
	clock.Advance(31 * time.Second)
	f.status.Store(200)
	// Half-open: one probe for the fleet.
	var won atomic.Int64
	for i := range 4 {
		v, err := st.Admit(context.Background(), limitsOf(f.routers[i].ups[0]), 1, false, clock.Now())
		require.NoError(t, err)
		if v.Open && !v.Until.After(clock.Now()) {
			if token, _ := st.Probe(context.Background(), "a", time.Second); token != "" {
				won.Add(1)
			}
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
	var routers []*Router
	for range 4 {
		r, err := New(Config{Base: base, Clock: clock, State: st, Replicas: 4, Strategy: StrategyPriority, Retry: RetryConfig{MaxAttempts: 1},
			Upstreams: []Upstream{{Name: "sick", BaseURL: "http://sick.test/v1"}, {Name: "well", BaseURL: "http://well.test/v1"}}})
		require.NoError(t, err)
		routers = append(routers, r)
	}
	send := func(r *Router) {
		req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
		if resp, err := r.RoundTrip(req); err == nil {
			resp.Body.Close()
		}
	}
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

// TestSharedStateBudgetAcrossReplicas: four replicas, one budget: no
// overspend.
func TestSharedStateBudgetAcrossReplicas(t *testing.T) {
	st := newMemState()
	base := &usageBase{gate: make(chan struct{}), prompt: 8, completion: 10}
	var routers []*Router
	for range 4 {
		r, err := New(Config{Base: base, State: st, Replicas: 4, Prices: budgetPrices, Retry: RetryConfig{MaxAttempts: 1},
			Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
			Budgets:   []Budget{{Name: "cap", Limit: 10 * 18, Window: Window{Every: time.Hour}}}})
		require.NoError(t, err)
		routers = append(routers, r)
	}
	var wg sync.WaitGroup
	var refused atomic.Int64
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := routers[i%4].RoundTrip(budgetRequest(context.Background(), "m", ""))
			if err != nil {
				refused.Add(1)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
	}
	require.Eventually(t, func() bool { return refused.Load() == 90 && base.calls.Load() == 10 }, 10*time.Second, time.Millisecond)
	close(base.gate)
	wg.Wait()
	assert.InDelta(t, 10*18.0, routers[0].Spend()[0].Spent, 1e-9, "the fleet's spend, seen from any replica")
}

// scriptedState answers Admit with admit (the rest as memState); Probe
// always loses: another replica probes.
type scriptedState struct {
	*memState
	admit func(u Limits, force bool, now time.Time) Verdict
}

func (s *scriptedState) Admit(_ context.Context, u Limits, _ int, force bool, now time.Time) (Verdict, error) {
	return s.admit(u, force, now), nil
}

func (s *scriptedState) Probe(context.Context, string, time.Duration) (string, error) {
	return "", nil
}

// hostsRouter is a router over upstreams a and b (tried in that order)
// sharing st, on an auto clock, whose calls are counted by host.
func hostsRouter(t *testing.T, st State, limits Limits) (*Router, func() map[string]int) {
	var mu sync.Mutex
	calls := map[string]int{}
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		mu.Lock()
		calls[r.URL.Host]++
		mu.Unlock()
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(`{}`))}, nil
	})
	r, err := New(Config{Base: base, Clock: newAutoClock(), State: st, StateTimeout: time.Second, Strategy: StrategyPriority,
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1", RPM: limits.RPM}, {Name: "b", BaseURL: "http://b.test/v1", RPM: limits.RPM}},
		Limits:    LimitConfig{MaxWait: time.Second}})
	require.NoError(t, err)
	return r, func() map[string]int { mu.Lock(); defer mu.Unlock(); return maps.Clone(calls) }
}

// TestFleetOpenedDuringWaitTriesOthers: a request waits for a's tokens (the
// sooner of the two); meanwhile the fleet opens a's circuit. It goes to b,
// whose tokens come later, instead of failing.
func TestFleetOpenedDuringWaitTriesOthers(t *testing.T) {
	var start time.Time
	st := &scriptedState{memState: newMemState(), admit: func(u Limits, _ bool, now time.Time) Verdict {
		if start.IsZero() {
			start = now
		}
		el := now.Sub(start)
		switch {
		case u.Name == "a" && el < 100*time.Millisecond:
			return Verdict{Wait: 100*time.Millisecond - el}
		case u.Name == "a":
			return Verdict{Open: true, Until: now.Add(time.Minute)}
		case el < 200*time.Millisecond:
			return Verdict{Wait: 200*time.Millisecond - el}
		}
		return Verdict{Taken: true}
	}}
	r, calls := hostsRouter(t, st, Limits{RPM: 10})
	resp, _, err := send(t, r, chatBody("gpt-4.1", "x"))
	require.NoError(t, err)
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, map[string]int{"b.test": 1}, calls())
}

// TestAllOpenForTheFleetForcesSoonest: when every candidate's circuit is
// open for the fleet (this replica's breakers are closed), the one that
// recovers soonest is tried once, as when they are open in-process.
func TestAllOpenForTheFleetForcesSoonest(t *testing.T) {
	st := &scriptedState{memState: newMemState(), admit: func(u Limits, force bool, now time.Time) Verdict {
		switch {
		case force:
			return Verdict{Taken: true}
		case u.Name == "b":
			return Verdict{Open: true, Until: now.Add(time.Second)}
		}
		return Verdict{Open: true, Until: now.Add(time.Minute)}
	}}
	r, calls := hostsRouter(t, st, Limits{})
	resp, _, err := send(t, r, chatBody("gpt-4.1", "x"))
	require.NoError(t, err)
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, map[string]int{"b.test": 1}, calls())
}

// TestTurnsOrder: the head of a replica's turns for the fleet's limits is
// the highest priority, then the first come; a request of higher priority
// takes the head from one that had it, which gets it back after.
func TestTurnsOrder(t *testing.T) {
	clock := newFakeClock()
	var q turns
	deadline := clock.Now().Add(time.Hour)
	low, mid, high := &waiter{prio: PriorityBatch}, &waiter{prio: 0}, &waiter{prio: PriorityInteractive}
	q.join(mid)
	waited, err := q.await(context.Background(), clock, mid, deadline, ErrRateLimited)
	require.NoError(t, err)
	assert.False(t, waited, "alone, it is the head at once")
	q.join(low)
	q.join(high)
	assert.True(t, q.head(high))
	order := make(chan *waiter, 3)
	var wg sync.WaitGroup
	for _, w := range []*waiter{low, mid, high} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := q.await(context.Background(), clock, w, deadline, ErrRateLimited)
			assert.NoError(t, err)
			order <- w
			q.leave(w) // served: the next one's turn
		}()
	}
	wg.Wait()
	close(order)
	var got []Priority
	for w := range order {
		got = append(got, w.prio)
	}
	assert.Equal(t, []Priority{PriorityInteractive, 0, PriorityBatch}, got)
	assert.Zero(t, q.n.Load())
}

// TestTurnsWaitIsBounded: a request waiting behind others gives up at its
// deadline (tooLong) or when its context ends, and leaves the queue.
func TestTurnsWaitIsBounded(t *testing.T) {
	clock := newFakeClock()
	var q turns
	head, behind := &waiter{}, &waiter{}
	q.join(head)
	q.join(behind)
	errc := make(chan error, 1)
	go func() {
		_, err := q.await(context.Background(), clock, behind, clock.Now().Add(time.Second), ErrRateLimited)
		q.leave(behind)
		errc <- err
	}()
	require.Equal(t, time.Second, <-clock.armed)
	clock.Advance(time.Second)
	assert.ErrorIs(t, <-errc, ErrRateLimited)

	ctx, cancel := context.WithCancel(context.Background())
	q.join(behind)
	go func() {
		_, err := q.await(ctx, clock, behind, clock.Now().Add(time.Hour), ErrRateLimited)
		q.leave(behind)
		errc <- err
	}()
	<-clock.armed
	cancel()
	assert.ErrorIs(t, <-errc, context.Canceled)
	assert.True(t, q.head(head))
	assert.EqualValues(t, 1, q.n.Load())
	q.leave(head)
	assert.Zero(t, q.n.Load())
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

func newProbeReplica(t *testing.T, st State, clock Clock, status int, gated bool) *probeReplica {
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
// its call outlives the claim (the lock's TTL ends); replica B claims the
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
		require.NoError(t, st.Open(context.Background(), "a", clock.Now().Add(30*time.Second)))
		clock.Advance(31 * time.Second) // half-open
		aDone := a.start()              // A probes; its call is slow
		st.lapse("a")                   // and outlives its claim
		return st, clock, a, b, aDone
	}
	openFor := func(st *memState, now time.Time) bool {
		v, err := st.Admit(context.Background(), Limits{Name: "a"}, 0, false, now)
		return err == nil && v.Open && v.Until.After(now)
	}

	t.Run("newer probe failed", func(t *testing.T) {
		st, clock, a, b, aDone := setup(t, 503, false)
		resp, _, err := send(t, b, chatBody("gpt-4.1", "x"))
		require.NoError(t, err)
		require.Equal(t, 503, resp.StatusCode, "B's probe")
		require.EqualValues(t, 1, b.calls.Load())
		require.True(t, openFor(st, clock.Now()), "B's failed probe opened the circuit again")
		close(a.gate)
		require.NoError(t, <-aDone)
		assert.True(t, openFor(st, clock.Now()), "A's stale probe closed the circuit B's failed probe opened")
	})

	t.Run("newer probe in flight", func(t *testing.T) {
		st, clock, a, b, aDone := setup(t, 200, true)
		bDone := b.start()
		close(a.gate)
		require.NoError(t, <-aDone)
		assert.False(t, openFor(st, clock.Now()), "A's probe, slower than its lock, succeeded with no failure since: the circuit closes")
		close(b.gate)
		require.NoError(t, <-bDone)
		assert.False(t, openFor(st, clock.Now()), "B's success leaves it closed")
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
// opens again for the cooldown when this replica's probe of it fails,
// instead of staying half-open behind the probe's lock.
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
	require.NoError(t, st.Open(context.Background(), "a", clock.Now().Add(30*time.Second)))
	clock.Advance(31 * time.Second) // half-open: this replica claims the probe
	resp, _, err := send(t, r, chatBody("gpt-4.1", "x"))
	require.NoError(t, err)
	require.Equal(t, 503, resp.StatusCode, "the probe failed")
	v, err := st.Admit(context.Background(), Limits{Name: "a"}, 0, false, clock.Now())
	require.NoError(t, err)
	assert.True(t, v.Open && v.Until.Equal(clock.Now().Add(30*time.Second)),
		"the failed probe opened the circuit again for the cooldown: %+v", v)
}
