package redisstate

import (
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenrelay/relay"
)

var w1 = t0.Truncate(time.Hour).Add(time.Hour) // a window end

// TestLedgerLikeLocal drives the shared ledger and relay.NewLocalLedger
// with the same random calls in one window: same answers, same usage.
func TestLedgerLikeLocal(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		s := b.state(t)
		ctx := ctxT(t)
		local := relay.NewLocalLedger()
		rng := rand.New(rand.NewPCG(3, 4))
		keys := []string{"", "team-a", "team-b"}
		ids := []string{"a", "b", "c", "d", "e"} // holds, new, topped up, lowered, settled and made again
		const limit = 10_000
		far := time.Now().Add(time.Hour)
		for i := range 600 {
			k := relay.BudgetKey{Budget: "daily", Key: keys[rng.IntN(len(keys))], Window: w1}
			id := ids[rng.IntN(len(ids))]
			switch rng.IntN(3) {
			case 0, 1:
				h := relay.Hold{ID: id, Amount: rng.Int64N(3000), Expires: far}
				got := must[bool](t)(s.Reserve(ctx, k, limit, h))
				want, _ := local.Reserve(ctx, k, limit, h)
				if got != want {
					t.Fatalf("call %d: Reserve(%q, %+v) = %v, local %v", i, k.Key, h, got, want)
				}
			case 2:
				spent := rng.Int64N(1000)
				noErr(t, s.Settle(ctx, k, id, spent))
				local.Settle(ctx, k, id, spent)
			}
			gs, gr, err := s.Usage(ctx, k)
			noErr(t, err)
			ls, lr, _ := local.Usage(ctx, k)
			if gs != ls || gr != lr {
				t.Fatalf("call %d: usage of %q: spent %d reserved %d, local %d %d", i, k.Key, gs, gr, ls, lr)
			}
		}
		got := must[[]string](t)(s.Keys(ctx, "daily", w1))
		want, _ := local.Keys(ctx, "daily", w1)
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("keys %q, local %q", got, want)
		}
	})
}

// TestLedgerConcurrent: replicas reserving at once against a cap admit
// exactly floor(cap/amount) between them, and settling keeps the
// invariant spent + reserved <= limit.
func TestLedgerConcurrent(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		s := b.state(t)
		ctx := ctxT(t)
		const limit, amount = 1000, 7
		k := relay.BudgetKey{Budget: "b", Window: w1}
		replicas := make([]*State, 4)
		for i := range replicas {
			replicas[i] = New(b.c, func(o *State) { o.prefix = s.prefix })
		}
		var admitted atomic.Int64
		held := make([][]string, 32) // the holds each goroutine has
		var seq atomic.Int64
		hold := func() relay.Hold {
			return relay.Hold{ID: strconv.FormatInt(seq.Add(1), 10), Amount: amount, Expires: time.Now().Add(time.Hour)}
		}
		var wg sync.WaitGroup
		for g := range held {
			wg.Go(func() {
				r := replicas[g%len(replicas)]
				for range 10 {
					if h := hold(); check[bool](t)(r.Reserve(ctx, k, limit, h)) {
						admitted.Add(1)
						held[g] = append(held[g], h.ID)
					}
				}
			})
		}
		wg.Wait()
		if got, want := admitted.Load(), int64(limit/amount); got != want {
			t.Fatalf("%d reservations admitted, want %d", got, want)
		}
		spent, reserved := must2(t)(s.Usage(ctx, k))
		if spent != 0 || reserved != limit/amount*amount {
			t.Fatalf("usage %d %d", spent, reserved)
		}
		// Each settles what it holds for less than reserved, and reserves
		// again as room appears: spent + reserved never passes the limit.
		for g := range held {
			wg.Go(func() {
				r := replicas[g%len(replicas)]
				for range 20 {
					if n := len(held[g]); n > 0 {
						noErrG(t, r.Settle(ctx, k, held[g][n-1], amount-2))
						held[g] = held[g][:n-1]
					}
					if h := hold(); check[bool](t)(r.Reserve(ctx, k, limit, h)) {
						held[g] = append(held[g], h.ID)
					}
					sp, re, err := r.Usage(ctx, k)
					if err == nil && sp+re > limit {
						t.Errorf("spent %d + reserved %d over the limit %d", sp, re, limit)
					}
				}
				for _, id := range held[g] {
					noErrG(t, r.Settle(ctx, k, id, amount-2))
				}
			})
		}
		wg.Wait()
		spent, reserved = must2(t)(s.Usage(ctx, k))
		if reserved != 0 || spent > limit || spent < limit/2 {
			t.Fatalf("after settling all: spent %d, reserved %d (limit %d)", spent, reserved, limit)
		}
	})
}

