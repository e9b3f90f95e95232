package relay

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay/relaytest"
)

func TestStats(t *testing.T) {
	srvs := newServers(t, 2)
	srvs[1].Script(relaytest.Fault{Status: 503})
	r, _, _ := retryRouter(t, Config{Strategy: StrategyWeighted}, srvs...)
	r.ups[0].cfg.Weight = 1
	for range 5 {
		send(t, r, chatBody("gpt-4.1", "x"))
	}
	st := r.Stats()
	require.Len(t, st, 2)
	var req, fail uint64
	for _, s := range st {
		assert.Zero(t, s.InFlight)
		assert.Equal(t, StateClosed, s.Breaker)
		req += s.Requests
		fail += s.Failures
		assert.Equal(t, int(s.Requests), s.Samples, "every response is a latency sample")
	}
	assert.Equal(t, uint64(5)+fail, req)
}

// TestLatencyTail: the p95 and p99 found in one pass over the window's
// largest latencies are those of the sorted window, at every fill level
// and with ties, after the ring wraps.
func TestLatencyTail(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var w latencyWindow
	w.init(latencyWindowSize)
	now := time.Unix(0, 0)
	for i := range 3 * latencyWindowSize {
		d := time.Duration(rng.IntN(50)) * time.Millisecond // many ties
		if i%7 == 0 {
			d = time.Duration(rng.IntN(1e6)) * time.Microsecond
		}
		w.add(d, now)
		w.mu.Lock()
		p95, p99 := w.tailLocked()
		want95, want99 := w.quantileLocked(0.95), w.quantileLocked(0.99)
		w.mu.Unlock()
		require.Equal(t, want95, p95, "p95 after %d samples", i+1)
		require.Equal(t, want99, p99, "p99 after %d samples", i+1)
	}
}
