package redisstate

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tokenrelay/relay"
	"golang.org/x/time/rate"
)

// localBuckets is the router's in-process limiter, as limit.go has it:
// x/time/rate buckets of one minute of quota.
type localBuckets struct{ rpm, tpm *rate.Limiter }

func newLocal(rpm, tpm int) *localBuckets {
	return &localBuckets{
		rpm: rate.NewLimiter(rate.Limit(float64(rpm)/60), rpm),
		tpm: rate.NewLimiter(rate.Limit(float64(tpm)/60), tpm),
	}
}

func bucketDelay(lim *rate.Limiter, now time.Time, n int) time.Duration {
	have := lim.TokensAt(now)
	if have >= float64(n) {
		return 0
	}
	return time.Duration(math.Ceil((float64(n) - have) / float64(lim.Limit()) * float64(time.Second)))
}

// admit is delay, then take, as the router does them.
func (l *localBuckets) admit(now time.Time, n int) (bool, time.Duration) {
	n = min(max(n, 1), l.tpm.Burst())
	d := max(bucketDelay(l.rpm, now, 1), bucketDelay(l.tpm, now, n))
	if d > 0 {
		return false, d
	}
	l.rpm.AllowN(now, 1)
	l.tpm.AllowN(now, n)
	return true, 0
}

func (l *localBuckets) refund(now time.Time, requests, tokens int) {
	l.rpm.AllowN(now, -requests)
	l.tpm.AllowN(now, -tokens)
}

// TestAdmitLikeLocalLimiter drives the shared buckets and the in-process
// ones with the same random calls and fake times: they take the same
// requests and give the same waits (to the microsecond the script
// counts in).
func TestAdmitLikeLocalLimiter(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		s := b.state(t)
		ctx := ctxT(t)
		rng := rand.New(rand.NewPCG(1, 2))
		for _, lim := range []relay.Limits{{Name: "a", RPM: 7, TPM: 1000}, {Name: "b", RPM: 600, TPM: 90000}} {
			local := newLocal(lim.RPM, lim.TPM)
			now := t0
			taken := 0
			for i := range 400 {
				now = now.Add(time.Duration(rng.Int64N(int64(120*time.Second/time.Duration(lim.RPM)))) / time.Microsecond * time.Microsecond)
				n := rng.IntN(lim.TPM * 3 / 2 / max(lim.RPM/10, 1))
				if i%17 == 0 {
					n = 5 * lim.TPM // larger than the bucket: clamped
				}
				if i%23 == 0 && taken > 0 {
					noErr(t, s.Refund(ctx, lim, 1, n, now))
					local.refund(now, 1, n)
					continue
				}
				v := must[relay.Verdict](t)(s.Admit(ctx, lim, n, false, now))
				ok, d := local.admit(now, n)
				if v.Taken != ok || v.Open || v.Until != (time.Time{}) {
					t.Fatalf("%s call %d (+%d tokens at %s): shared %+v, local taken %v wait %s",
						lim.Name, i, n, now.Sub(t0), v, ok, d)
				}
				if diff := v.Wait - d; diff < -2*time.Microsecond || diff > 2*time.Microsecond {
					t.Fatalf("%s call %d: shared wait %s, local %s", lim.Name, i, v.Wait, d)
				}
				if ok {
					taken++
				}
			}
			if taken < 50 {
				t.Fatalf("%s: only %d taken: the test exercises too little", lim.Name, taken)
			}
		}
	})
}

// TestAdmitRPM checks the GCRA by hand: a full minute of quota at once,
// then one request per emission interval.
func TestAdmitRPM(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		s := b.state(t)
		ctx := ctxT(t)
		u := relay.Limits{Name: "a", RPM: 60}
		for i := range 60 {
			if v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, t0)); !v.Taken {
				t.Fatalf("request %d of a full bucket: %+v", i, v)
			}
		}
		v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, t0))
		if v.Taken || v.Wait != time.Second {
			t.Fatalf("61st request: %+v, want a wait of 1s", v)
		}
		if v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, t0.Add(999*time.Millisecond))); v.Taken || v.Wait != time.Millisecond {
			t.Fatalf("at +999ms: %+v, want a wait of 1ms", v)
		}
		if v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, t0.Add(time.Second))); !v.Taken {
			t.Fatalf("at +1s: %+v", v)
		}
		// A minute later the bucket is full again, and holds no more.
		later := t0.Add(10 * time.Minute)
		for i := range 60 {
			if v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, later)); !v.Taken {
				t.Fatalf("request %d after 10 min: %+v", i, v)
			}
		}
		if v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, later)); v.Taken {
			t.Fatalf("the bucket held more than a minute of quota")
		}
	})
}

// TestAdmitBothOrNeither: when TPM has no room, the RPM token is not taken
// either (and the other way round).
func TestAdmitBothOrNeither(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		s := b.state(t)
		ctx := ctxT(t)
		u := relay.Limits{Name: "a", RPM: 2, TPM: 600}
		if v := must[relay.Verdict](t)(s.Admit(ctx, u, 600, false, t0)); !v.Taken {
			t.Fatal(v)
		}
		// TPM empty: 100 tokens come back in 10 s.
		for range 5 {
			v := must[relay.Verdict](t)(s.Admit(ctx, u, 100, false, t0))
			if v.Taken || v.Wait != 10*time.Second {
				t.Fatalf("%+v, want a 10s wait", v)
			}
		}
		// The refused calls took no RPM: one request is still there.
		if v := must[relay.Verdict](t)(s.Admit(ctx, relay.Limits{Name: "a", RPM: 2}, 0, false, t0)); !v.Taken {
			t.Fatalf("the refused calls took the RPM token: %+v", v)
		}
		// RPM empty now (2 taken): TPM is not charged either.
		v := must[relay.Verdict](t)(s.Admit(ctx, u, 1, false, t0.Add(20*time.Second)))
		if v.Taken || v.Wait != 10*time.Second {
			t.Fatalf("%+v, want the RPM wait of 10s", v)
		}
		if v := must[relay.Verdict](t)(s.Admit(ctx, relay.Limits{Name: "a", TPM: 600}, 200, false, t0.Add(20*time.Second))); !v.Taken {
			t.Fatalf("the refused call took TPM tokens: %+v", v)
		}
	})
}

