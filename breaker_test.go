package relay

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay/relaytest"
)

// breakerRig is one upstream's breaker driven step by step with a fake clock.
type breakerRig struct {
	clock  *fakeClock
	r      *Router
	u      *upstream
	mu     sync.Mutex
	events []string
}

func newBreakerRig(t *testing.T, cfg BreakerConfig) *breakerRig {
	rig := &breakerRig{clock: newFakeClock()}
	cfg.OnChange = func(ev BreakerEvent) {
		rig.mu.Lock()
		rig.events = append(rig.events, fmt.Sprintf("%s->%s", ev.From, ev.To))
		rig.mu.Unlock()
	}
	r, err := New(Config{Clock: rig.clock, Breaker: cfg, Upstreams: []Upstream{{Name: "a", BaseURL: "http://127.0.0.1:1"}}})
	require.NoError(t, err)
	rig.r, rig.u = r, r.ups[0]
	return rig
}

func (g *breakerRig) evs() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.events...)
}

// call runs one attempt through the circuit: its admission, then its
// outcome. It reports whether the circuit let it through.
func (g *breakerRig) call(o outcome, latency time.Duration, hint time.Duration) bool {
	now := g.clock.Now()
	c := candidate{up: g.u}
	if _, open := g.u.circ.openUntil(now, false); open {
		return false
	}
	if d, open := g.r.take(context.Background(), admission{tokens: 1}, &c, now); open || d > 0 {
		return false
	}
	g.u.lat.add(latency, now)
	g.r.record(context.Background(), nil, &c, nil, o, hint, now)
	return true
}

// state returns the circuit's state in the router's view.
func (g *breakerRig) state() BreakerState { return stateOf(g.r, g.u, g.clock.Now()) }

func TestBreakerSteps(t *testing.T) {
	const (
		S = outcomeSuccess
		F = outcomeFailure
		N = outcomeNeutral
	)
	type step struct {
		advance time.Duration
		o       outcome
		allowed bool
		state   BreakerState
	}
	cases := []struct {
		name   string
		cfg    BreakerConfig
		steps  []step
		events []string
	}{
		{"opens after more than 5 consecutive failures", BreakerConfig{}, []step{
			{0, F, true, StateClosed}, {0, F, true, StateClosed}, {0, F, true, StateClosed},
			{0, F, true, StateClosed}, {0, F, true, StateClosed},
			{0, F, true, StateOpen}, // the 6th
			{0, S, false, StateOpen},
			{29 * time.Second, S, false, StateOpen},
		}, []string{"closed->open"}},
		{"a success resets the count", BreakerConfig{}, []step{
			{0, F, true, StateClosed}, {0, F, true, StateClosed}, {0, F, true, StateClosed}, {0, F, true, StateClosed},
			{0, F, true, StateClosed}, {0, S, true, StateClosed}, {0, F, true, StateClosed}, {0, F, true, StateClosed},
		}, nil},
		{"4xx and cancellations count neither way", BreakerConfig{Failures: 1}, []step{
			{0, F, true, StateClosed}, {0, N, true, StateClosed}, {0, N, true, StateClosed}, {0, F, true, StateOpen},
		}, []string{"closed->open"}},
		{"half-open probe success closes", BreakerConfig{Failures: 1}, []step{
			{0, F, true, StateClosed}, {0, F, true, StateOpen},
			{30 * time.Second, S, true, StateClosed},
			{0, S, true, StateClosed},
		}, []string{"closed->open", "open->half-open", "half-open->closed"}},
		{"half-open probe failure doubles the cooldown", BreakerConfig{Failures: 1}, []step{
			{0, F, true, StateClosed}, {0, F, true, StateOpen},
			{30 * time.Second, F, true, StateOpen},
			{59 * time.Second, S, false, StateOpen},
			{time.Second, F, true, StateOpen}, // 60 s later: probe again, fails: 120 s
			{119 * time.Second, S, false, StateOpen},
			{time.Second, S, true, StateClosed},
		}, []string{"closed->open", "open->half-open", "half-open->open", "open->half-open", "half-open->open", "open->half-open", "half-open->closed"}},
		{"cooldown capped", BreakerConfig{Failures: 1, Cooldown: time.Minute, MaxCooldown: 90 * time.Second}, []step{
			{0, F, true, StateClosed}, {0, F, true, StateOpen},
			{time.Minute, F, true, StateOpen},
			{90 * time.Second, S, true, StateClosed},
		}, []string{"closed->open", "open->half-open", "half-open->open", "open->half-open", "half-open->closed"}},
		{"failures disabled", BreakerConfig{Failures: -1}, []step{
			{0, F, true, StateClosed}, {0, F, true, StateClosed}, {0, F, true, StateClosed}, {0, F, true, StateClosed},
			{0, F, true, StateClosed}, {0, F, true, StateClosed}, {0, F, true, StateClosed},
		}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := newBreakerRig(t, c.cfg)
			for i, s := range c.steps {
				g.clock.Advance(s.advance)
				allowed := g.call(s.o, 10*time.Millisecond, 0)
				assert.Equal(t, s.allowed, allowed, "step %d allowed", i)
				assert.Equal(t, s.state, g.state(), "step %d state", i)
			}
			assert.Equal(t, c.events, g.evs())
		})
	}
}

