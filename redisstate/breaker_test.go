package redisstate

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenrelay/relay"
)

var policy = relay.CircuitPolicy{Failures: 2, Cooldown: 30 * time.Second}

// TestBreakerCycle walks one circuit through the fleet's states: closed,
// open after more than Failures failures, half-open, probe claimed,
// closed by the probe's success.
func TestBreakerCycle(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		s := b.state(t)
		ctx := ctxT(t)
		u := relay.Limits{Name: "a", RPM: 100}
		for i := range 2 {
			if until := must[time.Time](t)(s.Failure(ctx, "a", policy, t0)); !until.IsZero() {
				t.Fatalf("failure %d of 2 tolerated opened it until %s", i+1, until)
			}
		}
		if v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, t0)); !v.Taken {
			t.Fatalf("closed circuit: %+v", v)
		}
		until := must[time.Time](t)(s.Failure(ctx, "a", policy, t0.Add(time.Second)))
		if want := t0.Add(31 * time.Second); !until.Equal(want) {
			t.Fatalf("third failure: open until %s, want %s", until, want)
		}
		// Open: nothing is taken, the verdict says until when.
		v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, t0.Add(2*time.Second)))
		if v.Taken || !v.Open || !v.Until.Equal(until) {
			t.Fatalf("open circuit: %+v", v)
		}
		// Failures while open do not count, and return the open end.
		if got := must[time.Time](t)(s.Failure(ctx, "a", policy, t0.Add(3*time.Second))); !got.Equal(until) {
			t.Fatalf("failure while open: %s", got)
		}
		// force passes an open circuit, not the limits.
		if v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, true, t0.Add(2*time.Second))); !v.Taken {
			t.Fatalf("forced through an open circuit: %+v", v)
		}
		// A plain success does not close it.
		noErr(t, s.Success(ctx, "a", ""))
		if v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, t0.Add(3*time.Second))); !v.Open {
			t.Fatalf("a non-probe success closed it: %+v", v)
		}
		// Half-open: Open with the past end; one replica claims the probe.
		half := t0.Add(40 * time.Second)
		v = must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, half))
		if !v.Open || !v.Until.Equal(until) || v.Until.After(half) {
			t.Fatalf("half-open: %+v, want Open with the past end %s", v, until)
		}
		first := must[string](t)(s.Probe(ctx, "a", 10*time.Second))
		if first == "" {
			t.Fatal("the first Probe lost")
		}
		if must[string](t)(s.Probe(ctx, "a", 10*time.Second)) != "" {
			t.Fatal("a second Probe won while the first holds the lock")
		}
		// While the probe is in flight the others see Open until the lock's end.
		v = must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, half))
		if !v.Open || v.Until.Before(half.Add(9*time.Second)) || v.Until.After(half.Add(10*time.Second)) {
			t.Fatalf("while probing: %+v, want Open until about %s", v, half.Add(10*time.Second))
		}
		// The prober admits its probe with force.
		if v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, true, half)); !v.Taken {
			t.Fatalf("the probe: %+v", v)
		}
		// The probe fails: open again for the cooldown, the lock freed.
		reopened := must[time.Time](t)(s.Failure(ctx, "a", policy, half))
		if want := half.Add(policy.Cooldown); !reopened.Equal(want) {
			t.Fatalf("a failure in half-open: open until %s, want %s", reopened, want)
		}
		if v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, half)); !v.Open || !v.Until.Equal(reopened) {
			t.Fatalf("after the failed probe: %+v", v)
		}
		// A replica that saw it half-open before the failed probe does
		// not probe the new open period.
		if must[string](t)(s.Probe(ctx, "a", 10*time.Second)) != "" {
			t.Fatal("a stale half-open view claimed a probe in the new open period")
		}
		// Nor does the failed probe's claim close it.
		noErr(t, s.Success(ctx, "a", first))
		if v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, half)); !v.Open || !v.Until.Equal(reopened) {
			t.Fatalf("the failed probe's token closed the new open period: %+v", v)
		}
		half = reopened.Add(time.Second)
		if v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, half)); !v.Open || v.Until.After(half) {
			t.Fatalf("half-open again: %+v", v)
		}
		second := must[string](t)(s.Probe(ctx, "a", 10*time.Second))
		if second == "" {
			t.Fatal("the failed probe's lock outlived its open period")
		}
		if second == first {
			t.Fatal("two claims got the same token")
		}
		noErr(t, s.Success(ctx, "a", second))
		if v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, half)); !v.Taken {
			t.Fatalf("after the probe's success: %+v", v)
		}
		// Closed again, with a fresh run: two failures are tolerated.
		for range 2 {
			if until := must[time.Time](t)(s.Failure(ctx, "a", policy, half)); !until.IsZero() {
				t.Fatal("the run did not start again after the close")
			}
		}
		if len(b.keysUnder(t, s)) == 0 {
			t.Fatal("no keys under the prefix: the test cleans nothing")
		}
	})
}

