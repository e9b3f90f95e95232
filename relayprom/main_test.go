package relayprom_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relayprom"
	"github.com/tokenrelay/relay/relaytest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// harness is a Router observed by a Collector.
type harness struct {
	c      *relayprom.Collector
	router *relay.Router

	mu      sync.Mutex
	reports []relay.Report
}

// newHarness builds the router of cfg, observed by a Collector that knows
// cfg's upstreams and the model gpt-4.1 (plus opts).
func newHarness(t *testing.T, cfg relay.Config, opts ...relayprom.Option) *harness {
	t.Helper()
	h := &harness{c: relayprom.New(append([]relayprom.Option{
		relayprom.WithUpstreams(cfg.Upstreams...), relayprom.WithModels("gpt-4.1"),
	}, opts...)...)}
	cfg.Hooks = h.c.Hooks()
	cfg.OnReport = func(r relay.Report) {
		h.mu.Lock()
		h.reports = append(h.reports, r)
		h.mu.Unlock()
	}
	if cfg.Retry.Backoff == nil {
		cfg.Retry.Backoff = func(int) time.Duration { return 0 }
	}
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	cfg.Base = tr
	r, err := relay.New(cfg)
	require.NoError(t, err)
	h.router = r
	return h
}

func server(t *testing.T, name string) *relaytest.Server {
	t.Helper()
	s := relaytest.NewServer(relaytest.WithName(name))
	t.Cleanup(s.Close)
	return s
}

// do sends body to the router's endpoint and reads the whole answer.
func (h *harness) do(t *testing.T, method, endpoint, body string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, "http://relay.test/v1/"+endpoint, strings.NewReader(body))
	require.NoError(t, err)
	resp, err := h.router.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	_, err = io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return resp, nil
}

func (h *harness) chat(t *testing.T, body string) *http.Response {
	t.Helper()
	resp, err := h.do(t, http.MethodPost, "chat/completions", body)
	require.NoError(t, err)
	return resp
}

func (h *harness) report(t *testing.T) relay.Report {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	require.Len(t, h.reports, 1)
	return h.reports[0]
}

// compare checks the exposition of the named metrics against expected.
func (h *harness) compare(t *testing.T, expected string, names ...string) {
	t.Helper()
	require.NoError(t, testutil.CollectAndCompare(h.c, strings.NewReader(expected), names...))
}

// histogram is a histogram series, flattened: its labels, bucket bounds and
// sample count (sums vary with time and are left out).
type histogram struct {
	Labels string
	Bounds []float64
	Count  uint64
}

// histograms gathers the series of a histogram through a pedantic
// registry, which checks the collector's consistency too.
func (h *harness) histograms(t *testing.T, name string) []histogram {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(h.c))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var out []histogram
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			hs := histogram{Labels: strings.Join(labels, ","), Count: m.GetHistogram().GetSampleCount()}
			for _, b := range m.GetHistogram().GetBucket() {
				hs.Bounds = append(hs.Bounds, b.GetUpperBound())
			}
			out = append(out, hs)
		}
	}
	slices.SortFunc(out, func(a, b histogram) int { return strings.Compare(a.Labels, b.Labels) })
	return out
}

func chatBody(model string, stream bool) string {
	s := ""
	if stream {
		s = `,"stream":true`
	}
	return `{"model":"` + model + `","messages":[{"role":"user","content":"Say hello."}]` + s + `}`
}

// The help texts, as the exposition shows them.
const (
	helpRequests    = "# HELP relay_requests_total Calls through the router, by the final status class (none: no response came).\n# TYPE relay_requests_total counter\n"
	helpErrors      = "# HELP relay_errors_total Failed calls, by error type.\n# TYPE relay_errors_total counter\n"
	helpTokens      = "# HELP relay_tokens_total Tokens billed: input and output, and the cache_read part of input and the reasoning part of output.\n# TYPE relay_tokens_total counter\n"
	helpCost        = "# HELP relay_cost_usd_total Cost of the calls in US dollars, after each upstream's price factor.\n# TYPE relay_cost_usd_total counter\n"
	helpAttempts    = "# HELP relay_attempts_total Upstream calls, hedges included, by outcome.\n# TYPE relay_attempts_total counter\n"
	helpRetries     = "# HELP relay_retries_total Upstream calls made again after a failed one, by the failed one's upstream and outcome.\n# TYPE relay_retries_total counter\n"
	helpHedges      = "# HELP relay_hedges_total Hedges sent: won when the hedge's answer was the one returned.\n# TYPE relay_hedges_total counter\n"
	helpBreaker     = "# HELP relay_breaker_state Circuit breaker state of each upstream: 1 for the current state, 0 for the others.\n# TYPE relay_breaker_state gauge\n"
	helpTransitions = "# HELP relay_breaker_transitions_total Circuit breaker state changes, by the new state.\n# TYPE relay_breaker_transitions_total counter\n"
	helpSpend       = "# HELP relay_budget_spend_total Spend charged to each budget's ledgers, in the billing currency.\n# TYPE relay_budget_spend_total counter\n"
	helpRefusals    = "# HELP relay_budget_refusals_total Requests a budget refused (relay.ErrBudgetExceeded), no upstream called.\n# TYPE relay_budget_refusals_total counter\n"
	helpFallbacks   = "# HELP relay_state_fallbacks_total Calls to the shared state (Config.State, a shared Ledger) that failed or timed out, decided in-process instead, by operation.\n# TYPE relay_state_fallbacks_total counter\n"
)

// breakerLines are the relay_breaker_state series of an upstream in state.
func breakerLines(up, state string) string {
	var b strings.Builder
	for _, s := range []string{"closed", "half_open", "open"} {
		v := 0
		if s == state {
			v = 1
		}
		fmt.Fprintf(&b, "relay_breaker_state{state=%q,upstream=%q} %d\n", s, up, v)
	}
	return b.String()
}
