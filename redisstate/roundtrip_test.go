package redisstate

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tokenrelay/relay"
)

// TestOneRoundTrip: every call is one command, so one round trip, once
// the scripts are loaded.
func TestOneRoundTrip(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		s := b.state(t)
		ctx := ctxT(t)
		noErr(t, s.Load(ctx))
		u := relay.Limits{Name: "a", RPM: 100, TPM: 10000}
		k := relay.BudgetKey{Budget: "b", Key: "k", Window: w1}
		var token string
		for _, c := range []struct {
			name string
			call func() error
		}{
			{"Admit", func() error { _, err := s.Admit(ctx, u, 100, false, t0); return err }},
			{"Admit refused", func() error { _, err := s.Admit(ctx, u, 100_000, false, t0); return err }},
			{"Admit forced", func() error { _, err := s.Admit(ctx, u, 1, true, t0); return err }},
			{"Refund", func() error { return s.Refund(ctx, u, 1, 100, t0) }},
			{"Hold", func() error { return s.Hold(ctx, "a", t0) }},
			{"Failure", func() error { _, err := s.Failure(ctx, "a", policy, t0); return err }},
			{"Success", func() error { return s.Success(ctx, "a", "") }},
			{"Success stale probe", func() error { return s.Success(ctx, "a", "stale") }},
			{"Open", func() error { return s.Open(ctx, "a", t0) }},
			{"Admit half-open", func() error { _, err := s.Admit(ctx, u, 1, false, t0.Add(time.Second)); return err }},
			{"Probe", func() (err error) { token, err = s.Probe(ctx, "a", time.Second); return err }},
			{"Probe lost", func() error { _, err := s.Probe(ctx, "a", time.Second); return err }},
			{"Success probe", func() error { return s.Success(ctx, "a", token) }},
			{"Reserve", func() error { _, err := s.Reserve(ctx, k, 1000, relay.Hold{ID: "h", Amount: 10}); return err }},
			{"Settle", func() error { return s.Settle(ctx, k, "h", 5) }},
			{"Usage", func() error { _, _, err := s.Usage(ctx, k); return err }},
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
	u := relay.Limits{Name: "a", RPM: 100}
	for round := range 2 {
		b.c.ScriptFlush(ctx)
		b.calls.names = nil
		for range 2 {
			if v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, t0)); !v.Taken {
				t.Fatal(v)
			}
		}
		if want := []string{"evalsha", "eval", "evalsha"}; !slices.Equal(b.calls.names, want) {
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
	if v, err := s.Admit(ctx, relay.Limits{Name: "a", RPM: 1}, 0, false, t0); err != nil || !v.Taken {
		t.Fatalf("through a goroutine: %+v %v", v, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Admit(ctx, relay.Limits{Name: "a", RPM: 1}, 0, false, t0); err == nil {
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