// TestFailureRun: a success ends the run; failures tolerated add up only
// across the fleet's calls, and Failures of 0 counts nothing.
func TestFailureRun(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		s := b.state(t)
		ctx := ctxT(t)
		for round := range 3 {
			for range 2 {
				if !must[time.Time](t)(s.Failure(ctx, "a", policy, t0)).IsZero() {
					t.Fatalf("round %d: opened within the tolerated run", round)
				}
			}
			noErr(t, s.Success(ctx, "a", ""))
		}
		// Two replicas' failures make one run.
		other := New(b.c, func(o *State) { o.prefix = s.prefix })
		must[time.Time](t)(s.Failure(ctx, "a", policy, t0))
		must[time.Time](t)(other.Failure(ctx, "a", policy, t0))
		if must[time.Time](t)(s.Failure(ctx, "a", policy, t0)).IsZero() {
			t.Fatal("failures of two replicas did not add up")
		}
		// Counting off.
		for range 10 {
			if !must[time.Time](t)(s.Failure(ctx, "b", relay.CircuitPolicy{Cooldown: time.Second}, t0)).IsZero() {
				t.Fatal("Failures 0 opened the circuit")
			}
		}
		if contains(b.keysUnder(t, s), s.keys("b").fails) {
			t.Fatal("Failures 0 wrote a counter")
		}
	})
}

// TestFailureRunExpires: a run with no failure for WithFailureRun is
// forgotten (miniredis moves its clock on request).
func TestFailureRunExpires(t *testing.T) {
	b := newMini(t)
	s := b.state(t, WithFailureRun(5*time.Second))
	ctx := ctxT(t)
	for range 2 {
		must[time.Time](t)(s.Failure(ctx, "a", policy, t0))
	}
	b.mini.FastForward(6 * time.Second)
	if !must[time.Time](t)(s.Failure(ctx, "a", policy, t0)).IsZero() {
		t.Fatal("a stale run opened the circuit")
	}
	must[time.Time](t)(s.Failure(ctx, "a", policy, t0))
	b.mini.FastForward(4 * time.Second) // each failure renews the run
	if must[time.Time](t)(s.Failure(ctx, "a", policy, t0)).IsZero() {
		t.Fatal("a live run was forgotten")
	}
}

