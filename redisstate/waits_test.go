package redisstate

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/store"
)

// waitRouter is a replica over upstream a (RPM 60: a token a second once
// its minute is spent) sharing st, on clock, whose requests wait up to
// maxWait for their tokens.
func waitRouter(t *testing.T, st store.State, clock relay.Clock, maxWait time.Duration) *relay.Router {
	t.Helper()
	r, err := relay.New(relay.Config{State: st, Clock: clock, StateTimeout: time.Second, Base: newFleetBase(newFleetClock()),
		Limits:    relay.Limits{MaxWait: maxWait},
		Retry:     relay.RetryConfig{MaxAttempts: 1},
		Breaker:   relay.BreakerConfig{P99: -1},
		Upstreams: []relay.Upstream{{Name: "a", BaseURL: "http://a.test/v1", RPM: 60}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if n := r.StateFallbacks(); n > 0 {
			t.Errorf("%d State calls fell back", n)
		}
	})
	return r
}

// spendMinute spends upstream a's minute of RPM 60 on s at now, as the
// rest of the fleet would.
func spendMinute(t *testing.T, s *State, now time.Time) {
	t.Helper()
	for range 60 {
		if v := must[store.Verdict](t)(s.Admit(ctxT(t), store.Limits{Name: "a", RPM: 60}, store.Ask{}, now)); !v.Taken {
			t.Fatalf("%+v", v)
		}
	}
}

// sendAll sends n requests through r at once and returns their results'
// channel.
func sendAll(r *relay.Router, n int) <-chan error {
	errs := make(chan error, n)
	for i := range n {
		go func() {
			status, err := send(r, fmt.Sprintf("waiter %d", i))
			if err == nil && status != http.StatusOK {
				err = fmt.Errorf("status %d", status)
			}
			errs <- err
		}()
	}
	return errs
}

// TestWaitersEndWhenTheFleetOpens: 8 requests of a replica wait for the
// fleet's RPM; another replica opens the upstream's circuit for the
// fleet. The head's next admission finds it open, and every wait ends at
// once: each waiter makes at most 3 admissions in all (on arrival, at
// most one at its turn, the forced try of the only upstream) and gets
// ErrCircuitOpen, or its forced try is served. (The waiters scanned again
// without seeing the open circuit and asked in a loop: 8,000-17,000
// admissions in 2 s, then ErrRateLimited.)
func TestWaitersEndWhenTheFleetOpens(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		s := b.state(t)
		sp := &spy{State: s}
		clock := newManualClock(t0)
		r := waitRouter(t, sp, clock, time.Minute)
		spendMinute(t, s, t0)
		errs := sendAll(r, 8)
		<-clock.armed // the head waits for its token, a second away
		time.Sleep(100 * time.Millisecond)
		noErr(t, s.Open(ctxT(t), "a", t0.Add(time.Hour), t0)) // another replica opens it
		clock.advance(time.Second)
		served, open := 0, 0
		for range 8 {
			switch err := <-errs; {
			case err == nil:
				served++
			case errors.Is(err, relay.ErrCircuitOpen):
				open++
			default:
				t.Errorf("a waiter got %v, want ErrCircuitOpen or its forced try served", err)
			}
		}
		t.Logf("%d served (forced), %d ErrCircuitOpen, %d admissions", served, open, sp.admits.Load())
		if n := sp.admits.Load(); n > 8*3 {
			t.Fatalf("%d admissions for 8 waiters, want at most 24", n)
		}
		if served > 1 {
			t.Fatalf("%d forced tries served with one token due", served)
		}
	})
}

// TestRefusedWithoutWaiting: with the fleet's minute spent (a token a
// second) and MaxWait 3 s, three requests of a replica wait (their turns
// at 1, 2 and 3 s); a fourth, whose turn would come at 4 s, is refused at
// once, with no wait and no admission asked. (Its wait looked only at the
// head's turn: it waited out MaxWait.)
func TestRefusedWithoutWaiting(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		s := b.state(t)
		sp := &spy{State: s}
		clock := newManualClock(t0)
		r := waitRouter(t, sp, clock, 3*time.Second)
		spendMinute(t, s, t0)
		errs := sendAll(r, 1)
		<-clock.armed // the first is the head, 1 s from its token
		more := sendAll(r, 2)
		time.Sleep(100 * time.Millisecond) // they queue behind it (or are refused: the check below tells)
		asked := sp.admits.Load()
		late := sendAll(r, 1)
		select {
		case err := <-late:
			if !errors.Is(err, relay.ErrRateLimited) {
				t.Fatalf("the fourth: %v, want ErrRateLimited", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a request whose turn comes after MaxWait waits (the clock does not move)")
		}
		if n := sp.admits.Load() - asked; n != 0 {
			t.Errorf("the refusal asked %d admissions", n)
		}
		for range 3 {
			clock.advance(time.Second)
		}
		for _, c := range []<-chan error{errs, more, more} {
			if err := <-c; err != nil {
				t.Errorf("a waiter within MaxWait: %v", err)
			}
		}
	})
}

// TestFleetCooldownDoubles: each failed probe of the fleet's circuit,
// whichever replica sends it, doubles the open period: 1, 2, 4, 8 s. (It
// stayed at the first cooldown: a dead upstream was probed every 30 s
// fleet-wide for ever.)
func TestFleetCooldownDoubles(t *testing.T) {
	both(t, func(t *testing.T, b *backend) {
		s := b.state(t)
		clock := newFleetClock()
		base := newFleetBase(clock)
		base.set("a", 503)
		rs := make([]*relay.Router, 4)
		for i := range rs {
			r, err := relay.New(relay.Config{State: s, Replicas: 4, StateTimeout: time.Second, Clock: clock, Base: base,
				Retry:     relay.RetryConfig{MaxAttempts: 1},
				Breaker:   relay.BreakerConfig{Failures: 1, Cooldown: time.Second, MaxCooldown: time.Minute, P99: -1},
				Upstreams: []relay.Upstream{{Name: "a", BaseURL: "http://a.test/v1"}}})
			if err != nil {
				t.Fatal(err)
			}
			rs[i] = r
		}
		send(rs[0], "failure 1")
		send(rs[0], "failure 2")
		var periods []time.Duration
		for i := range 4 {
			v := must[store.Verdict](t)(s.Admit(ctxT(t), store.Limits{Name: "a"}, store.Ask{}, clock.Now()))
			if !v.Open {
				t.Fatalf("round %d: %+v, want open", i, v)
			}
			periods = append(periods, v.Until.Sub(clock.Now()))
			clock.advance(v.Until.Sub(clock.Now()))
			send(rs[(i+1)%4], fmt.Sprintf("probe %d", i)) // the probe, from another replica each time: it fails
		}
		want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second}
		if fmt.Sprint(periods) != fmt.Sprint(want) {
			t.Fatalf("open periods %v, want %v", periods, want)
		}
		if n := base.count("a"); n != 6 {
			t.Fatalf("%d calls reached the upstream, want 2 failures and 4 probes", n)
		}
	})
}
