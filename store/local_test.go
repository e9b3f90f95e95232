package store_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tokenrelay/relay/store"
	"github.com/tokenrelay/relay/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestLocalConformance(t *testing.T) {
	storetest.Run(t, func(*testing.T) store.State { return store.NewLocal() })
}

// TestMirror: a local share mirrored from the fleet's verdicts starts
// where the fleet is: with the fleet's bucket empty, the share is empty
// too, and it refills at the share's rate; a hold and an open circuit
// carry over, and a plain admission closes the circuit again.
func TestMirror(t *testing.T) {
	ctx := context.Background()
	t0 := storetest.T0
	fleet, share := store.Limits{Name: "a", RPM: 120, TPM: 12000}, store.Limits{Name: "a", RPM: 30, TPM: 3000}
	shared, local := store.NewLocal(), store.NewLocal()
	var v store.Verdict
	for range 120 {
		v, _ = shared.Admit(ctx, fleet, store.Ask{Tokens: 10}, t0)
		local.Mirror(share, v, false, t0)
	}
	if !v.Taken {
		t.Fatal("the fleet's quota was not there")
	}
	if w, _ := local.Admit(ctx, share, store.Ask{Tokens: 10}, t0); w.Taken || w.Wait != 2*time.Second {
		t.Fatalf("the share right after the fleet spent its quota: %+v, want empty (2s for one request at 30 RPM)", w)
	}
	taken := 0
	for s := range 10 {
		if w, _ := local.Admit(ctx, share, store.Ask{Tokens: 10}, t0.Add(time.Duration(s+1)*time.Second)); w.Taken {
			taken++
		}
	}
	if taken != 5 {
		t.Fatalf("the share admitted %d in 10 s, want 5 (30 RPM)", taken)
	}

	// The fleet half full: the share holds a quarter of what it has left.
	shared, local = store.NewLocal(), store.NewLocal()
	for range 60 {
		v, _ = shared.Admit(ctx, fleet, store.Ask{Tokens: 10}, t0)
	}
	local.Mirror(share, v, false, t0)
	taken = 0
	for range 30 {
		if w, _ := local.Admit(ctx, share, store.Ask{Tokens: 10}, t0); w.Taken {
			taken++
		}
	}
	if taken != 15 {
		t.Fatalf("the share of a half-full fleet bucket admitted %d, want 15", taken)
	}

	local.Mirror(share, store.Verdict{Wait: time.Second, Until: t0.Add(time.Minute)}, false, t0)
	if w, _ := local.Admit(ctx, store.Limits{Name: "a"}, store.Ask{}, t0.Add(time.Second)); w.Taken || w.Wait != 59*time.Second {
		t.Fatalf("the fleet's hold: %+v, want 59s", w)
	}
	local.Mirror(share, store.Verdict{Open: true, Until: t0.Add(2 * time.Minute)}, false, t0)
	if w, _ := local.Admit(ctx, store.Limits{Name: "a"}, store.Ask{}, t0.Add(time.Minute)); !w.Open || !w.Until.Equal(t0.Add(2*time.Minute)) {
		t.Fatalf("the fleet's open circuit: %+v", w)
	}
	local.Mirror(share, store.Verdict{Taken: true}, true, t0.Add(time.Minute))
	if w, _ := local.Admit(ctx, store.Limits{Name: "a"}, store.Ask{}, t0.Add(time.Minute)); !w.Open {
		t.Fatalf("a forced admission closed the circuit: %+v", w)
	}
	local.Mirror(share, store.Verdict{Taken: true}, false, t0.Add(time.Minute))
	if w, _ := local.Admit(ctx, store.Limits{Name: "a"}, store.Ask{}, t0.Add(time.Minute)); !w.Taken {
		t.Fatalf("the fleet admitted: %+v, want the circuit closed here too", w)
	}
}
