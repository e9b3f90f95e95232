package redisstate

import (
	"net/http"
	"testing"
	"time"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/store"
)

// probeRouterCounting is probeRouter with failure counting as given.
func probeRouterCounting(t *testing.T, s *State, clock *fleetClock, base http.RoundTripper, failures int) *relay.Router {
	r, err := relay.New(relay.Config{Base: base, Clock: clock, State: s, StateTimeout: time.Second,
		Upstreams: []relay.Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
		Breaker:   relay.BreakerConfig{Failures: failures, Cooldown: 30 * time.Second, P99: -1},
		Retry:     relay.RetryConfig{MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if n := r.StateFallbacks(); n > 0 {
			t.Errorf("%d State calls fell back to in-process state", n)
		}
	})
	return r
}

// TestStaleFailedProbeLeavesClosedCircuit: replica A claims the
// half-open probe and its call outlives the lock; B claims the probe and
// succeeds: the circuit closes for the fleet. Then A's stale probe fails.
// The circuit stays closed, with failure counting on (the failure is
// counted, one of the two tolerated) or off (Breaker.Failures < 0: a
// failed probe reopens only a half-open circuit; it called Open, current
// claim or not).
func TestStaleFailedProbeLeavesClosedCircuit(t *testing.T) {
	for _, failures := range []int{2, -1} {
		name := "counting on (control)"
		if failures < 0 {
			name = "counting off"
		}
		t.Run(name, func(t *testing.T) {
			both(t, func(t *testing.T, b *backend) {
				s := b.state(t)
				clock := newFleetClock()
				slow, ok := &statusBase{}, &statusBase{}
				arrived, release := slow.set(503, true)
				ok.set(200, false)
				ra, rb := probeRouterCounting(t, s, clock, slow, failures), probeRouterCounting(t, s, clock, ok, failures)
				done := staleProbe(t, s, clock, ra, arrived)

				if status, err := send(rb, "probe B"); err != nil || status != 200 {
					t.Fatalf("B's probe: %d, %v", status, err)
				}
				if openFor(t, s, clock.Now()) {
					t.Fatal("B's probe did not close the circuit")
				}
				release()
				if err := <-done; err != nil {
					t.Fatal(err)
				}
				if v := must[store.Verdict](t)(s.Admit(ctxT(t), store.Limits{Name: "a"}, store.Ask{}, clock.Now())); v.Open {
					t.Fatalf("A's stale failed probe opened the circuit B's probe closed: %+v", v)
				}
			})
		})
	}
}
