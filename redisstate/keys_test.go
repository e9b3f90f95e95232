package redisstate

import (
	"testing"
	"time"

	"github.com/tokenrelay/relay/store"
)

// TestUpstreamKey: an upstream's state is one hash, which lives while a
// field of it matters (plus a minute), by the times the caller gives: a
// bucket until it is full again, a hold until it ends, an open circuit
// until it is forgotten (store.OpenKeep after its period), a failure run
// until it is forgotten (the failure run's memory). A full bucket, a
// closed circuit with no run, no hold: no key at all.
func TestUpstreamKey(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		s := b.state(t)
		ctx := ctxT(t)
		key := s.keys("a").state[0]
		pttl := func() time.Duration { return b.c.PTTL(ctx, key).Val() }
		near := func(what string, want time.Duration) {
			t.Helper()
			if got := pttl(); got > want || got < want-time.Second {
				t.Fatalf("%s: TTL %s, want %s", what, got, want)
			}
		}
		u := store.Limits{Name: "a", RPM: 60}
		must[store.Verdict](t)(s.Admit(ctx, u, store.Ask{}, t0))
		near("a request taken", time.Second+time.Minute) // its bucket is full again a second later
		noErr(t, s.Refund(ctx, u, 1, 0, t0))
		if n := b.c.Exists(ctx, key).Val(); n != 0 {
			t.Fatal("a full bucket kept its key")
		}
		noErr(t, s.Hold(ctx, "a", t0.Add(20*time.Second), t0))
		near("a hold", 20*time.Second+time.Minute)
		noErr(t, s.Open(ctx, "a", t0.Add(30*time.Second), t0))
		near("an open circuit", 30*time.Second+store.OpenKeep+time.Minute)
		v := must[store.Verdict](t)(s.Admit(ctx, store.Limits{Name: "a"}, store.Ask{Probe: time.Second}, t0.Add(31*time.Second)))
		must[store.Change](t)(s.Outcome(ctx, "a", policy, store.Outcome{Result: store.Success, Probe: v.Probe}, t0.Add(31*time.Second)))
		if n := b.c.Exists(ctx, key).Val(); n != 0 {
			t.Fatalf("a closed circuit with its hold over kept its key (TTL %s)", pttl())
		}
		must[store.Change](t)(s.Outcome(ctx, "a", policy, store.Outcome{Result: store.Failure}, t0))
		near("a failure run", store.DefaultFailureRun+time.Minute)
		if keys := b.keysUnder(t, s); len(keys) != 1 || keys[0] != key {
			t.Fatalf("keys %q, want the upstream's one hash", keys)
		}
	})
}