// TestAdmitClamp: a TPM charge larger than the bucket takes the whole
// bucket and no more; a charge under 1 counts 1.
func TestAdmitClamp(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		s := b.state(t)
		ctx := ctxT(t)
		u := relay.Limits{Name: "a", TPM: 600}
		if v := must[relay.Verdict](t)(s.Admit(ctx, u, 1_000_000, false, t0)); !v.Taken {
			t.Fatalf("a charge over the bucket on a full bucket: %+v", v)
		}
		// Empty: 1 token is there in 100 ms (not 1e6 tokens' worth later).
		if v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, t0)); v.Taken || v.Wait != 100*time.Millisecond {
			t.Fatalf("%+v, want 100ms for the clamped 1-token charge", v)
		}
		// A whole bucket again needs exactly one minute.
		if v := must[relay.Verdict](t)(s.Admit(ctx, u, 1_000_000, false, t0)); v.Wait != time.Minute {
			t.Fatalf("%+v, want a minute", v)
		}
	})
}

// TestRefund gives tokens back, never past a full bucket.
func TestRefund(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		s := b.state(t)
		ctx := ctxT(t)
		u := relay.Limits{Name: "a", RPM: 3, TPM: 300}
		for range 3 {
			must[relay.Verdict](t)(s.Admit(ctx, u, 100, false, t0))
		}
		if v := must[relay.Verdict](t)(s.Admit(ctx, u, 100, false, t0)); v.Taken {
			t.Fatal("took past the quota")
		}
		noErr(t, s.Refund(ctx, u, 1, 100, t0))
		if v := must[relay.Verdict](t)(s.Admit(ctx, u, 100, false, t0)); !v.Taken {
			t.Fatalf("after a refund: %+v", v)
		}
		// Refunding far more than was taken fills the buckets, no more.
		noErr(t, s.Refund(ctx, u, 100, 100_000, t0))
		for i := range 3 {
			if v := must[relay.Verdict](t)(s.Admit(ctx, u, 100, false, t0)); !v.Taken {
				t.Fatalf("request %d after a large refund: %+v", i, v)
			}
		}
		if v := must[relay.Verdict](t)(s.Admit(ctx, u, 100, false, t0)); v.Taken {
			t.Fatal("a refund filled the bucket past its minute of quota")
		}
		// A refund to a full bucket (no key) writes nothing.
		noErr(t, s.Refund(ctx, relay.Limits{Name: "fresh", RPM: 3, TPM: 300}, 1, 10, t0))
		for _, k := range b.keysUnder(t, s) {
			if contains([]string{s.keys("fresh").rpm(), s.keys("fresh").tpm()}, k) {
				t.Fatalf("a refund to a full bucket wrote %s", k)
			}
		}
	})
}

// TestHold: a hold keeps the whole fleet off, forced calls too, until it
// ends; a later hold extends it, an earlier one does not shorten it.
func TestHold(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		s := b.state(t, WithClock(func() time.Time { return t0 }))
		ctx := ctxT(t)
		u := relay.Limits{Name: "a", RPM: 1}
		noErr(t, s.Hold(ctx, "a", t0.Add(6*time.Second)))
		for _, force := range []bool{false, true} {
			if v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, force, t0.Add(time.Second))); v.Taken || v.Open || v.Wait != 5*time.Second || !v.Until.Equal(t0.Add(6*time.Second)) {
				t.Fatalf("force %v: %+v, want a 5s wait until +6s", force, v)
			}
		}
		noErr(t, s.Hold(ctx, "a", t0.Add(2*time.Second)))
		if v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, t0.Add(time.Second))); v.Wait != 5*time.Second {
			t.Fatalf("an earlier hold shortened it: %+v", v)
		}
		noErr(t, s.Hold(ctx, "a", t0.Add(8*time.Second)))
		if v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, t0.Add(time.Second))); v.Wait != 7*time.Second {
			t.Fatalf("a later hold did not extend it: %+v", v)
		}
		// The wait is the longest of the hold and the limits.
		if v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, t0.Add(8*time.Second))); !v.Taken {
			t.Fatalf("after the hold: %+v", v)
		}
		noErr(t, s.Hold(ctx, "a", t0.Add(10*time.Second)))
		if v := must[relay.Verdict](t)(s.Admit(ctx, u, 0, false, t0.Add(9*time.Second))); v.Wait != time.Minute-time.Second {
			t.Fatalf("%+v, want the RPM wait (59s) over the hold's 1s", v)
		}
		// Other upstreams are not held.
		if v := must[relay.Verdict](t)(s.Admit(ctx, relay.Limits{Name: "b", RPM: 1}, 0, false, t0)); !v.Taken {
			t.Fatalf("upstream b: %+v", v)
		}
		// The hold's key lives until the hold ends plus a minute.
		pttl := b.c.PTTL(ctx, s.keys("a").hold()).Val()
		if pttl < 69*time.Second || pttl > 70*time.Second {
			t.Fatalf("hold key TTL %s, want 70s", pttl)
		}
	})
}
