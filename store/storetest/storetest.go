// Package storetest is the conformance suite of store.State: every
// behaviour of the contract, run against an implementation. store.Local
// runs it, and so do package redisstate's State on miniredis and on a real
// redis-server; a third-party store runs it from a test of its own:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) store.State { return newMyStore(t) })
//	}
//
// Every call is given a time from a fake clock (the suite never waits),
// so a store must decide by the times it is given, not by a clock of its
// own. Times are compared to the microsecond.
package storetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenrelay/relay/store"
)

// T0 is the time the suite's calls start at.
var T0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// Run runs the suite. open returns a fresh State for one test, sharing
// nothing with the States of the other tests; it is called once per test.
func Run(t *testing.T, open func(t *testing.T) store.State) {
	for _, tc := range []struct {
		name string
		f    func(t *testing.T, s store.State)
	}{
		{"AdmitRPM", testAdmitRPM},
		{"AdmitBothOrNeither", testAdmitBothOrNeither},
		{"AdmitClamp", testAdmitClamp},
		{"Backlogs", testBacklogs},
		{"Refund", testRefund},
		{"Hold", testHold},
		{"Owed", testOwed},
		{"LikeLocal", testLikeLocal},
		{"ConcurrentAdmits", testConcurrentAdmits},
		{"CircuitCycle", testCircuitCycle},
		{"CooldownDoubles", testCooldownDoubles},
		{"StaleProbe", testStaleProbe},
		{"NeutralProbeReleases", testNeutralProbeReleases},
		{"ActiveProbe", testActiveProbe},
		{"CountingOff", testCountingOff},
		{"FailureRunForgotten", testFailureRunForgotten},
		{"Open", testOpen},
		{"HalfOpenForgotten", testHalfOpenForgotten},
		{"OneProber", testOneProber},
		{"LedgerReserve", testLedgerReserve},
		{"LedgerLikeLocal", testLedgerLikeLocal},
		{"LedgerExact", testLedgerExact},
		{"LedgerHoldsExpire", testLedgerHoldsExpire},
		{"LedgerSettledNotRemade", testLedgerSettledNotRemade},
		{"LedgerConcurrent", testLedgerConcurrent},
		{"LedgerKeys", testLedgerKeys},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.f(t, open(t)) })
	}
}