// TestLedgerExact: sums past 2^53 (where Lua numbers stop being exact) up
// to the largest int64 are compared exactly.
func TestLedgerExact(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		s := b.state(t)
		ctx := ctxT(t)
		for _, c := range []struct{ limit, spent int64 }{
			{1<<53 + 1, 1 << 53},
			{math.MaxInt64, math.MaxInt64 - 10},
			{999_999_999_999, 999_999_999_998},
			{1_000_000_000, 999_999_999},
		} {
			k := relay.BudgetKey{Budget: "big", Key: time.Duration(c.limit).String(), Window: w1}
			noErr(t, s.Settle(ctx, k, "none", c.spent))
			room := c.limit - c.spent
			far := time.Now().Add(time.Hour)
			if must[bool](t)(s.Reserve(ctx, k, c.limit, relay.Hold{ID: "a", Amount: room + 1, Expires: far})) {
				t.Fatalf("limit %d, spent %d: reserved %d, one over", c.limit, c.spent, room+1)
			}
			if !must[bool](t)(s.Reserve(ctx, k, c.limit, relay.Hold{ID: "a", Amount: room, Expires: far})) {
				t.Fatalf("limit %d, spent %d: refused exactly the room %d", c.limit, c.spent, room)
			}
			if must[bool](t)(s.Reserve(ctx, k, c.limit, relay.Hold{ID: "b", Amount: 1, Expires: far})) {
				t.Fatalf("limit %d: reserved past a full budget", c.limit)
			}
			if !must[bool](t)(s.Reserve(ctx, k, c.limit, relay.Hold{ID: "a", Amount: room, Expires: far})) {
				t.Fatalf("limit %d: the same hold again was refused", c.limit)
			}
			if spent, reserved := must2(t)(s.Usage(ctx, k)); spent != c.spent || reserved != room {
				t.Fatalf("usage %d %d, want %d %d", spent, reserved, c.spent, room)
			}
			noErr(t, s.Settle(ctx, k, "a", 0))
			noErr(t, s.Settle(ctx, k, "a", 0)) // settled twice: nothing more
			if spent, reserved := must2(t)(s.Usage(ctx, k)); spent != c.spent || reserved != 0 {
				t.Fatalf("after settling: usage %d %d, want %d 0", spent, reserved, c.spent)
			}
		}
		x := relay.BudgetKey{Budget: "x", Window: w1}
		for _, amount := range []int64{-1, 1<<53 + 1} {
			if _, err := s.Reserve(ctx, x, math.MaxInt64, relay.Hold{ID: "a", Amount: amount}); err == nil {
				t.Fatalf("a reservation of %d was taken", amount)
			}
		}
		if err := s.Settle(ctx, x, "a", -1); err == nil {
			t.Fatal("a negative settlement was taken")
		}
	})
}

// TestLedgerWindows: each window has its own ledgers and key list, and
// they expire a retention after the window ends.
func TestLedgerWindows(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		clock := t0
		s := b.state(t, WithClock(func() time.Time { return clock }), WithBudgetRetention(time.Hour))
		ctx := ctxT(t)
		w2 := w1.Add(time.Hour)
		h := relay.Hold{ID: "h", Amount: 60, Expires: w2}
		must[bool](t)(s.Reserve(ctx, relay.BudgetKey{Budget: "b", Key: "x", Window: w1}, 100, h))
		must[bool](t)(s.Reserve(ctx, relay.BudgetKey{Budget: "b", Key: "y", Window: w2}, 100, h))
		if !must[bool](t)(s.Reserve(ctx, relay.BudgetKey{Budget: "b", Key: "x", Window: w2}, 100, h)) {
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
		kx := relay.BudgetKey{Budget: "b", Key: "x", Window: w1}
		acc, set := s.account(kx)
		want := w1.Sub(clock) + time.Hour
		for _, key := range []string{acc, set, s.expiries(kx)} {
			if pttl := b.c.PTTL(ctx, key).Val(); pttl > want || pttl < want-time.Second {
				t.Fatalf("%s: TTL %s, want %s (window end + retention)", key, pttl, want)
			}
		}
	})
}

