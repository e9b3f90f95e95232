package relay

import (
	"testing"

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