func ctxOf(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// at returns T0 plus d.
func at(d time.Duration) time.Time { return T0.Add(d) }

// near reports whether two durations are within 2 µs.
func near(a, b time.Duration) bool {
	d := a - b
	return d >= -2*time.Microsecond && d <= 2*time.Microsecond
}

func admit(t *testing.T, s store.State, u store.Limits, a store.Ask, now time.Time) store.Verdict {
	t.Helper()
	v, err := s.Admit(ctxOf(t), u, a, now)
	if err != nil {
		t.Fatalf("Admit(%+v, %+v, %s): %v", u, a, now.Sub(T0), err)
	}
	return v
}

func outcome(t *testing.T, s store.State, name string, p store.CircuitPolicy, o store.Outcome, now time.Time) store.Change {
	t.Helper()
	c, err := s.Outcome(ctxOf(t), name, p, o, now)
	if err != nil {
		t.Fatalf("Outcome(%s, %+v, %s): %v", name, o, now.Sub(T0), err)
	}
	return c
}

func noErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// testAdmitRPM checks the GCRA by hand: a full minute of quota at once,
// then one request per emission interval; a bucket never holds more than
// a minute of quota.
func testAdmitRPM(t *testing.T, s store.State) {
	u := store.Limits{Name: "a", RPM: 60}
	for i := range 60 {
		if v := admit(t, s, u, store.Ask{}, T0); !v.Taken {
			t.Fatalf("request %d of a full bucket: %+v", i, v)
		}
	}
	if v := admit(t, s, u, store.Ask{}, T0); v.Taken || !near(v.Wait, time.Second) {
		t.Fatalf("61st request: %+v, want a wait of 1s", v)
	}
	if v := admit(t, s, u, store.Ask{}, at(999*time.Millisecond)); v.Taken || !near(v.Wait, time.Millisecond) {
		t.Fatalf("at +999ms: %+v, want a wait of 1ms", v)
	}
	if v := admit(t, s, u, store.Ask{}, at(time.Second)); !v.Taken {
		t.Fatalf("at +1s: %+v", v)
	}
	later := at(10 * time.Minute)
	for i := range 60 {
		if v := admit(t, s, u, store.Ask{}, later); !v.Taken {
			t.Fatalf("request %d after 10 min: %+v", i, v)
		}
	}
	if v := admit(t, s, u, store.Ask{}, later); v.Taken {
		t.Fatal("the bucket held more than a minute of quota")
	}
	// Limits are per upstream.
	if v := admit(t, s, store.Limits{Name: "b", RPM: 60}, store.Ask{}, later); !v.Taken {
		t.Fatalf("upstream b: %+v", v)
	}
}

// testAdmitBothOrNeither: when TPM has no room the RPM token is not taken
// either, and the other way round.
func testAdmitBothOrNeither(t *testing.T, s store.State) {
	u := store.Limits{Name: "a", RPM: 2, TPM: 600}
	if v := admit(t, s, u, store.Ask{Tokens: 600}, T0); !v.Taken {
		t.Fatal(v)
	}
	for range 5 {
		if v := admit(t, s, u, store.Ask{Tokens: 100}, T0); v.Taken || !near(v.Wait, 10*time.Second) {
			t.Fatalf("%+v, want a 10s wait", v)
		}
	}
	if v := admit(t, s, store.Limits{Name: "a", RPM: 2}, store.Ask{}, T0); !v.Taken {
		t.Fatalf("the refused calls took the RPM token: %+v", v)
	}
	if v := admit(t, s, u, store.Ask{Tokens: 1}, at(20*time.Second)); v.Taken || !near(v.Wait, 10*time.Second) {
		t.Fatalf("%+v, want the RPM wait of 10s", v)
	}
	if v := admit(t, s, store.Limits{Name: "a", TPM: 600}, store.Ask{Tokens: 200}, at(20*time.Second)); !v.Taken {
		t.Fatalf("the refused call took TPM tokens: %+v", v)
	}
}

// testAdmitClamp: a TPM charge larger than the bucket takes the whole
// bucket and no more; a charge under 1 counts 1.
func testAdmitClamp(t *testing.T, s store.State) {
	u := store.Limits{Name: "a", TPM: 600}
	if v := admit(t, s, u, store.Ask{Tokens: 1_000_000}, T0); !v.Taken {
		t.Fatalf("a charge over the bucket on a full bucket: %+v", v)
	}
	if v := admit(t, s, u, store.Ask{}, T0); v.Taken || !near(v.Wait, 100*time.Millisecond) {
		t.Fatalf("%+v, want 100ms for the clamped 1-token charge", v)
	}
	if v := admit(t, s, u, store.Ask{Tokens: 1_000_000}, T0); !near(v.Wait, time.Minute) {
		t.Fatalf("%+v, want a minute", v)
	}
}

// testBacklogs: a verdict gives each bucket's backlog, after the request
// when it was taken, as it is when it was not.
func testBacklogs(t *testing.T, s store.State) {
	u := store.Limits{Name: "a", RPM: 60, TPM: 6000}
	v := admit(t, s, u, store.Ask{Tokens: 100}, T0)
	if !v.Taken || !near(v.Requests, time.Second) || !near(v.Tokens, time.Second) {
		t.Fatalf("first request: %+v, want backlogs of 1s and 1s", v)
	}
	v = admit(t, s, u, store.Ask{Tokens: 5900}, at(500*time.Millisecond))
	if !v.Taken || !near(v.Requests, 1500*time.Millisecond) || !near(v.Tokens, 59500*time.Millisecond) {
		t.Fatalf("second request: %+v, want backlogs of 1.5s and 59.5s", v)
	}
	v = admit(t, s, u, store.Ask{Tokens: 600}, at(time.Second))
	if v.Taken || !near(v.Wait, 5*time.Second) || !near(v.Requests, time.Second) || !near(v.Tokens, 59*time.Second) {
		t.Fatalf("refused request: %+v, want a 5s wait and backlogs of 1s and 59s", v)
	}
	if v := admit(t, s, store.Limits{Name: "fresh", RPM: 60}, store.Ask{}, T0); !v.Taken || v.Tokens != 0 {
		t.Fatalf("no TPM limit: %+v, want no TPM backlog", v)
	}
}

// testRefund gives tokens back, never past a full bucket.
func testRefund(t *testing.T, s store.State) {
	ctx := ctxOf(t)
	u := store.Limits{Name: "a", RPM: 3, TPM: 300}
	for range 3 {
		admit(t, s, u, store.Ask{Tokens: 100}, T0)
	}
	if v := admit(t, s, u, store.Ask{Tokens: 100}, T0); v.Taken {
		t.Fatal("took past the quota")
	}
	noErr(t, s.Refund(ctx, u, 1, 100, T0))
	if v := admit(t, s, u, store.Ask{Tokens: 100}, T0); !v.Taken {
		t.Fatalf("after a refund: %+v", v)
	}
	noErr(t, s.Refund(ctx, u, 100, 100_000, T0))
	for i := range 3 {
		if v := admit(t, s, u, store.Ask{Tokens: 100}, T0); !v.Taken {
			t.Fatalf("request %d after a large refund: %+v", i, v)
		}
	}
	if v := admit(t, s, u, store.Ask{Tokens: 100}, T0); v.Taken {
		t.Fatal("a refund filled the bucket past its minute of quota")
	}
	// TPM alone.
	noErr(t, s.Refund(ctx, u, 0, 100, T0))
	if v := admit(t, s, store.Limits{Name: "a", TPM: 300}, store.Ask{Tokens: 100}, T0); !v.Taken {
		t.Fatalf("after a TPM refund: %+v", v)
	}
	noErr(t, s.Refund(ctx, store.Limits{Name: "fresh", RPM: 3, TPM: 300}, 1, 10, T0))
}

// testHold: a hold keeps the attempt out, forced ones too, until it ends;
// a later hold extends it, an earlier one does not shorten it; the wait
// is the longest of the hold's and the limits'.
func testHold(t *testing.T, s store.State) {
	ctx := ctxOf(t)
	u := store.Limits{Name: "a", RPM: 1}
	noErr(t, s.Hold(ctx, "a", at(6*time.Second), T0))
	for _, force := range []bool{false, true} {
		if v := admit(t, s, u, store.Ask{Force: force}, at(time.Second)); v.Taken || v.Open || !near(v.Wait, 5*time.Second) || !v.Until.Equal(at(6*time.Second)) {
			t.Fatalf("force %v: %+v, want a 5s wait until +6s", force, v)
		}
	}
	noErr(t, s.Hold(ctx, "a", at(2*time.Second), T0))
	if v := admit(t, s, u, store.Ask{}, at(time.Second)); !near(v.Wait, 5*time.Second) {
		t.Fatalf("an earlier hold shortened it: %+v", v)
	}
	noErr(t, s.Hold(ctx, "a", at(8*time.Second), T0))
	if v := admit(t, s, u, store.Ask{}, at(time.Second)); !near(v.Wait, 7*time.Second) {
		t.Fatalf("a later hold did not extend it: %+v", v)
	}
	if v := admit(t, s, u, store.Ask{}, at(8*time.Second)); !v.Taken {
		t.Fatalf("after the hold: %+v", v)
	}
	noErr(t, s.Hold(ctx, "a", at(10*time.Second), T0))
	if v := admit(t, s, u, store.Ask{}, at(9*time.Second)); !near(v.Wait, time.Minute-time.Second) {
		t.Fatalf("%+v, want the RPM wait (59s) over the hold's 1s", v)
	}
	if v := admit(t, s, store.Limits{Name: "b", RPM: 1}, store.Ask{}, T0); !v.Taken {
		t.Fatalf("upstream b: %+v", v)
	}
}

// testOwed: what a replica admitted without the store is taken from the
// limits first, whatever is there, past a minute's quota too, and while
// the circuit keeps the attempt out.
func testOwed(t *testing.T, s store.State) {
	u := store.Limits{Name: "a", RPM: 60, TPM: 6000}
	v := admit(t, s, u, store.Ask{Tokens: 100, Owed: store.Owed{Requests: 50, Tokens: 3000}}, T0)
	if !v.Taken || !near(v.Requests, 51*time.Second) || !near(v.Tokens, 31*time.Second) {
		t.Fatalf("%+v, want taken with backlogs of 51s and 31s", v)
	}
	v = admit(t, s, u, store.Ask{Owed: store.Owed{Requests: 20}}, T0)
	if v.Taken || !near(v.Wait, 12*time.Second) || !near(v.Requests, 71*time.Second) {
		t.Fatalf("owed past the minute: %+v, want a 12s wait, a backlog of 71s", v)
	}
	noErr(t, s.Open(ctxOf(t), "a", at(time.Minute), T0))
	if v := admit(t, s, u, store.Ask{Owed: store.Owed{Requests: 5}}, T0); !v.Open {
		t.Fatalf("%+v, want open", v)
	}
	if v := admit(t, s, u, store.Ask{Force: true}, T0); v.Taken || !near(v.Wait, 17*time.Second) {
		t.Fatalf("%+v, want the 5 owed while open taken too: a 17s wait", v)
	}
}

// testLikeLocal drives the store and store.Local, the reference, with the
// same random admissions, refunds and holds: they take the same requests,
// give the same waits and the same backlogs (to the microsecond).
func testLikeLocal(t *testing.T, s store.State) {
	ctx := ctxOf(t)
	ref := store.NewLocal()
	rng := rand.New(rand.NewPCG(1, 2))
	for _, lim := range []store.Limits{{Name: "a", RPM: 7, TPM: 1000}, {Name: "b", RPM: 600, TPM: 90000}} {
		now := T0
		taken := 0
		for i := range 400 {
			now = now.Add(time.Duration(rng.Int64N(int64(120*time.Second/time.Duration(lim.RPM)))) / time.Microsecond * time.Microsecond)
			n := rng.IntN(lim.TPM * 3 / 2 / max(lim.RPM/10, 1))
			switch {
			case i%17 == 0:
				n = 5 * lim.TPM // larger than the bucket: clamped
			case i%23 == 0 && taken > 0:
				noErr(t, s.Refund(ctx, lim, 1, n, now))
				noErr(t, ref.Refund(ctx, lim, 1, n, now))
				continue
			case i%41 == 0:
				until := now.Add(time.Duration(rng.Int64N(int64(5 * time.Second))))
				noErr(t, s.Hold(ctx, lim.Name, until, now))
				noErr(t, ref.Hold(ctx, lim.Name, until, now))
			}
			v := admit(t, s, lim, store.Ask{Tokens: n}, now)
			w := admit(t, ref, lim, store.Ask{Tokens: n}, now)
			if v.Taken != w.Taken || v.Open || !near(v.Wait, w.Wait) || !near(v.Requests, w.Requests) || !near(v.Tokens, w.Tokens) ||
				!v.Until.Truncate(time.Microsecond).Equal(w.Until.Truncate(time.Microsecond)) {
				t.Fatalf("%s call %d (+%d tokens at %s): store %+v, reference %+v", lim.Name, i, n, now.Sub(T0), v, w)
			}
			if v.Taken {
				taken++
			}
		}
		if taken < 50 {
			t.Fatalf("%s: only %d taken: the test exercises too little", lim.Name, taken)
		}
	}
}

// testConcurrentAdmits: of many admissions at once, exactly the bucket's
// quota is taken.
func testConcurrentAdmits(t *testing.T, s store.State) {
	u := store.Limits{Name: "a", RPM: 50, TPM: 5000}
	var taken atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 20 {
				v, err := s.Admit(ctxOf(t), u, store.Ask{Tokens: 10}, T0)
				if err != nil {
					t.Error(err)
					return
				}
				if v.Taken {
					taken.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if taken.Load() != 50 {
		t.Fatalf("%d of 160 concurrent admissions taken from a bucket of 50", taken.Load())
	}
}

var policy = store.CircuitPolicy{Failures: 2, Cooldown: 30 * time.Second, MaxCooldown: 5 * time.Minute}

var (
	fail    = store.Outcome{Result: store.Failure}
	success = store.Outcome{Result: store.Success}
)

// probe is an ask that claims a half-open circuit's probe for 10 s.
var probe = store.Ask{Probe: 10 * time.Second}

// testCircuitCycle walks one circuit through its states: closed, open
// after more than Failures failures, half-open, the probe claimed by one,
// closed by its success.
func testCircuitCycle(t *testing.T, s store.State) {
	u := store.Limits{Name: "a", RPM: 100}
	for i := range 2 {
		if c := outcome(t, s, "a", policy, fail, T0); c != (store.Change{}) {
			t.Fatalf("failure %d of 2 tolerated: %+v", i+1, c)
		}
	}
	if v := admit(t, s, u, probe, T0); !v.Taken || !v.Failing || v.Probe != "" {
		t.Fatalf("closed circuit during a failure run: %+v, want taken, failing", v)
	}
	c := outcome(t, s, "a", policy, store.Outcome{Result: store.Failure, Hint: 10 * time.Second}, at(time.Second))
	until := at(31 * time.Second)
	if !c.Opened.Equal(until) || c.Run != 3 || c.Closed {
		t.Fatalf("third failure: %+v, want opened until +31s by a run of 3", c)
	}
	if v := admit(t, s, u, probe, at(2*time.Second)); v.Taken || !v.Open || !v.Until.Equal(until) {
		t.Fatalf("open circuit: %+v", v)
	}
	if c := outcome(t, s, "a", policy, fail, at(3*time.Second)); c != (store.Change{}) {
		t.Fatalf("a failure while open: %+v, want no change", c)
	}
	if v := admit(t, s, u, store.Ask{Force: true}, at(2*time.Second)); !v.Taken || v.Probe != "" {
		t.Fatalf("forced through an open circuit: %+v", v)
	}
	if c := outcome(t, s, "a", policy, success, at(3*time.Second)); c.Closed {
		t.Fatal("a success that was not the probe closed the circuit")
	}
	if v := admit(t, s, u, probe, at(3*time.Second)); !v.Open {
		t.Fatalf("a non-probe success closed it: %+v", v)
	}
	// Half-open: the first to ask claims the probe; the others see the
	// circuit open until the claim ends.
	half := at(40 * time.Second)
	first := admit(t, s, u, probe, half)
	if !first.Taken || first.Probe == "" {
		t.Fatalf("half-open: %+v, want the probe claimed", first)
	}
	if v := admit(t, s, u, probe, half.Add(time.Second)); !v.Open || !v.Until.Equal(half.Add(10*time.Second)) {
		t.Fatalf("while probing: %+v, want open until the claim's end", v)
	}
	if v := admit(t, s, u, store.Ask{Force: true}, half); !v.Taken || v.Probe != "" {
		t.Fatalf("forced while probing: %+v, want taken, no claim", v)
	}
	if c := outcome(t, s, "a", policy, fail, half); c != (store.Change{}) {
		t.Fatalf("a failure that was not the probe's, half-open: %+v, want no change", c)
	}
	// The probe fails: open again for twice the period.
	c = outcome(t, s, "a", policy, store.Outcome{Result: store.Failure, Probe: first.Probe}, half)
	reopened := half.Add(2 * policy.Cooldown)
	if !c.Opened.Equal(reopened) || c.Run != 0 {
		t.Fatalf("the failed probe: %+v, want opened again until %s", c, reopened.Sub(T0))
	}
	if v := admit(t, s, u, probe, half); !v.Open || !v.Until.Equal(reopened) {
		t.Fatalf("after the failed probe: %+v", v)
	}
	if c := outcome(t, s, "a", policy, store.Outcome{Result: store.Success, Probe: first.Probe}, half); c.Closed {
		t.Fatal("the failed probe's claim closed the new open period")
	}
	half = reopened.Add(time.Second)
	second := admit(t, s, u, probe, half)
	if !second.Taken || second.Probe == "" || second.Probe == first.Probe {
		t.Fatalf("half-open again: %+v, want a new claim", second)
	}
	if c := outcome(t, s, "a", policy, store.Outcome{Result: store.Success, Probe: second.Probe}, half); !c.Closed {
		t.Fatalf("the probe's success: %+v, want closed", c)
	}
	if v := admit(t, s, u, probe, half); !v.Taken || v.Probe != "" || v.Failing {
		t.Fatalf("after the probe's success: %+v", v)
	}
	// Closed again, with a fresh run and the first cooldown.
	for range 2 {
		if c := outcome(t, s, "a", policy, fail, half); c != (store.Change{}) {
			t.Fatal("the run did not start again after the close")
		}
	}
	if c := outcome(t, s, "a", policy, fail, half); !c.Opened.Equal(half.Add(policy.Cooldown)) {
		t.Fatalf("after a close: %+v, want the first cooldown again", c)
	}
}

// testCooldownDoubles: each failed probe doubles the open period, up to
// MaxCooldown; a Retry-After longer than the period stretches one period
// without feeding the doubling.
func testCooldownDoubles(t *testing.T, s store.State) {
	p := store.CircuitPolicy{Failures: 1, Cooldown: time.Second, MaxCooldown: 5 * time.Second}
	u := store.Limits{Name: "a"}
	outcome(t, s, "a", p, fail, T0)
	c := outcome(t, s, "a", p, fail, T0)
	if !c.Opened.Equal(at(time.Second)) {
		t.Fatalf("%+v, want open for 1s", c)
	}
	now := c.Opened
	var got []time.Duration
	for i := range 5 {
		v := admit(t, s, u, probe, now)
		if !v.Taken || v.Probe == "" {
			t.Fatalf("round %d: %+v, want the probe", i, v)
		}
		o := store.Outcome{Result: store.Failure, Probe: v.Probe}
		if i == 3 {
			o.Hint = time.Minute
		}
		c := outcome(t, s, "a", p, o, now)
		got = append(got, c.Opened.Sub(now))
		now = c.Opened
	}
	want := []time.Duration{2 * time.Second, 4 * time.Second, 5 * time.Second, time.Minute, 5 * time.Second}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("open periods after failed probes: %v, want %v", got, want)
	}
}

// testStaleProbe: a probe whose claim outlived its lock still closes the
// circuit while the newer probe is in flight; once the newer one failed
// (a new open period), the old claim closes nothing.
func testStaleProbe(t *testing.T, s store.State) {
	u := store.Limits{Name: "a"}
	for _, newerFails := range []bool{false, true} {
		name := fmt.Sprintf("u%v", newerFails)
		u.Name = name
		noErr(t, s.Open(ctxOf(t), name, at(30*time.Second), T0))
		old := admit(t, s, u, probe, at(31*time.Second))
		newer := admit(t, s, u, probe, at(42*time.Second)) // the old lock ended at +41s
		if old.Probe == "" || newer.Probe == "" || old.Probe == newer.Probe {
			t.Fatalf("claims %+v and %+v, want two", old, newer)
		}
		if newerFails {
			if c := outcome(t, s, name, policy, store.Outcome{Result: store.Failure, Probe: newer.Probe}, at(43*time.Second)); c.Opened.IsZero() {
				t.Fatal("the newer probe's failure did not open the circuit again")
			}
		}
		c := outcome(t, s, name, policy, store.Outcome{Result: store.Success, Probe: old.Probe}, at(44*time.Second))
		if c.Closed == newerFails {
			t.Fatalf("newer probe failed %v: the old claim's success: %+v", newerFails, c)
		}
		if !newerFails {
			if c := outcome(t, s, name, policy, store.Outcome{Result: store.Success, Probe: newer.Probe}, at(45*time.Second)); c.Closed {
				t.Fatal("a closed circuit closed again")
			}
		}
	}
}

// testNeutralProbeReleases: a probe that ends neither way (a 4xx) frees
// the claim's lock: the next attempt probes at once.
func testNeutralProbeReleases(t *testing.T, s store.State) {
	u := store.Limits{Name: "a"}
	noErr(t, s.Open(ctxOf(t), "a", T0, T0))
	v := admit(t, s, u, probe, at(time.Second))
	outcome(t, s, "a", policy, store.Outcome{Result: store.Neutral, Probe: "not-it"}, at(time.Second))
	if w := admit(t, s, u, probe, at(time.Second)); !w.Open {
		t.Fatalf("another token released the lock: %+v", w)
	}
	outcome(t, s, "a", policy, store.Outcome{Result: store.Neutral, Probe: v.Probe}, at(time.Second))
	w := admit(t, s, u, probe, at(time.Second))
	if !w.Taken || w.Probe == "" {
		t.Fatalf("after a neutral probe: %+v, want a new claim", w)
	}
	// The neutral probe's claim is still of the period: its success closes.
	if c := outcome(t, s, "a", policy, store.Outcome{Result: store.Success, Probe: v.Probe}, at(time.Second)); !c.Closed {
		t.Fatalf("%+v, want closed", c)
	}
}

// testActiveProbe: with Ask.Probe 0 nothing claims a half-open circuit:
// it answers Open with the past end, until an ask that probes.
func testActiveProbe(t *testing.T, s store.State) {
	u := store.Limits{Name: "a", RPM: 10}
	noErr(t, s.Open(ctxOf(t), "a", at(time.Second), T0))
	for range 3 {
		if v := admit(t, s, u, store.Ask{}, at(time.Minute)); !v.Open || !v.Until.Equal(at(time.Second)) {
			t.Fatalf("%+v, want half-open with no claim", v)
		}
	}
	if v := admit(t, s, store.Limits{Name: "a"}, probe, at(time.Minute)); !v.Taken || v.Probe == "" {
		t.Fatalf("the active probe: %+v", v)
	}
	if v := admit(t, s, u, store.Ask{}, at(time.Minute)); !v.Open || !v.Until.Equal(at(time.Minute+10*time.Second)) {
		t.Fatalf("%+v, want open until the claim's end", v)
	}
}

// testCountingOff: with Failures 0 or less failures never open a closed
// circuit, and a failure in half-open still opens it again.
func testCountingOff(t *testing.T, s store.State) {
	off := store.CircuitPolicy{Failures: -1, Cooldown: time.Second, MaxCooldown: time.Minute}
	for range 10 {
		if c := outcome(t, s, "a", off, fail, T0); c != (store.Change{}) {
			t.Fatalf("counting off: %+v", c)
		}
	}
	if v := admit(t, s, store.Limits{Name: "a"}, probe, T0); !v.Taken || v.Failing {
		t.Fatalf("counting off: %+v, want taken, no run", v)
	}
	noErr(t, s.Open(ctxOf(t), "a", at(time.Second), T0))
	v := admit(t, s, store.Limits{Name: "a"}, probe, at(2*time.Second))
	if c := outcome(t, s, "a", off, store.Outcome{Result: store.Failure, Probe: v.Probe}, at(2*time.Second)); !c.Opened.Equal(at(4 * time.Second)) {
		t.Fatalf("a failed probe, counting off: %+v, want open again for 2s", c)
	}
}

// testFailureRunForgotten: failures further apart than the failure run's
// memory (store.DefaultFailureRun) never add up.
func testFailureRunForgotten(t *testing.T, s store.State) {
	outcome(t, s, "a", policy, fail, T0)
	outcome(t, s, "a", policy, fail, at(50*time.Second))
	if c := outcome(t, s, "a", policy, fail, at(50*time.Second+store.DefaultFailureRun)); !c.Opened.IsZero() {
		t.Fatalf("a forgotten run opened the circuit: %+v", c)
	}
	if c := outcome(t, s, "a", policy, fail, at(60*time.Second+store.DefaultFailureRun)); !c.Opened.IsZero() {
		t.Fatalf("%+v", c)
	}
	if c := outcome(t, s, "a", policy, fail, at(70*time.Second+store.DefaultFailureRun)); c.Run != 3 {
		t.Fatalf("a live run: %+v, want it opened by a run of 3", c)
	}
	// A success ends a run.
	outcome(t, s, "b", policy, fail, T0)
	outcome(t, s, "b", policy, fail, T0)
	outcome(t, s, "b", policy, success, T0)
	if c := outcome(t, s, "b", policy, fail, T0); !c.Opened.IsZero() {
		t.Fatalf("a success did not end the run: %+v", c)
	}
}

// testOpen: Open keeps the later end, ends the run and the claims of the
// period before.
func testOpen(t *testing.T, s store.State) {
	ctx := ctxOf(t)
	u := store.Limits{Name: "a"}
	outcome(t, s, "a", policy, fail, T0)
	outcome(t, s, "a", policy, fail, T0)
	noErr(t, s.Open(ctx, "a", at(20*time.Second), T0))
	noErr(t, s.Open(ctx, "a", at(10*time.Second), T0))
	if v := admit(t, s, u, probe, T0); !v.Open || !v.Until.Equal(at(20*time.Second)) {
		t.Fatalf("%+v, want open until +20s", v)
	}
	v := admit(t, s, u, probe, at(21*time.Second))
	if !v.Taken || v.Probe == "" {
		t.Fatalf("%+v, want the probe", v)
	}
	noErr(t, s.Open(ctx, "a", at(60*time.Second), at(21*time.Second)))
	if c := outcome(t, s, "a", policy, store.Outcome{Result: store.Success, Probe: v.Probe}, at(22*time.Second)); c.Closed {
		t.Fatal("a claim of the period before closed the new one")
	}
	w := admit(t, s, u, probe, at(61*time.Second))
	if !w.Taken || w.Probe == "" {
		t.Fatalf("after the new period: %+v, want a new claim (the old lock ended with its period)", w)
	}
	if c := outcome(t, s, "a", policy, store.Outcome{Result: store.Success, Probe: w.Probe}, at(61*time.Second)); !c.Closed {
		t.Fatal("the new claim did not close it")
	}
	for range 2 {
		if c := outcome(t, s, "a", policy, fail, at(62*time.Second)); !c.Opened.IsZero() {
			t.Fatal("the run survived the open")
		}
	}
}

// testHalfOpenForgotten: a circuit left half-open with no probe is
// forgotten (closed) store.OpenKeep after its open period ends.
func testHalfOpenForgotten(t *testing.T, s store.State) {
	u := store.Limits{Name: "a"}
	noErr(t, s.Open(ctxOf(t), "a", at(time.Second), T0))
	if v := admit(t, s, u, store.Ask{}, at(time.Second+store.OpenKeep-time.Millisecond)); !v.Open {
		t.Fatalf("%+v, want half-open", v)
	}
	if v := admit(t, s, u, store.Ask{}, at(time.Second+store.OpenKeep)); !v.Taken {
		t.Fatalf("%+v, want closed", v)
	}
}

// testOneProber: of many attempts that find the circuit half-open at once,
// exactly one claims the probe.
func testOneProber(t *testing.T, s store.State) {
	u := store.Limits{Name: "a", RPM: 1000}
	for round := range 3 {
		noErr(t, s.Open(ctxOf(t), "a", at(time.Duration(round)*time.Minute), at(time.Duration(round)*time.Minute)))
		now := at(time.Duration(round)*time.Minute + time.Second)
		var claims atomic.Int32
		var token atomic.Value
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				v, err := s.Admit(ctxOf(t), u, probe, now)
				switch {
				case err != nil:
					t.Error(err)
				case v.Taken && v.Probe != "":
					claims.Add(1)
					token.Store(v.Probe)
				case v.Taken:
					t.Errorf("a half-open circuit admitted an attempt that is not the probe: %+v", v)
				}
			})
		}
		wg.Wait()
		if claims.Load() != 1 {
			t.Fatalf("round %d: %d probes claimed", round, claims.Load())
		}
		outcome(t, s, "a", policy, store.Outcome{Result: store.Success, Probe: token.Load().(string)}, now)
	}
}

