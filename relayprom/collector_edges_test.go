package relayprom_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relayprom"
	"github.com/tokenrelay/relay/relaytest"
)

// A stream request answered 429 (a JSON error, no chunk) must not be
// observed in relay_ttft_seconds.
func TestPromTTFTOnErrorStatus(t *testing.T) {
	a := server(t, "a")
	a.Script(relaytest.Fault{Status: 429})
	h := newHarness(t, relay.Config{
		Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}},
		Retry:     relay.RetryConfig{MaxAttempts: 1},
	})
	require.Equal(t, 429, h.chat(t, chatBody("gpt-4.1", true)).StatusCode)
	assert.Empty(t, h.histograms(t, "relay_ttft_seconds"), "no chunk ever came")
}

// Error types: a budget refusal and a first-token failover are named, not
// "_OTHER".
func TestPromFirstTokenOutcome(t *testing.T) {
	a, b := server(t, "a"), server(t, "b")
	a.Script(relaytest.Fault{FirstTokenDelay: 2 * time.Second})
	h := newHarness(t, relay.Config{
		Strategy:  relay.StrategyPriority,
		Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}, {Name: "b", BaseURL: b.URL}},
		Stream:    relay.StreamConfig{FirstTokenTimeout: 100 * time.Millisecond},
	})
	h.chat(t, chatBody("gpt-4.1", true))
	h.compare(t, helpAttempts+`relay_attempts_total{outcome="first_token_timeout",upstream="a"} 1
relay_attempts_total{outcome="2xx",upstream="b"} 1
`+helpRetries+`relay_retries_total{reason="first_token_timeout",upstream="a"} 1
`, "relay_attempts_total", "relay_retries_total")
}

func TestPromBudgetErrorType(t *testing.T) {
	a := server(t, "a")
	tight := []relay.Budget{{Name: "team", Limit: 1e-9, Window: relay.Window{Every: time.Hour}}}
	h := newHarness(t, relay.Config{Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}}, Budgets: tight}, relayprom.WithBudgets(tight...))
	_, err := h.do(t, http.MethodPost, "chat/completions", chatBody("gpt-4.1", false))
	require.ErrorIs(t, err, relay.ErrBudgetExceeded)
	h.compare(t, helpErrors+`relay_errors_total{model="gpt-4.1",type="budget_exceeded",upstream="none"} 1
`, "relay_errors_total")
}

// 50k caller-chosen models, buckets and upstream names: bounded series.
func TestPromFloodStaysBounded(t *testing.T) {
	c := relayprom.New(relayprom.WithUpstreams(relay.Upstream{Name: "a", Models: []string{"gpt-4.1"}}))
	h := c.Hooks()
	for i := range 50000 {
		s := fmt.Sprint(i)
		h.OnReport(relay.Report{RequestedModel: s, Model: s, Upstream: "u" + s, Bucket: "b" + s, StatusCode: 200 + i%400,
			Stream: true, TTFT: time.Millisecond, Err: fmt.Errorf("x%d", i), Budget: "bud" + s})
		h.OnWait(relay.WaitEvent{Upstream: "u" + s, Reason: "rate"})
		h.OnBreaker(relay.BreakerEvent{Upstream: "u" + s, To: relay.StateOpen})
	}
	n := testutil.CollectAndCount(c)
	t.Logf("series: %d", n)
	assert.Less(t, n, 1500) // status codes 400-599 give error types: bounded, not growing with the flood
}
