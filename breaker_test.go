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

// call runs one attempt through the breaker: allow, then done with the
// outcome. It reports whether the breaker let it through.
func (g *breakerRig) call(o outcome, latency time.Duration, hint time.Duration) bool {
	now := g.clock.Now()
	tk, ok := g.u.br.allow(now, false, nil)
	if !ok {
		return false
	}
	g.u.lat.add(latency, now)
	g.u.br.done(tk, o, hint, &g.u.lat, now, nil)
	return true
}

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
				assert.Equal(t, s.state, g.u.br.stateAt(g.clock.Now()), "step %d state", i)
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
	assert.Equal(t, StateClosed, g.u.br.stateAt(g.clock.Now()), "not before MinSamples")
	g.call(outcomeSuccess, 3*time.Second, 0)
	assert.Equal(t, StateOpen, g.u.br.stateAt(g.clock.Now()))
	assert.Zero(t, g.u.lat.count(), "window reset on opening")
	g.clock.Advance(30 * time.Second)
	assert.True(t, g.call(outcomeSuccess, 10*time.Millisecond, 0), "probe")
	assert.Equal(t, StateClosed, g.u.br.stateAt(g.clock.Now()))
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
	tk, ok := g.u.br.allow(now, false, nil)
	require.True(t, ok)
	assert.True(t, tk.probe)
	_, ok = g.u.br.allow(now, false, nil)
	assert.False(t, ok, "second request while the probe is in flight")
	// A stale outcome from before the state change is ignored.
	g.u.br.done(ticket{gen: tk.gen - 2}, outcomeFailure, 0, &g.u.lat, now, nil)
	assert.Equal(t, StateHalfOpen, g.u.br.stateAt(now))
	g.u.br.done(tk, outcomeSuccess, 0, &g.u.lat, now, nil)
	assert.Equal(t, StateClosed, g.u.br.stateAt(now))
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
	assert.Equal(t, StateOpen, r.byName["dead"].br.stateAt(clock.Now()))

	srvs[0].SetDefault(relaytest.Fault{})
	clock.Advance(31 * time.Second)
	resp, _, err := send(t, r, chatBody("gpt-4.1", "x"))
	require.NoError(t, err)
	assert.Equal(t, "dead", resp.Header.Get(HeaderUpstream), "the probe went to the recovered region")
	assert.Equal(t, StateClosed, r.byName["dead"].br.stateAt(clock.Now()))
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
	require.Equal(t, StateOpen, r.byName["a"].br.stateAt(now))
	require.Equal(t, StateOpen, r.byName["b"].br.stateAt(now))
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
	require.Equal(t, StateOpen, r.byName["a"].br.stateAt(clock.Now()))
	assert.Empty(t, r.Probe(context.Background()), "cooldown not over")
	clock.Advance(time.Minute)
	assert.Equal(t, StateOpen, r.byName["a"].br.stateAt(clock.Now()), "with a probe path, no user request is the probe")
	srvs[0].SetDefault(relaytest.Fault{})
	assert.Equal(t, []string{"a"}, r.Probe(context.Background()))
	assert.Equal(t, StateClosed, r.byName["a"].br.stateAt(clock.Now()))
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
	assert.Equal(t, StateClosed, r.ups[0].br.stateAt(r.s.clock.Now()), "the caller's own deadline is not the upstream's failure")
}

// A closed breaker lets attempts through and takes their successes without
// its lock (quiet); a success after a failure, a failure, and a success
// with the p99 over its bound still take the locked path: the failures
// that are not consecutive never open it, the ones that are do, and a
// success whose p99 passes the bound opens it at once.
func TestBreakerQuietPath(t *testing.T) {
	g := newBreakerRig(t, BreakerConfig{Failures: 2})
	for range 5 { // fail, fail, succeed: never three in a row
		g.call(outcomeFailure, time.Millisecond, 0)
		assert.False(t, g.u.br.quiet.Load(), "a failure is counted")
		g.call(outcomeFailure, time.Millisecond, 0)
		g.call(outcomeSuccess, time.Millisecond, 0)
		assert.True(t, g.u.br.quiet.Load(), "the success cleared the count")
	}
	g.call(outcomeNeutral, time.Millisecond, 0)
	assert.Equal(t, StateClosed, g.u.br.stateAt(g.clock.Now()))
	for range 3 {
		g.call(outcomeFailure, time.Millisecond, 0)
	}
	assert.Equal(t, StateOpen, g.u.br.stateAt(g.clock.Now()))
	assert.False(t, g.u.br.quiet.Load())

	p := newBreakerRig(t, BreakerConfig{P99: 100 * time.Millisecond, MinSamples: 10})
	for range 9 {
		p.call(outcomeSuccess, time.Second, 0)
	}
	assert.Equal(t, StateClosed, p.u.br.stateAt(p.clock.Now()), "9 samples: below MinSamples")
	p.call(outcomeSuccess, time.Second, 0)
	assert.Equal(t, StateOpen, p.u.br.stateAt(p.clock.Now()), "a success whose p99 is over the bound opens it")
}

// Attempts let through and recorded from many goroutines at once, while
// the breaker is opened again and again (and so probes and closes), leave
// it consistent: quiet is exactly "closed with no failure counted", and
// afterwards consecutive failures open it and a probe's success closes
// it. Run with -race.
func TestBreakerConcurrentOutcomes(t *testing.T) {
	g := newBreakerRig(t, BreakerConfig{Failures: 3, Cooldown: time.Second})
	b := &g.u.br
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				o := []outcome{outcomeSuccess, outcomeSuccess, outcomeNeutral, outcomeFailure}[(i+w)%4]
				g.call(o, time.Millisecond, 0)
			}
		}()
	}
	for range 300 {
		b.mu.Lock()
		b.probing = false // a probe in flight is stale from here on
		b.openLocked("test", time.Second, &g.u.lat, g.clock.Now())
		b.settleLocked()
		b.mu.Unlock()
		g.clock.Advance(2 * time.Second) // its cooldown ends: the next attempt probes
	}
	close(stop)
	wg.Wait()
	require.GreaterOrEqual(t, b.changes.Load(), uint64(300))
	b.mu.Lock()
	assert.Equal(t, b.state == StateClosed && b.fails == 0, b.quiet.Load(), "quiet as the state says")
	b.mu.Unlock()
	g.clock.Advance(2 * time.Second)
	g.call(outcomeSuccess, time.Millisecond, 0) // a probe if open: closes it
	require.Equal(t, StateClosed, b.stateAt(g.clock.Now()))
	for range 4 {
		g.call(outcomeFailure, time.Millisecond, 0)
	}
	assert.Equal(t, StateOpen, b.stateAt(g.clock.Now()))
	g.clock.Advance(2 * time.Second)
	assert.True(t, g.call(outcomeSuccess, time.Millisecond, 0), "the probe")
	assert.Equal(t, StateClosed, b.stateAt(g.clock.Now()))
	assert.True(t, b.quiet.Load())
}
