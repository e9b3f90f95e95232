package redisstate

import (
	"net/http"
	"testing"
	"time"

	"github.com/tokenrelay/relay"
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
				s := b.state(t, WithClock(func() time.Time { return t0 }))
				clock := newFleetClock()
				slow, ok := &statusBase{}, &statusBase{}
				arrived, release := slow.set(503, true)
				ok.set(200, false)
				ra, rb := probeRouterCounting(t, s, clock, slow, failures), probeRouterCounting(t, s, clock, ok, failures)
				done := staleProbe(t, b, s, clock, ra, arrived)

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
				if v := must[relay.Verdict](t)(s.Admit(ctxT(t), relay.Limits{Name: "a"}, 0, false, clock.Now())); v.Open {
					t.Fatalf("A's stale failed probe opened the circuit B's probe closed: %+v", v)
				}
			})
		})
	}
}

// TestClaimSetExpires: every key expires, the claim set too when the
// probe is claimed in the open key's last millisecond, where PTTL answers
// 0 (real Redis as well: a key expires when now > its expiry, and PTTL
// floors what is left; the set was then made without a TTL). miniredis
// only: a test cannot place a call in a real server's last millisecond of
// a key without waiting in real time.
func TestClaimSetExpires(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		if b.mini == nil {
			t.Skip("needs the server's clock placed inside the open key's last millisecond (miniredis FastForward)")
		}
		s := b.state(t, WithClock(func() time.Time { return t0 }))
		ctx := ctxT(t)
		k := s.keys("a")
		noErr(t, s.Open(ctx, "a", t0.Add(30*time.Second)))
		half := t0.Add(31 * time.Second)
		if v := must[relay.Verdict](t)(s.Admit(ctx, relay.Limits{Name: "a"}, 0, false, half)); !v.Open || v.Until.After(half) {
			t.Fatalf("%+v, want half-open", v)
		}
		left := must[time.Duration](t)(b.c.PTTL(ctx, k.open()).Result())
		b.mini.FastForward(left - 500*time.Microsecond) // the open key's last millisecond
		if must[string](t)(s.Probe(ctx, "a", 10*time.Second)) == "" {
			t.Fatal("the probe was not claimed")
		}
		b.mini.FastForward(time.Hour) // the open key and the lock expire
		for _, key := range b.keysUnder(t, s) {
			if ttl := must[time.Duration](t)(b.c.PTTL(ctx, key).Result()); ttl < 0 {
				t.Errorf("%s is left with no TTL (PTTL %v) after its circuit closed", key, ttl)
			}
		}
	})
}