func TestBreakerOpensOnP99(t *testing.T) {
	g := newBreakerRig(t, BreakerConfig{P99: time.Second, MinSamples: 20})
	for range 19 {
		g.call(outcomeSuccess, 3*time.Second, 0)
	}
	assert.Equal(t, StateClosed, g.state(), "not before MinSamples")
	g.call(outcomeSuccess, 3*time.Second, 0)
	assert.Equal(t, StateOpen, g.state())
	assert.Zero(t, g.u.lat.count(), "window reset on opening")
	g.clock.Advance(30 * time.Second)
	assert.True(t, g.call(outcomeSuccess, 10*time.Millisecond, 0), "probe")
	assert.Equal(t, StateClosed, g.state())
}

func TestBreakerRetryAfterStretchesCooldown(t *testing.T) {
	g := newBreakerRig(t, BreakerConfig{Failures: 1})
	g.call(outcomeFailure, time.Millisecond, 0)
	g.call(outcomeFailure, time.Millisecond, 2*time.Minute)
	g.clock.Advance(time.Minute)
	assert.False(t, g.call(outcomeSuccess, time.Millisecond, 0), "still open: the hint is longer than the cooldown")
	g.clock.Advance(time.Minute)
	assert.True(t, g.call(outcomeSuccess, time.Millisecond, 0))
}

func TestBreakerOneProbeAtATime(t *testing.T) {
	g := newBreakerRig(t, BreakerConfig{Failures: 1})
	g.call(outcomeFailure, time.Millisecond, 0)
	g.call(outcomeFailure, time.Millisecond, 0)
	g.clock.Advance(30 * time.Second)
	now := g.clock.Now()
	probe := candidate{up: g.u}
	d, open := g.r.take(context.Background(), admission{tokens: 1}, &probe, now)
	require.True(t, d == 0 && !open && probe.probe != nil, "the probe is claimed")
	assert.False(t, g.call(outcomeSuccess, time.Millisecond, 0), "second request while the probe is in flight")
	// A stale outcome, of an attempt that was not the probe, changes nothing.
	g.r.record(context.Background(), nil, &candidate{up: g.u}, nil, outcomeFailure, 0, now)
	assert.Equal(t, StateHalfOpen, g.state())
	g.r.record(context.Background(), nil, &probe, nil, outcomeSuccess, 0, now)
	assert.Equal(t, StateClosed, g.state())
}

func TestOutcomeOf(t *testing.T) {
	for _, c := range []struct {
		status int
		err    error
		want   outcome
	}{
		{200, nil, outcomeSuccess}, {201, nil, outcomeSuccess}, {400, nil, outcomeNeutral}, {404, nil, outcomeNeutral},
		{429, nil, outcomeFailure}, {500, nil, outcomeFailure}, {503, nil, outcomeFailure},
		{0, errors.New("connection refused"), outcomeFailure}, {0, ErrAttemptTimeout, outcomeFailure},
		{0, context.Canceled, outcomeNeutral},
	} {
		var resp *http.Response
		if c.err == nil {
			resp = &http.Response{StatusCode: c.status}
		}
		assert.Equal(t, c.want, outcomeOf(resp, c.err), "%d %v", c.status, c.err)
	}
}

