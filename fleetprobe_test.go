package relay

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay/store"
)

// newProbeReplicaWith is newProbeReplica with a breaker and retries of the
// test's choice and a status that can change between calls.
func newProbeReplicaWith(t *testing.T, st store.State, clock Clock, breaker BreakerConfig, retry RetryConfig, status *atomic.Int64, gated bool) *probeReplica {
	p := &probeReplica{sent: make(chan struct{}, 1)}
	if gated {
		p.gate = make(chan struct{})
	}
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		io.Copy(io.Discard, r.Body)
		p.calls.Add(1)
		if p.gate != nil {
			p.sent <- struct{}{}
			<-p.gate
		}
		return &http.Response{StatusCode: int(status.Load()), Header: http.Header{},
			Body: io.NopCloser(strings.NewReader(`{"usage":{"prompt_tokens":8,"completion_tokens":2}}`))}, nil
	})
	r, err := New(Config{Base: base, Clock: clock, State: st, StateTimeout: time.Second,
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
		Breaker:   breaker, Retry: retry})
	require.NoError(t, err)
	t.Cleanup(func() { assert.Zero(t, r.StateFallbacks(), "no State call fell back") })
	p.Router = r
	return p
}

func statusOf(s int) *atomic.Int64 {
	var v atomic.Int64
	v.Store(int64(s))
	return &v
}

// TestStaleFailedProbeLeavesClosedCircuit: replica A claims the fleet's
// half-open probe and its call outlives the claim's lock; B then claims
// the probe and succeeds: the circuit closes for the fleet. A's stale
// probe then fails. With failure counting on, Failure counts it; with it
// off (Breaker.Failures < 0), the failed probe reopens the circuit only
// while it is half-open, so one stale failure does not keep a healthy
// upstream from the whole fleet for the cooldown (it did, through an
// unconditional Open).
func TestStaleFailedProbeLeavesClosedCircuit(t *testing.T) {
	for _, c := range []struct {
		name     string
		failures int
	}{
		{"counting on (control: Failure counts one, the circuit stays closed)", 2},
		{"counting off", -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock := newFakeClock()
			st := newMemState()
			br := BreakerConfig{Failures: c.failures, Cooldown: 30 * time.Second, P99: -1}
			one := RetryConfig{MaxAttempts: 1}
			a := newProbeReplicaWith(t, st, clock, br, one, statusOf(503), true)
			b := newProbeReplicaWith(t, st, clock, br, one, statusOf(200), false)
			require.NoError(t, st.Open(context.Background(), "a", clock.Now().Add(30*time.Second), clock.Now()))
			clock.Advance(31 * time.Second) // half-open
			aDone := a.start()              // A claims the probe; its call is slow
			clock.Advance(11 * time.Second) // and outlives its lock (10 s)

			resp, _, err := send(t, b, chatBody("gpt-4.1", "x"))
			require.NoError(t, err)
			require.Equal(t, 200, resp.StatusCode, "B's probe")
			require.True(t, openUntil(t, st, "a", clock.Now()).IsZero(), "B's probe closed the circuit")

			close(a.gate) // A's stale probe fails
			require.NoError(t, <-aDone)
			assert.True(t, openUntil(t, st, "a", clock.Now()).IsZero(), "A's stale failed probe opened the closed circuit for the fleet")
		})
	}
}

// TestForcedRetryCarriesNoProbeClaim: the fleet's probe fails and opens
// the circuit again for twice its period (from t1); the request's retry goes
// back to the same upstream, forced (the never-empty rule: it is the only
// one). A forced attempt claims nothing: its failure leaves the open
// period at t1 + 2·cooldown, with failure counting on or off. (The
// candidate kept the probe's claim for the retry, and with counting off
// its failure pushed the period back by the backoff.)
func TestForcedRetryCarriesNoProbeClaim(t *testing.T) {
	for _, c := range []struct {
		name     string
		failures int
	}{
		{"counting on (control)", 2},
		{"counting off", -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock := newAutoClock()
			st := newMemState()
			r := newProbeReplicaWith(t, st, clock, BreakerConfig{Failures: c.failures, Cooldown: 30 * time.Second, P99: -1},
				RetryConfig{MaxAttempts: 2, Backoff: func(int) time.Duration { return 5 * time.Second }}, statusOf(503), false)
			require.NoError(t, st.Open(context.Background(), "a", clock.Now().Add(30*time.Second), clock.Now()))
			clock.Advance(31 * time.Second) // half-open: this replica claims the probe
			t1 := clock.Now()
			resp, _, err := send(t, r, chatBody("gpt-4.1", "x"))
			require.NoError(t, err)
			require.Equal(t, 503, resp.StatusCode)
			require.EqualValues(t, 2, r.calls.Load(), "the probe, then the forced retry")
			require.Equal(t, t1.Add(5*time.Second), clock.Now(), "the retry came after the backoff")
			until := openUntil(t, st, "a", clock.Now())
			assert.Equal(t, t1.Add(60*time.Second), until,
				"the fleet's open period: the failed probe's; the forced retry (no claim) must not move it")
		})
	}
}