// window is the budget window the ledger tests use.
var window = T0.Truncate(time.Hour).Add(time.Hour)

func reserve(t *testing.T, l store.Ledger, k store.BudgetKey, limit int64, h store.Hold, now time.Time) store.Reservation {
	t.Helper()
	r, err := l.Reserve(ctxOf(t), k, limit, h, now)
	if err != nil {
		t.Fatalf("Reserve(%+v, %d, %+v): %v", k, limit, h, err)
	}
	return r
}

func usage(t *testing.T, l store.Ledger, k store.BudgetKey, now time.Time) [2]int64 {
	t.Helper()
	s, r, err := l.Usage(ctxOf(t), k, now)
	if err != nil {
		t.Fatal(err)
	}
	return [2]int64{s, r}
}

func hold(id string, amount int64) store.Hold {
	return store.Hold{ID: id, Amount: amount, Expires: T0.Add(10 * time.Minute)}
}

// testLedgerReserve: holds within the limit, top-ups, smaller amounts,
// repeats, settlements and what is left.
func testLedgerReserve(t *testing.T, l store.State) {
	ctx := ctxOf(t)
	k := store.BudgetKey{Budget: "b", Key: "team", Window: window}
	if r := reserve(t, l, k, 100, hold("h1", 60), T0); !r.OK || r.Left != 40 {
		t.Fatalf("%+v, want ok with 40 left", r)
	}
	if r := reserve(t, l, k, 100, hold("h2", 50), T0); r.OK || r.Left != 40 {
		t.Fatalf("%+v, want refused with 40 left", r)
	}
	if r := reserve(t, l, k, 100, hold("h1", 60), T0); !r.OK || r.Left != 40 {
		t.Fatalf("a repeat: %+v, want ok, nothing more held", r)
	}
	if r := reserve(t, l, k, 100, hold("h1", 90), T0); !r.OK || r.Left != 10 {
		t.Fatalf("a top-up: %+v", r)
	}
	if r := reserve(t, l, k, 100, hold("h1", 120), T0); r.OK {
		t.Fatalf("a top-up past the limit: %+v", r)
	}
	if r := reserve(t, l, k, 100, hold("h1", 20), T0); !r.OK || r.Left != 80 {
		t.Fatalf("a smaller amount: %+v", r)
	}
	noErr(t, l.Settle(ctx, k, "h1", 30, T0))
	if u := usage(t, l, k, T0); u != [2]int64{30, 0} {
		t.Fatalf("after the settlement: %v, want 30 spent", u)
	}
	noErr(t, l.Settle(ctx, k, "never", 5, T0))
	noErr(t, l.Settle(ctx, k, "", 5, T0))
	if u := usage(t, l, k, T0); u != [2]int64{40, 0} {
		t.Fatalf("%v, want 40 spent", u)
	}
	if r := reserve(t, l, k, 100, hold("h3", 61), T0); r.OK || r.Left != 60 {
		t.Fatalf("%+v, want refused with 60 left", r)
	}
	if r := reserve(t, l, k, 100, hold("h3", 60), T0); !r.OK || r.Left != 0 {
		t.Fatalf("%+v, want the last 60", r)
	}
	if r := reserve(t, l, k, 100, hold("h4", 0), T0); !r.OK {
		t.Fatalf("a zero hold on a spent budget: %+v", r)
	}
	if u := usage(t, l, store.BudgetKey{Budget: "b", Key: "other", Window: window}, T0); u != [2]int64{} {
		t.Fatalf("another key: %v", u)
	}
}

