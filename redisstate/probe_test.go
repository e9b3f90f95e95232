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
	"github.com/tokenrelay/relay/store"
)

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
func staleProbe(t *testing.T, s *State, clock *fleetClock, ra *relay.Router, arrived <-chan struct{}) <-chan error {
	noErr(t, s.Open(ctxT(t), "a", t0.Add(30*time.Second), t0))
	clock.at(31 * time.Second)
	done := make(chan error, 1)
	go func() { _, err := send(ra, "probe A"); done <- err }()
	<-arrived
	clock.advance(11 * time.Second)
	return done
}

// openFor reports whether the fleet keeps upstream a out at now.
func openFor(t *testing.T, s *State, now time.Time) bool {
	t.Helper()
	v := must[store.Verdict](t)(s.Admit(ctxT(t), store.Limits{Name: "a"}, store.Ask{}, now))
	return v.Open && v.Until.After(now)
}

// TestStaleProbeDoesNotCloseFleet: replica A claims the half-open probe
// and its call outlives the claim's TTL; replica B then claims the probe,
// B's probe fails and the circuit opens again for the fleet. A's probe
// succeeding afterwards must not close the circuit: its claim is stale.
// Two routers over one State, as two replicas, on a fake clock.
func TestStaleProbeDoesNotCloseFleet(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		s := b.state(t)
		clock := newFleetClock()
		slow, failing := &statusBase{}, &statusBase{}
		arrived, release := slow.set(200, true)
		failing.set(500, false)
		ra, rb := probeRouter(t, s, clock, slow), probeRouter(t, s, clock, failing)

		done := staleProbe(t, s, clock, ra, arrived)

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
		s := b.state(t)
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
		noErr(t, s.Open(ctxT(t), "a", clock.Now().Add(30*time.Second), clock.Now()))
		release()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if !openFor(t, s, clock.Now()) {
			t.Fatal("A's own breaker's probe closed the fleet's circuit, which it never claimed")
		}
	})
}