// TestRegionDeadThenBack drives a whole router: one region fails, its
// circuit opens and traffic moves to the other; after the cooldown one
// request probes it and it is back.
func TestRegionDeadThenBack(t *testing.T) {
	srvs := newServers(t, 2)
	srvs[0].SetDefault(relaytest.Fault{Status: 503})
	clock := newAutoClock()
	var mu sync.Mutex
	var events []BreakerEvent
	r, reps := newTestRouter(t, Config{
		Clock: clock,
		Upstreams: []Upstream{
			{Name: "dead", BaseURL: srvs[0].URL},
			{Name: "ok", BaseURL: srvs[1].URL},
		},
		Breaker: BreakerConfig{Failures: 2, OnChange: func(ev BreakerEvent) { mu.Lock(); events = append(events, ev); mu.Unlock() }},
	})
	for range 6 {
		resp, _, err := send(t, r, chatBody("gpt-4.1", "x"))
		require.NoError(t, err)
		require.Equal(t, 200, resp.StatusCode)
	}
	assert.Equal(t, 3, srvs[0].Calls(), "the dead region saw 3 failures, then its circuit opened")
	assert.Equal(t, StateOpen, stateOf(r, r.byName["dead"], clock.Now()))

	srvs[0].SetDefault(relaytest.Fault{})
	clock.Advance(31 * time.Second)
	resp, _, err := send(t, r, chatBody("gpt-4.1", "x"))
	require.NoError(t, err)
	assert.Equal(t, "dead", resp.Header.Get(HeaderUpstream), "the probe went to the recovered region")
	assert.Equal(t, StateClosed, stateOf(r, r.byName["dead"], clock.Now()))
	mu.Lock()
	defer mu.Unlock()
	var trans []string
	for _, ev := range events {
		assert.Equal(t, "dead", ev.Upstream)
		trans = append(trans, ev.From.String()+"->"+ev.To.String())
	}
	assert.Equal(t, []string{"closed->open", "open->half-open", "half-open->closed"}, trans)
	assert.Len(t, reps.all(), 7)
}

func TestAllOpenStillTriesSoonest(t *testing.T) {
	srvs := newServers(t, 2)
	for _, s := range srvs {
		s.SetDefault(relaytest.Fault{Status: 503})
	}
	clock := newAutoClock()
	r, reps := newTestRouter(t, Config{
		Clock:     clock,
		Upstreams: []Upstream{{Name: "a", BaseURL: srvs[0].URL}, {Name: "b", BaseURL: srvs[1].URL}},
		Breaker:   BreakerConfig{Failures: 1, Cooldown: time.Hour},
	})
	for range 2 {
		send(t, r, chatBody("gpt-4.1", "x"))
	}
	now := clock.Now()
	require.Equal(t, StateOpen, stateOf(r, r.byName["a"], now))
	require.Equal(t, StateOpen, stateOf(r, r.byName["b"], now))
	calls := srvs[0].Calls() + srvs[1].Calls()
	resp, _, err := send(t, r, chatBody("gpt-4.1", "x"))
	require.NoError(t, err, "a pool never runs empty: the soonest to recover is tried")
	assert.Equal(t, 503, resp.StatusCode)
	assert.Equal(t, calls+1, srvs[0].Calls()+srvs[1].Calls(), "exactly one try, no spin")
	assert.Equal(t, 1, reps.all()[len(reps.all())-1].Attempts)
}