// testLedgerLikeLocal drives the ledger and store.Local's with the same
// random reservations and settlements: same answers, same usage.
func testLedgerLikeLocal(t *testing.T, l store.State) {
	ctx := ctxOf(t)
	ref := store.NewLocal()
	rng := rand.New(rand.NewPCG(3, 4))
	k := store.BudgetKey{Budget: "b", Window: window}
	for i := range 300 {
		id := fmt.Sprint("h", rng.IntN(20))
		now := T0.Add(time.Duration(i) * time.Second)
		if rng.IntN(3) == 0 {
			spent := rng.Int64N(50)
			noErr(t, l.Settle(ctx, k, id, spent, now))
			noErr(t, ref.Settle(ctx, k, id, spent, now))
		} else {
			h := store.Hold{ID: id, Amount: rng.Int64N(300), Expires: now.Add(time.Duration(rng.IntN(120)) * time.Second)}
			got, want := reserve(t, l, k, 5000, h, now), reserve(t, ref, k, 5000, h, now)
			if got != want {
				t.Fatalf("call %d, %+v: %+v, reference %+v", i, h, got, want)
			}
		}
		if got, want := usage(t, l, k, now), usage(t, ref, k, now); got != want {
			t.Fatalf("call %d: usage %v, reference %v", i, got, want)
		}
	}
}

