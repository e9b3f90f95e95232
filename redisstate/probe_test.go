package redisstate

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenrelay/relay"
)

// lapse ends key's TTL now, as if its time had run out: miniredis moves
// its clock by ttl; a real server is given an expiry time in the past,
// which it applies at once. No test waits in real time for a key to
// expire.
func lapse(t *testing.T, b *backend, key string, ttl time.Duration) {
	t.Helper()
	if b.mini != nil {
		b.mini.FastForward(ttl)
	} else {
		noErr(t, b.c.PExpireAt(ctxT(t), key, time.UnixMilli(1)).Err())
	}
	if n := must[int64](t)(b.c.Exists(ctxT(t), key).Result()); n != 0 {
		t.Fatalf("%s outlived its TTL", key)
	}
}

// statusBase answers every call with its status; a gated call first
// tells that it arrived, then waits for its release.
type statusBase struct {
	mu     sync.Mutex
	status int
	gate   chan struct{} // nil: calls answer at once
	sent   chan struct{}
	calls  atomic.Int64
}

// set makes the calls from now on answer status; with gated, each waits
// until release is called, and arrived receives a value as each comes.
func (b *statusBase) set(status int, gated bool) (arrived <-chan struct{}, release func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.status, b.gate, b.sent = status, nil, nil
	if !gated {
		return nil, func() {}
	}
	b.gate, b.sent = make(chan struct{}), make(chan struct{}, 1)
	gate := b.gate
	return b.sent, func() { close(gate) }
}

func (b *statusBase) RoundTrip(r *http.Request) (*http.Response, error) {
	io.Copy(io.Discard, r.Body)
	r.Body.Close()
	b.calls.Add(1)
	b.mu.Lock()
	status, gate, sent := b.status, b.gate, b.sent
	b.mu.Unlock()
	if gate != nil {
		sent <- struct{}{}
		<-gate
	}
	body := `{"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":8,"completion_tokens":2}}`
	return &http.Response{StatusCode: status, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(strings.NewReader(body)), Request: r}, nil
}

// probeRouter is a replica over upstream a sharing s, on clock, whose
// breaker tolerates 2 failures and cools down for 30 s; at the end of the
// test it checks that no State call fell back.
func probeRouter(t *testing.T, s *State, clock *fleetClock, base http.RoundTripper) *relay.Router {
	return probeRouterCounting(t, s, clock, base, 2)
}

// staleProbe opens the fleet's circuit of upstream a (another replica's
// reason) and lets its cooldown end: half-open. Replica ra then claims the
// probe with a slow call (its base says on arrived when the call is
// there), and the claim's lock runs out (the router's probe TTL, 10 s)
// while it waits. It returns ra's result.
func staleProbe(t *testing.T, b *backend, s *State, clock *fleetClock, ra *relay.Router, arrived <-chan struct{}) <-chan error {
	noErr(t, s.Open(ctxT(t), "a", t0.Add(30*time.Second)))
	clock.at(31 * time.Second)
	done := make(chan error, 1)
	go func() { _, err := send(ra, "probe A"); done <- err }()
	<-arrived
	lapse(t, b, s.keys("a").probe(), 10*time.Second)
	return done
}

// openFor reports whether the fleet keeps upstream a out at now.
func openFor(t *testing.T, s *State, now time.Time) bool {
	t.Helper()
	v := must[relay.Verdict](t)(s.Admit(ctxT(t), relay.Limits{Name: "a"}, 0, false, now))
	return v.Open && v.Until.After(now)
}

// TestStaleProbeDoesNotCloseFleet: replica A claims the half-open probe
// and its call outlives the claim's TTL; replica B then claims the probe,
// B's probe fails and the circuit opens again for the fleet. A's probe
// succeeding afterwards must not close the circuit: its claim is stale.
// Two routers over one State, as two replicas; the lock's expiry is the
// server's own (lapse), the time the routers' fake clock.
func TestStaleProbeDoesNotCloseFleet(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		s := b.state(t, WithClock(func() time.Time { return t0 }))
		clock := newFleetClock()
		slow, failing := &statusBase{}, &statusBase{}
		arrived, release := slow.set(200, true)
		failing.set(500, false)
		ra, rb := probeRouter(t, s, clock, slow), probeRouter(t, s, clock, failing)

		done := staleProbe(t, b, s, clock, ra, arrived)

		// B claims the probe, which fails: the circuit opens again.
		if status, err := send(rb, "probe B"); err != nil || status != 500 {
			t.Fatalf("B's probe: %d, %v; want the upstream's 500", status, err)
		}
		if n := failing.calls.Load(); n != 1 {
			t.Fatalf("B sent %d calls, want its one probe", n)
		}
		if !openFor(t, s, clock.Now()) {
			t.Fatal("B's failed probe did not open the circuit again")
		}

		// A's stale probe succeeds.
		release()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if !openFor(t, s, clock.Now()) {
			t.Fatal("A's stale probe closed the circuit for the fleet (B's failed probe is the newer)")
		}
	})
}