func TestProbeReadmits(t *testing.T) {
	srvs := newServers(t, 1)
	srvs[0].SetDefault(relaytest.Fault{Status: 500})
	clock := newAutoClock()
	r, _ := newTestRouter(t, Config{
		Clock:     clock,
		Upstreams: []Upstream{{Name: "a", BaseURL: srvs[0].URL}},
		Breaker:   BreakerConfig{Failures: 1, ProbePath: "/models"},
		Retry:     RetryConfig{MaxAttempts: 1},
	})
	send(t, r, chatBody("gpt-4.1", "x"))
	send(t, r, chatBody("gpt-4.1", "x"))
	require.Equal(t, StateOpen, stateOf(r, r.byName["a"], clock.Now()))
	assert.Empty(t, r.Probe(context.Background()), "cooldown not over")
	clock.Advance(time.Minute)
	assert.Equal(t, StateOpen, stateOf(r, r.byName["a"], clock.Now()), "with a probe path, no user request is the probe")
	srvs[0].SetDefault(relaytest.Fault{})
	assert.Equal(t, []string{"a"}, r.Probe(context.Background()))
	assert.Equal(t, StateClosed, stateOf(r, r.byName["a"], clock.Now()))
	last := srvs[0].Requests()[srvs[0].Calls()-1]
	assert.Equal(t, "GET", last.Method)
	assert.Equal(t, "/v1/models", last.Path)
}

func TestCallerDeadlineDoesNotTripBreaker(t *testing.T) {
	srvs := newServers(t, 1)
	srvs[0].SetDefault(relaytest.Fault{Hang: true})
	r, _ := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: srvs[0].URL}}, Breaker: BreakerConfig{Failures: 1}})
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
		_, err := r.RoundTrip(req)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
	}
	assert.Equal(t, StateClosed, stateOf(r, r.ups[0], r.s.clock.Now()), "the caller's own deadline is not the upstream's failure")
}

// A closed circuit lets attempts through; a success after failures ends
// the run: failures that are not consecutive never open it, the ones that
// are do, and a success whose p99 passes the bound opens it at once.
func TestBreakerRunsAndP99(t *testing.T) {
	g := newBreakerRig(t, BreakerConfig{Failures: 2})
	for range 5 { // fail, fail, succeed: never three in a row
		g.call(outcomeFailure, time.Millisecond, 0)
		g.call(outcomeFailure, time.Millisecond, 0)
		g.call(outcomeSuccess, time.Millisecond, 0)
	}
	g.call(outcomeNeutral, time.Millisecond, 0)
	assert.Equal(t, StateClosed, g.state())
	for range 3 {
		g.call(outcomeFailure, time.Millisecond, 0)
	}
	assert.Equal(t, StateOpen, g.state())

	p := newBreakerRig(t, BreakerConfig{P99: 100 * time.Millisecond, MinSamples: 10})
	for range 9 {
		p.call(outcomeSuccess, time.Second, 0)
	}
	assert.Equal(t, StateClosed, p.state(), "9 samples: below MinSamples")
	p.call(outcomeSuccess, time.Second, 0)
	assert.Equal(t, StateOpen, p.state(), "a success whose p99 is over the bound opens it")
}

// Attempts admitted and recorded from many goroutines at once, while the
// circuit is opened again and again (and so probed and closed), leave the
// router's view and the store agreeing; afterwards consecutive failures
// open it and a probe's success closes it. Run with -race.
func TestBreakerConcurrentOutcomes(t *testing.T) {
	g := newBreakerRig(t, BreakerConfig{Failures: 3, Cooldown: time.Second})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				o := []outcome{outcomeSuccess, outcomeSuccess, outcomeNeutral, outcomeFailure}[(i+w)%4]
				g.call(o, time.Millisecond, 0)
			}
		})
	}
	for range 300 {
		now := g.clock.Now()
		openFor(g.r, g.u, now.Add(time.Second), now)
		g.clock.Advance(2 * time.Second) // its cooldown ends: the next attempt probes
	}
	close(stop)
	wg.Wait()
	require.GreaterOrEqual(t, g.u.circ.changes.Load(), uint64(300))
	g.clock.Advance(20 * time.Second)           // past a probe's claim
	g.call(outcomeSuccess, time.Millisecond, 0) // a probe if open: closes it
	require.Equal(t, StateClosed, g.state())
	require.True(t, openUntil(t, g.r.st, "a", g.clock.Now()).IsZero(), "the store agrees")
	for range 4 {
		g.call(outcomeFailure, time.Millisecond, 0)
	}
	assert.Equal(t, StateOpen, g.state())
	g.clock.Advance(2 * time.Second)
	assert.True(t, g.call(outcomeSuccess, time.Millisecond, 0), "the probe")
	assert.Equal(t, StateClosed, g.state())
}