// testLedgerExact: amounts near 2^53 and limits near the top of int64
// add up exactly.
func testLedgerExact(t *testing.T, l store.State) {
	k := store.BudgetKey{Budget: "exact", Window: window}
	const big = 1 << 52
	limit := int64(3*big + 1)
	for i := range 3 {
		if r := reserve(t, l, k, limit, hold(fmt.Sprint(i), big), T0); !r.OK {
			t.Fatalf("hold %d: %+v", i, r)
		}
	}
	if r := reserve(t, l, k, limit, hold("x", 2), T0); r.OK || r.Left != 1 {
		t.Fatalf("%+v, want refused with exactly 1 left", r)
	}
	if r := reserve(t, l, k, limit, hold("y", 1), T0); !r.OK || r.Left != 0 {
		t.Fatalf("%+v, want the last unit", r)
	}
	huge := store.BudgetKey{Budget: "huge", Window: window}
	for i := range 3 {
		noErr(t, l.Settle(ctxOf(t), huge, "", 3_000_000_000_000_000_000, T0))
		if r := reserve(t, l, huge, 4_000_000_000_000_000_000*2, hold(fmt.Sprint(i), 1), T0); r.OK != (i < 2) {
			t.Fatalf("round %d near the top of int64: %+v", i, r)
		}
	}
}

