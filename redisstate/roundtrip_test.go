package redisstate

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tokenrelay/relay/store"
)

// TestOneRoundTrip: every call is one command, so one round trip, once
// the scripts are loaded.
func TestOneRoundTrip(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		s := b.state(t)
		ctx := ctxT(t)
		noErr(t, s.Load(ctx))
		u := store.Limits{Name: "a", RPM: 100, TPM: 10000}
		k := store.BudgetKey{Budget: "b", Key: "k", Window: w1}
		var token string
		probe := store.Ask{Probe: time.Second}
		for _, c := range []struct {
			name string
			call func() error
		}{
			{"Admit", func() error { _, err := s.Admit(ctx, u, store.Ask{Tokens: 100}, t0); return err }},
			{"Admit refused", func() error { _, err := s.Admit(ctx, u, store.Ask{Tokens: 100_000}, t0); return err }},
			{"Admit forced", func() error { _, err := s.Admit(ctx, u, store.Ask{Tokens: 1, Force: true}, t0); return err }},
			{"Refund", func() error { return s.Refund(ctx, u, 1, 100, t0) }},
			{"Hold", func() error { return s.Hold(ctx, "a", t0, t0) }},
			{"Failure", func() error {
				_, err := s.Outcome(ctx, "a", policy, store.Outcome{Result: store.Failure}, t0)
				return err
			}},
			{"Success", func() error {
				_, err := s.Outcome(ctx, "a", policy, store.Outcome{Result: store.Success}, t0)
				return err
			}},
			{"Success stale probe", func() error {
				_, err := s.Outcome(ctx, "a", policy, store.Outcome{Result: store.Success, Probe: "stale"}, t0)
				return err
			}},
			{"Open", func() error { return s.Open(ctx, "a", t0, t0) }},
			{"Admit half-open, the probe claimed", func() error {
				v, err := s.Admit(ctx, u, probe, t0.Add(time.Second))
				token = v.Probe
				return err
			}},
			{"Admit half-open, the probe in flight", func() error { _, err := s.Admit(ctx, u, probe, t0.Add(time.Second)); return err }},
			{"Success probe", func() error {
				_, err := s.Outcome(ctx, "a", policy, store.Outcome{Result: store.Success, Probe: token}, t0.Add(time.Second))
				return err
			}},
			{"Reserve", func() error { _, err := s.Reserve(ctx, k, 1000, store.Hold{ID: "h", Amount: 10}, t0); return err }},
			{"Settle", func() error { return s.Settle(ctx, k, "h", 5, t0) }},
			{"Usage", func() error { _, _, err := s.Usage(ctx, k, t0); return err }},
			{"Keys", func() error { _, err := s.Keys(ctx, "b", w1); return err }},
		} {
			before := b.calls.n.Load()
			noErr(t, c.call())
			if n := b.calls.n.Load() - before; n != 1 {
				t.Errorf("%s: %d round trips", c.name, n)
			}
		}
	})
}

// TestScriptsReload: a Redis that lost its scripts (a restart, SCRIPT
// FLUSH) gets each back with EVAL on its first use: two round trips once,
// then one again. (miniredis only: flushing a shared server's scripts
// would disturb its other users.)
func TestScriptsReload(t *testing.T) {
	b := newMini(t)
	s := b.state(t)
	ctx := ctxT(t)
	u := store.Limits{Name: "a", RPM: 100}
	for round := range 2 {
		b.c.ScriptFlush(ctx)
		b.calls.names = nil
		for range 2 {
			if v := must[store.Verdict](t)(s.Admit(ctx, u, store.Ask{}, t0)); !v.Taken {
				t.Fatal(v)
			}
		}
		if want := []string{"admit", "eval", "admit"}; !slices.Equal(b.calls.names, want) {
			t.Fatalf("round %d: commands %q, want %q", round, b.calls.names, want)
		}
	}
}

// TestContextTimeoutsSeen: New sees whether the client bounds its
// connections by the context, and runs commands on goroutines only when
// it does not.
func TestContextTimeoutsSeen(t *testing.T) {
	b := newMini(t)
	if New(b.c).run {
		t.Fatal("a client with ContextTimeoutEnabled runs commands on goroutines")
	}
	var other otherClient
	other.UniversalClient = b.c
	s := New(other)
	if !s.run {
		t.Fatal("a client of unknown options is trusted with deadlines")
	}
	ctx := ctxT(t)
	if v, err := s.Admit(ctx, store.Limits{Name: "a", RPM: 1}, store.Ask{}, t0); err != nil || !v.Taken {
		t.Fatalf("through a goroutine: %+v %v", v, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Admit(ctx, store.Limits{Name: "a", RPM: 1}, store.Ask{}, t0); err == nil {
		t.Fatal("no error with a canceled context")
	}
}

// otherClient is a redis.UniversalClient whose options New cannot see.
type otherClient struct{ redis.UniversalClient }

// TestLoadAndClockOffset: Load loads every script (then no call needs
// EVAL); ClockOffset measures a clock against Redis's.
func TestLoadAndClockOffset(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		s := b.state(t)
		ctx := ctxT(t)
		noErr(t, s.Load(ctx))
		for _, sc := range scripts {
			if ok := b.c.ScriptExists(ctx, sc.sha).Val(); len(ok) != 1 || !ok[0] {
				t.Fatalf("script %s not loaded", sc.sha)
			}
		}
		if b.mini != nil {
			b.mini.SetTime(time.Now())
		}
		now := time.Now()
		off := must[time.Duration](t)(s.ClockOffset(ctx, now.Add(time.Hour)))
		if off < time.Hour-time.Second || off > time.Hour+time.Second {
			t.Fatalf("a clock an hour ahead: offset %s", off)
		}
	})
}