// TestNames: names with the characters keys are made of stay apart, one
// upstream's keys share a hash tag, and prefixes share nothing.
func TestNames(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		s := b.state(t)
		ctx := ctxT(t)
		a := relay.BudgetKey{Budget: "a:b", Key: "c", Window: w1}
		c := relay.BudgetKey{Budget: "a", Key: "b:c", Window: w1}
		must[bool](t)(s.Reserve(ctx, a, 100, relay.Hold{ID: "h", Amount: 10, Expires: w1}))
		if _, r := must2(t)(s.Usage(ctx, c)); r != 0 {
			t.Fatal("budget a:b key c and budget a key b:c share a ledger")
		}
		for _, name := range []string{"x}y{", "{x}", "a:b", "100%"} {
			u := relay.Limits{Name: name, RPM: 1}
			if v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, t0)); !v.Taken {
				t.Fatalf("%q: %+v", name, v)
			}
			if v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, t0)); v.Taken {
				t.Fatalf("%q: took twice from a 1-RPM bucket", name)
			}
			k := s.keys(name)
			for _, key := range append(k.admit[:], k.fails) {
				if got, want := slot(key), slot(k.rpm()); got != want {
					t.Fatalf("%q: %s is in slot %d, %s in %d", name, key, got, k.rpm(), want)
				}
			}
		}
		other := b.state(t)
		if v := must[relay.Verdict](t)(other.Admit(ctx, relay.Limits{Name: "x}y{", RPM: 1}, 0, false, t0)); !v.Taken {
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

func noErrG(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Error(err)
	}
}

// TestLedgerHoldsExpire: a hold never settled (its replica died) stops
// counting at its deadline, by the State's clock: its room comes back,
// and a settlement after that charges the spend and releases nothing
// more. A top-up moves the deadline.
func TestLedgerHoldsExpire(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		clock := t0
		s := b.state(t, WithClock(func() time.Time { return clock }))
		ctx := ctxT(t)
		k := relay.BudgetKey{Budget: "monthly", Window: t0.Add(30 * 24 * time.Hour)}
		const limit = 10_000
		crashed := relay.Hold{ID: "crashed", Amount: 9_000, Expires: t0.Add(10 * time.Minute)}
		live := relay.Hold{ID: "live", Amount: 500, Expires: t0.Add(10 * time.Minute)}
		must[bool](t)(s.Reserve(ctx, k, limit, crashed))
		must[bool](t)(s.Reserve(ctx, k, limit, live))
		clock = t0.Add(9 * time.Minute)
		live.Amount, live.Expires = 800, clock.Add(10*time.Minute) // a top-up
		must[bool](t)(s.Reserve(ctx, k, limit, live))
		if must[bool](t)(s.Reserve(ctx, k, limit, relay.Hold{ID: "new", Amount: 2_000, Expires: clock.Add(time.Minute)})) {
			t.Fatal("a hold fitted past the live ones")
		}
		clock = t0.Add(11 * time.Minute) // the crashed hold's deadline has passed, not the live one's
		if _, reserved := must2(t)(s.Usage(ctx, k)); reserved != 800 {
			t.Fatalf("reserved %d after the crashed hold's deadline, want the live hold's 800", reserved)
		}
		if !must[bool](t)(s.Reserve(ctx, k, limit, relay.Hold{ID: "new", Amount: 2_000, Expires: clock.Add(time.Minute)})) {
			t.Fatal("the expired hold still takes the budget")
		}
		noErr(t, s.Settle(ctx, k, "crashed", 100)) // a settlement that comes late anyway
		if spent, reserved := must2(t)(s.Usage(ctx, k)); spent != 100 || reserved != 2_800 {
			t.Fatalf("usage %d %d, want 100 2800", spent, reserved)
		}
	})
}