// testLedgerHoldsExpire: a hold stops counting once the time given passes
// its expiry; a settled hold's expiry changes nothing.
func testLedgerHoldsExpire(t *testing.T, l store.State) {
	k := store.BudgetKey{Budget: "b", Window: window}
	reserve(t, l, k, 100, store.Hold{ID: "a", Amount: 60, Expires: at(time.Minute)}, T0)
	reserve(t, l, k, 100, store.Hold{ID: "b", Amount: 30, Expires: at(2 * time.Minute)}, T0)
	if u := usage(t, l, k, at(time.Minute-time.Millisecond)); u != [2]int64{0, 90} {
		t.Fatalf("%v, want 90 reserved", u)
	}
	if u := usage(t, l, k, at(time.Minute)); u != [2]int64{0, 30} {
		t.Fatalf("%v, want a's hold gone", u)
	}
	if r := reserve(t, l, k, 100, hold("c", 70), at(time.Minute)); !r.OK {
		t.Fatalf("%+v, want room for 70", r)
	}
	noErr(t, l.Settle(ctxOf(t), k, "a", 10, at(time.Minute)))
	if u := usage(t, l, k, at(3*time.Minute)); u != [2]int64{10, 70} {
		t.Fatalf("%v, want 10 spent and c's 70 held", u)
	}
}