// TestOpen: Open keeps the later end, ends the run and frees the probe.
func TestOpen(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		s := b.state(t, WithClock(func() time.Time { return t0 }))
		ctx := ctxT(t)
		u := relay.Limits{Name: "a"}
		must[time.Time](t)(s.Failure(ctx, "a", policy, t0))
		must[time.Time](t)(s.Failure(ctx, "a", policy, t0))
		noErr(t, s.Open(ctx, "a", t0.Add(20*time.Second)))
		noErr(t, s.Open(ctx, "a", t0.Add(10*time.Second)))
		if v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, t0)); !v.Open || !v.Until.Equal(t0.Add(20*time.Second)) {
			t.Fatalf("%+v, want open until +20s", v)
		}
		// No probe while open; half-open, one; a failed probe opens it
		// again and the next half-open period can be probed at once.
		if must[string](t)(s.Probe(ctx, "a", time.Minute)) != "" {
			t.Fatal("a probe claimed on an open circuit")
		}
		if v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, t0.Add(21*time.Second))); !v.Open || !v.Until.Equal(t0.Add(20*time.Second)) {
			t.Fatalf("%+v, want half-open", v)
		}
		if must[string](t)(s.Probe(ctx, "a", time.Minute)) == "" {
			t.Fatal("probe lost")
		}
		noErr(t, s.Open(ctx, "a", t0.Add(60*time.Second)))
		if v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, t0.Add(61*time.Second))); !v.Open || !v.Until.Equal(t0.Add(60*time.Second)) {
			t.Fatalf("after the new period: %+v, want half-open (past end, no probe)", v)
		}
		token := must[string](t)(s.Probe(ctx, "a", time.Minute))
		if token == "" {
			t.Fatal("the old probe lock outlived a new open period")
		}
		// The run was reset by the open: after a probe's success, two
		// failures are tolerated again.
		noErr(t, s.Success(ctx, "a", token))
		for range 2 {
			if !must[time.Time](t)(s.Failure(ctx, "a", policy, t0)).IsZero() {
				t.Fatal("the run survived the open")
			}
		}
		// The open key lives until the end plus ten minutes (by the clock
		// given to WithClock).
		noErr(t, s.Open(ctx, "c", t0.Add(20*time.Second)))
		pttl := b.c.PTTL(ctx, s.keys("c").open()).Val()
		if want := 10*time.Minute + 20*time.Second; pttl > want || pttl < want-time.Second {
			t.Fatalf("open key TTL %s, want %s", pttl, want)
		}
	})
}

// TestProbeExclusive: of many replicas claiming the probe at once, exactly
// one wins.
func TestProbeExclusive(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		s := b.state(t)
		ctx := ctxT(t)
		if must[string](t)(s.Probe(ctx, "a", time.Minute)) != "" {
			t.Fatal("a probe claimed on a closed circuit")
		}
		for round := range 5 {
			noErr(t, s.Open(ctx, "a", t0))
			if v := must[relay.Verdict](t)(s.Admit(ctx, relay.Limits{Name: "a"}, 0, false, t0.Add(time.Second))); !v.Open {
				t.Fatalf("%+v, want half-open", v)
			}
			var wins atomic.Int32
			var won atomic.Value
			var wg sync.WaitGroup
			for range 32 {
				wg.Go(func() {
					replica := New(b.c, func(o *State) { o.prefix = s.prefix })
					if token := check[string](t)(replica.Probe(ctx, "a", time.Minute)); token != "" {
						wins.Add(1)
						won.Store(token)
					}
				})
			}
			wg.Wait()
			if wins.Load() != 1 {
				t.Fatalf("round %d: %d replicas won the probe", round, wins.Load())
			}
			noErr(t, s.Success(ctx, "a", won.Load().(string))) // frees the lock
		}
	})
}

// TestHalfOpenOneProber: replicas that each find the circuit half-open
// and claim the probe send exactly one request between them.
func TestHalfOpenOneProber(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		s := b.state(t)
		ctx := ctxT(t)
		u := relay.Limits{Name: "a", RPM: 1000}
		noErr(t, s.Open(ctx, "a", t0))
		now := t0.Add(time.Second)
		var sent atomic.Int32
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				v := check[relay.Verdict](t)(s.Admit(ctx, u, 0, false, now))
				if !v.Open {
					t.Errorf("half-open circuit admitted a request: %+v", v)
					return
				}
				if v.Until.After(now) {
					return // another replica's probe is in flight
				}
				if check[string](t)(s.Probe(ctx, "a", 10*time.Second)) == "" {
					return
				}
				if v := check[relay.Verdict](t)(s.Admit(ctx, u, 0, true, now)); v.Taken {
					sent.Add(1)
				}
			})
		}
		wg.Wait()
		if sent.Load() != 1 {
			t.Fatalf("%d probes sent", sent.Load())
		}
	})
}