// TestLocalProbeDoesNotCloseFleet: the probe of a replica's own breaker,
// admitted while the fleet's circuit was closed, claimed nothing: its
// success must not close the circuit that another replica opened for the
// fleet while it was in flight.
func TestLocalProbeDoesNotCloseFleet(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		s := b.state(t, WithClock(func() time.Time { return t0 }))
		clock := newFleetClock()
		ab, bb := &statusBase{}, &statusBase{}
		ab.set(500, false)
		bb.set(200, false)
		ra, rb := probeRouter(t, s, clock, ab), probeRouter(t, s, clock, bb)

		// A's failures open its breaker, and the fleet's circuit.
		for i := range 3 {
			send(ra, fmt.Sprintf("failure %d", i))
		}
		if !openFor(t, s, clock.Now()) {
			t.Fatal("A's failures did not open the fleet's circuit")
		}
		// After the cooldown, B's probe closes the fleet's circuit; A's own
		// breaker is half-open still.
		clock.at(31 * time.Second)
		if status, err := send(rb, "probe B"); err != nil || status != 200 {
			t.Fatalf("B's probe: %d, %v", status, err)
		}
		if openFor(t, s, clock.Now()) {
			t.Fatal("B's probe did not close the fleet's circuit")
		}

		// A's breaker sends its probe, slow; meanwhile another replica
		// opens the fleet's circuit.
		arrived, release := ab.set(200, true)
		done := make(chan error, 1)
		go func() { _, err := send(ra, "probe A"); done <- err }()
		<-arrived
		noErr(t, s.Open(ctxT(t), "a", clock.Now().Add(30*time.Second)))
		release()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if !openFor(t, s, clock.Now()) {
			t.Fatal("A's own breaker's probe closed the fleet's circuit, which it never claimed")
		}
	})
}

// TestProbeToken: a probe's success closes the circuit only while its
// claim belongs to the current open period. Replica A claims the probe,
// and its lock runs out (lapse) while A's probe is in flight; then each
// case happens, and A's probe succeeds.
func TestProbeToken(t *testing.T) {
	const ttl = 10 * time.Second
	u := relay.Limits{Name: "a"}
	half := t0.Add(31 * time.Second)
	claimB := func(t *testing.T, s *State) string {
		b := must[string](t)(s.Probe(ctxT(t), "a", ttl))
		if b == "" {
			t.Fatal("B lost the probe after A's lock ran out")
		}
		return b
	}
	cases := []struct {
		name string
		// then returns whether the circuit must stay open after A's
		// success.
		then func(t *testing.T, s *State) (open bool)
	}{
		{"nobody claims after A: its success closes the circuit", func(t *testing.T, s *State) bool {
			return false
		}},
		{"B claims the probe and is in flight: A's success closes the circuit (no failure since)", func(t *testing.T, s *State) bool {
			claimB(t, s)
			return false
		}},
		{"B's probe fails (Failure): the circuit opens again", func(t *testing.T, s *State) bool {
			b := claimB(t, s)
			must[time.Time](t)(s.Failure(ctxT(t), "a", policy, half))
			noErr(t, s.Success(ctxT(t), "a", b)) // B's claim ended with its open period too
			return true
		}},
		{"a replica opens the circuit again (Open)", func(t *testing.T, s *State) bool {
			noErr(t, s.Open(ctxT(t), "a", half.Add(time.Minute)))
			return true
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			both(t, func(t *testing.T, b *backend) {
				s := b.state(t, WithClock(func() time.Time { return t0 }))
				ctx := ctxT(t)
				noErr(t, s.Open(ctx, "a", t0.Add(30*time.Second)))
				if v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, half)); !v.Open || v.Until.After(half) {
					t.Fatalf("%+v, want half-open", v)
				}
				a := must[string](t)(s.Probe(ctx, "a", ttl))
				if a == "" {
					t.Fatal("A lost the probe")
				}
				lapse(t, b, s.keys("a").probe(), ttl)
				if v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, half)); !v.Open || v.Until.After(half) {
					t.Fatalf("after A's lock ran out: %+v, want half-open", v)
				}
				wantOpen := c.then(t, s)
				noErr(t, s.Success(ctx, "a", a))
				v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, half))
				if v.Open != wantOpen {
					t.Fatalf("after A's success: %+v, want open %v", v, wantOpen)
				}
				if !wantOpen {
					if keys := b.keysUnder(t, s); len(keys) != 0 {
						t.Fatalf("keys left after the close: %v", keys)
					}
					return
				}
				// The circuit's new open period ends; a new claim's
				// success closes it.
				later := half.Add(2 * time.Minute)
				if v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, later)); !v.Open || v.Until.After(later) {
					t.Fatalf("%+v, want half-open again", v)
				}
				c := must[string](t)(s.Probe(ctx, "a", ttl))
				if c == "" {
					t.Fatal("no replica could claim the new period's probe")
				}
				noErr(t, s.Success(ctx, "a", c))
				if v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, later)); !v.Taken {
					t.Fatalf("the new claim's success did not close the circuit: %+v", v)
				}
			})
		})
	}
}
