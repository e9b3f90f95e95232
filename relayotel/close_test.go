package relayotel_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relayotel"
)

// TestCloseKeepsCountersMonotonic: Close's own use case, a configuration
// reload. The new router's Observer has the old one's name (or none), so
// both report the same attribute sets of relay.client.cost and
// relay.client.attempts; closing the old one keeps its totals reported,
// and the cumulative counters never go backwards, as a synchronous
// counter's would not. (Close dropped them.)
func TestCloseKeepsCountersMonotonic(t *testing.T) {
	for _, name := range []string{"", "chat"} {
		t.Run("router="+name, func(t *testing.T) {
			reader, mp := meterProvider(t)
			a := relay.Upstream{Name: "a", BaseURL: "http://a.test/v1"}
			newObs := func() *relayotel.Observer {
				return relayotel.New(relayotel.WithMeterProvider(mp), relayotel.WithUpstreams(a), relayotel.WithRouterName(name))
			}
			call := func(o *relayotel.Observer) {
				h := o.Hooks()
				done := h.OnAttempt(t.Context(), relay.AttemptInfo{Upstream: "a", Model: "gpt-4.1", N: 1},
					&http.Request{Header: http.Header{}})
				done(relay.AttemptDone{StatusCode: 200})
				h.OnReport(relay.Report{Endpoint: "chat/completions", RequestedModel: "gpt-4.1", Model: "gpt-4.1", Upstream: "a",
					Bucket: "short", Attempts: 1, StatusCode: 200, Priced: true, CostUSD: 0.5})
			}
			total := func(metric string) float64 {
				in := collect(t, reader)[metric]
				require.Len(t, in.Points, 1, metric)
				return in.Points[0].Value
			}

			old := newObs()
			call(old)
			call(old)
			cost, attempts := total("relay.client.cost"), total("relay.client.attempts")
			require.Equal(t, 1.0, cost)
			require.Equal(t, 2.0, attempts)

			// The reload: a new router and Observer, the old one closed.
			cur := newObs()
			require.NoError(t, old.Close())
			call(cur)
			assert.GreaterOrEqual(t, total("relay.client.cost"), cost, "relay.client.cost went backwards after Close")
			assert.GreaterOrEqual(t, total("relay.client.attempts"), attempts, "relay.client.attempts went backwards after Close")
			require.NoError(t, cur.Close())
		})
	}
}

// TestAliasNotLearned: a model is learned once "an upstream was called
// with it" (WithModelLimit). A Policy that sends any name it does not know
// to a default model (a catch-all alias) never sends the caller's name
// upstream, so the name asked for is not learned from the default model's
// answer (it was, until the limit was spent on made-up names and real
// models not named were "_OTHER").
func TestAliasNotLearned(t *testing.T) {
	a := server(t, "a")
	h := newHarness(t, relay.Config{
		Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}},
		Policy: relay.PolicyFunc(func(r relay.Request) relay.Route {
			if r.Model != "gpt-4.1" {
				return relay.Route{Model: "gpt-4.1-mini"} // the default model
			}
			return relay.Route{}
		}),
	}, relayotel.WithModelLimit(2))
	h.chat(t, chatBody("made-up", false)) // the upstream was called with gpt-4.1-mini only
	h.chat(t, chatBody("gpt-4.1", false)) // the upstream was called with gpt-4.1
	require.Len(t, h.reports, 2)
	require.Equal(t, "gpt-4.1-mini", h.reports[0].Model)
	assert.Equal(t, map[string]float64{
		"_OTHER gpt-4.1-mini": 1,
		"gpt-4.1 gpt-4.1":     1,
	}, by(h.metrics(t)["gen_ai.client.operation.duration"], reqModel, respModel))
}

// TestCloseDeltaNotNegative: the same reload read with delta temporality
// (as Datadog's and other vendors' OTLP endpoints prefer): after the old
// Observer's Close, relay.client.cost reports no negative delta for a
// monotonic counter (it reported -0.5).
func TestCloseDeltaNotNegative(t *testing.T) {
	reader := sdkmetric.NewManualReader(sdkmetric.WithTemporalitySelector(sdkmetric.DeltaTemporalitySelector))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	report := func(o *relayotel.Observer) {
		o.Hooks().OnReport(relay.Report{Endpoint: "chat/completions", RequestedModel: "gpt-4.1", Model: "gpt-4.1", Upstream: "a",
			Bucket: "short", Attempts: 1, StatusCode: 200, Priced: true, CostUSD: 0.5})
	}
	delta := func() float64 {
		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(context.Background(), &rm))
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if m.Name == "relay.client.cost" {
					s := m.Data.(metricdata.Sum[float64])
					require.True(t, s.IsMonotonic)
					require.Len(t, s.DataPoints, 1)
					return s.DataPoints[0].Value
				}
			}
		}
		t.Fatal("no relay.client.cost")
		return 0
	}
	old := relayotel.New(relayotel.WithMeterProvider(mp))
	report(old)
	report(old)
	require.Equal(t, 1.0, delta())
	cur := relayotel.New(relayotel.WithMeterProvider(mp))
	require.NoError(t, old.Close())
	report(cur)
	assert.GreaterOrEqual(t, delta(), 0.0, "a monotonic counter's delta after the old Observer's Close")
	require.NoError(t, cur.Close())
}