// testLedgerSettledNotRemade: a Reserve of a hold already settled (a late
// reply) is refused and holds nothing.
func testLedgerSettledNotRemade(t *testing.T, l store.State) {
	k := store.BudgetKey{Budget: "b", Window: window}
	noErr(t, l.Settle(ctxOf(t), k, "late", 0, T0))
	if r := reserve(t, l, k, 100, hold("late", 10), T0.Add(time.Second)); r.OK {
		t.Fatalf("%+v, want a settled hold refused", r)
	}
	reserve(t, l, k, 100, hold("x", 10), T0)
	noErr(t, l.Settle(ctxOf(t), k, "x", 10, T0))
	if r := reserve(t, l, k, 100, hold("x", 10), T0.Add(time.Second)); r.OK {
		t.Fatalf("%+v, want a settled hold refused", r)
	}
	if u := usage(t, l, k, T0.Add(time.Second)); u != [2]int64{10, 0} {
		t.Fatalf("%v, want nothing held", u)
	}
}

// testLedgerConcurrent: of many reservations at once, never more than the
// limit is held.
func testLedgerConcurrent(t *testing.T, l store.State) {
	k := store.BudgetKey{Budget: "b", Window: window}
	var ok atomic.Int32
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 25 {
				r, err := l.Reserve(ctxOf(t), k, 1000, hold(fmt.Sprint(g, "-", i), 7), T0)
				if err != nil {
					t.Error(err)
					return
				}
				if r.OK {
					ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if ok.Load() != 1000/7 {
		t.Fatalf("%d holds of 7 within 1000, want %d", ok.Load(), 1000/7)
	}
}

// testLedgerKeys: the keys a budget has ledgers for in a window.
func testLedgerKeys(t *testing.T, l store.State) {
	for _, key := range []string{"x", "y:z", "{w}"} {
		reserve(t, l, store.BudgetKey{Budget: "b", Key: key, Window: window}, 100, hold(key, 1), T0)
	}
	noErr(t, l.Settle(ctxOf(t), store.BudgetKey{Budget: "b", Key: "s", Window: window}, "", 1, T0))
	keys, err := l.Keys(ctxOf(t), "b", window)
	noErr(t, err)
	got := map[string]bool{}
	for _, k := range keys {
		got[k] = true
	}
	if len(got) != 4 || !got["x"] || !got["y:z"] || !got["{w}"] || !got["s"] {
		t.Fatalf("keys %q", keys)
	}
}
