package redisstate

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokenrelay/relay/store"
)

// The ledger's behaviours are the store contract's (TestConformance);
// these tests check what is Redis's own: keys, their lifetimes, names.

var w1 = t0.Truncate(time.Hour).Add(time.Hour) // a window end

func reserve(t testing.TB, s *State, k store.BudgetKey, limit int64, h store.Hold, now time.Time) bool {
	t.Helper()
	r, err := s.Reserve(ctxT(t), k, limit, h, now)
	if err != nil {
		t.Fatal(err)
	}
	return r.OK
}

// TestLedgerWindows: each window has its own ledgers and key list, and
// they expire a retention after the window ends.
func TestLedgerWindows(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		clock := t0
		s := b.state(t, WithBudgetRetention(time.Hour))
		ctx := ctxT(t)
		w2 := w1.Add(time.Hour)
		h := store.Hold{ID: "h", Amount: 60, Expires: w2}
		reserve(t, s, store.BudgetKey{Budget: "b", Key: "x", Window: w1}, 100, h, clock)
		reserve(t, s, store.BudgetKey{Budget: "b", Key: "y", Window: w2}, 100, h, clock)
		if !reserve(t, s, store.BudgetKey{Budget: "b", Key: "x", Window: w2}, 100, h, clock) {
			t.Fatal("the next window started with the last one's reservations")
		}
		if k := must[[]string](t)(s.Keys(ctx, "b", w1)); !slices.Equal(k, []string{"x"}) {
			t.Fatalf("keys of w1: %q", k)
		}
		k2 := must[[]string](t)(s.Keys(ctx, "b", w2))
		slices.Sort(k2)
		if !slices.Equal(k2, []string{"x", "y"}) {
			t.Fatalf("keys of w2: %q", k2)
		}
		if k := must[[]string](t)(s.Keys(ctx, "other", w1)); len(k) != 0 {
			t.Fatalf("keys of an unknown budget: %q", k)
		}
		_, keys := s.ledgerKeys(store.BudgetKey{Budget: "b", Key: "x", Window: w1})
		want := w1.Sub(clock) + time.Hour
		for _, key := range keys[:3] {
			if pttl := b.c.PTTL(ctx, key).Val(); pttl > want || pttl < want-time.Second {
				t.Fatalf("%s: TTL %s, want %s (window end + retention)", key, pttl, want)
			}
		}
	})
}

// TestNames: names with the characters keys are made of stay apart, every
// key of a budget shares its hash tag, and prefixes share nothing.
func TestNames(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		s := b.state(t)
		ctx := ctxT(t)
		a := store.BudgetKey{Budget: "a:b", Key: "c", Window: w1}
		c := store.BudgetKey{Budget: "a", Key: "b:c", Window: w1}
		reserve(t, s, a, 100, store.Hold{ID: "h", Amount: 10, Expires: w1}, t0)
		if _, r := must2(t)(s.Usage(ctx, c, t0)); r != 0 {
			t.Fatal("budget a:b key c and budget a key b:c share a ledger")
		}
		_, keys := s.ledgerKeys(a)
		for _, key := range keys {
			if slot(key) != slot(keys[0]) {
				t.Fatalf("%s is in slot %d, %s in %d", key, slot(key), keys[0], slot(keys[0]))
			}
		}
		for _, name := range []string{"x}y{", "{x}", "a:b", "100%"} {
			u := store.Limits{Name: name, RPM: 1}
			if v := must[store.Verdict](t)(s.Admit(ctx, u, store.Ask{}, t0)); !v.Taken {
				t.Fatalf("%q: %+v", name, v)
			}
			if v := must[store.Verdict](t)(s.Admit(ctx, u, store.Ask{}, t0)); v.Taken {
				t.Fatalf("%q: took twice from a 1-RPM bucket", name)
			}
			if keys := b.keysUnder(t, s); !slices.Contains(keys, s.keys(name).state[0]) {
				t.Fatalf("%q: keys %q", name, keys)
			}
		}
		other := b.state(t)
		if v := must[store.Verdict](t)(other.Admit(ctx, store.Limits{Name: "x}y{", RPM: 1}, store.Ask{}, t0)); !v.Taken {
			t.Fatalf("another prefix shares the bucket: %+v", v)
		}
	})
}

// slot is Redis Cluster's slot of key: CRC16 (XMODEM) of its hash tag
// (the text between the first { and the next }, when not empty) or of the
// whole key, modulo 16384.
func slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := range len(key) {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}

func TestSlot(t *testing.T) {
	// Values from the Redis Cluster specification and CLUSTER KEYSLOT.
	for key, want := range map[string]int{"123456789": 0x31C3, "foo": 12182, "{user1000}.following": slot("user1000"), "foo{}{bar}": slot("foo{}{bar}")} {
		if got := slot(key); got != want {
			t.Errorf("slot(%q) = %d, want %d", key, got, want)
		}
	}
}

func must2(t testing.TB) func(a, b int64, err error) (int64, int64) {
	return func(a, b int64, err error) (int64, int64) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return a, b
	}
}
