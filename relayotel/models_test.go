package relayotel_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relayotel"
	"github.com/tokenrelay/relay/relaytest"
)

// by adds up in's points (their counts for a histogram, values for a
// counter) by the values of keys, joined by " " ("-" for a key a point
// lacks); points in the SDK's overflow set add to "(overflow)".
func by(in instrument, keys ...string) map[string]float64 {
	out := map[string]float64{}
	for _, p := range in.Points {
		kvs := map[string]string{}
		for _, kv := range strings.Split(p.Attrs, ",") {
			k, v, _ := strings.Cut(kv, "=")
			kvs[k] = v
		}
		var vals []string
		for _, k := range keys {
			v, ok := kvs[k]
			if !ok {
				v = "-"
			}
			vals = append(vals, v)
		}
		key := strings.Join(vals, " ")
		if kvs["otel.metric.overflow"] == "true" {
			key = "(overflow)"
		}
		if p.Count > 0 {
			out[key] += float64(p.Count)
		} else {
			out[key] += p.Value
		}
	}
	return out
}

const reqModel, respModel = "gen_ai.request.model", "gen_ai.response.model"

// A gateway forwards its callers' "model". Its upstream serves gpt-4.1
// only, so the router refuses any other model (ErrNoUpstream) without
// calling it; but each made-up name was a new attribute set of
// gen_ai.client.operation.duration, and after 2,000 of them (the SDK's
// default cardinality limit) the first gpt-4.1 call was recorded in the
// SDK's overflow set instead of its own. A model the Observer does not
// know is recorded as "_OTHER".
func TestModelFlood(t *testing.T) {
	a := server(t, "a")
	h := newHarness(t, relay.Config{Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL, Models: []string{"gpt-4.1"}}}})
	const flood = 2100
	for i := range flood {
		_, err := h.do(t, context.Background(), http.MethodPost, "chat/completions", chatBody("made-up-"+strconv.Itoa(i), false))
		require.ErrorIs(t, err, relay.ErrNoUpstream)
	}
	h.chat(t, chatBody("gpt-4.1", false))
	m := h.metrics(t)
	got := by(m["gen_ai.client.operation.duration"], reqModel)
	assert.Zero(t, got["(overflow)"], "calls in the SDK's overflow set")
	assert.EqualValues(t, 1, got["gpt-4.1"], "the gpt-4.1 call in its own series")
	assert.EqualValues(t, flood, got["_OTHER"])
	assert.Equal(t, 2, len(m["gen_ai.client.operation.duration"].Points), "series")
	assert.Equal(t, map[string]float64{"gpt-4.1": 2}, by(m["gen_ai.client.token.usage"], reqModel)) // input and output
}

// The same gateway with nothing configured, before an upstream that
// answers any model: every made-up name was a series of its own. The
// Observer learns the first 32 names (the default WithModelLimit) and
// records the rest as "_OTHER"; spans keep every name as asked, and the
// span of an "_OTHER" call is named by its operation alone.
func TestModelFloodAnswered(t *testing.T) {
	a := server(t, "a")
	h := newHarness(t, relay.Config{Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}}})
	const flood, limit = 40, 32
	for i := range flood {
		h.chat(t, chatBody("made-up-"+strconv.Itoa(i), false))
	}
	m := h.metrics(t)
	got := by(m["gen_ai.client.operation.duration"], reqModel)
	assert.Equal(t, limit+1, len(got), "gen_ai.request.model values")
	assert.EqualValues(t, 1, got["made-up-0"])
	assert.EqualValues(t, 1, got["made-up-"+strconv.Itoa(limit-1)])
	assert.EqualValues(t, flood-limit, got["_OTHER"])
	assert.Equal(t, limit+1, len(by(m["gen_ai.client.token.usage"], reqModel)))

	spans := map[string]int{}
	for _, s := range h.rec.Ended() {
		if s.Name() != "relay.attempt" {
			spans[s.Name()]++
			assert.True(t, strings.HasPrefix(attrs(s)[reqModel].AsString(), "made-up-"), "as asked")
		}
	}
	assert.Equal(t, flood-limit, spans["chat"])
	assert.Equal(t, 1, spans["chat made-up-0"])
	assert.Len(t, spans, limit+1)
}

// TestModels: with WithModelLimit(0), the metrics record the models named
// (WithModels, the upstreams' Models) and no other, as relayprom does.
func TestModels(t *testing.T) {
	a := server(t, "a")
	h := newHarness(t, relay.Config{
		Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL, Models: []string{"gpt-4.1", "gpt-4.1-mini", "text-embedding-3-small"}}},
		// An alias the callers use.
		Policy: relay.PolicyFunc(func(r relay.Request) relay.Route {
			if r.Model == "fast" || r.Model == "quick" {
				return relay.Route{Model: "gpt-4.1-mini"}
			}
			return relay.Route{}
		}),
	}, relayotel.WithModels("fast"), relayotel.WithModelLimit(0))
	for _, model := range []string{"gpt-4.1", "fast", "quick"} {
		h.chat(t, chatBody(model, false))
	}
	assert.Equal(t, map[string]float64{
		"gpt-4.1 gpt-4.1":     1,
		"fast gpt-4.1-mini":   1,
		"_OTHER gpt-4.1-mini": 1,
	}, by(h.metrics(t)["gen_ai.client.operation.duration"], reqModel, respModel))
	span := h.spans(t)["chat"]
	require.NotNil(t, span, "the call of quick, named by its operation alone")
	assert.Equal(t, "quick", attrs(span)[reqModel].AsString())
	assert.Equal(t, "gpt-4.1-mini", attrs(span)[respModel].AsString())
}

// TestModelLearning: a model is learned once an upstream was called with
// it and did not refuse it as a client error; WithModelLimit bounds how
// many are.
func TestModelLearning(t *testing.T) {
	a := server(t, "a")
	a.Script(relaytest.Fault{Status: 404}, relaytest.Fault{Status: 503})
	h := newHarness(t, relay.Config{
		Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}},
		Retry:     relay.RetryConfig{MaxAttempts: 1},
	}, relayotel.WithModelLimit(2))
	for _, c := range []struct {
		model  string
		status int
	}{
		{"gpt-4.1-typo", 404}, // the upstream does not know it: not learned
		{"gpt-4.1", 503},      // the upstream failed, not the model: learned
		{"gpt-4.1-typo", 200}, // answered: learned
		{"gpt-4.1-mini", 200}, // past the limit
		{"gpt-4.1", 200},
	} {
		require.Equal(t, c.status, h.chat(t, chatBody(c.model, false)).StatusCode, c.model)
	}
	assert.Equal(t, map[string]float64{
		"_OTHER 404":     1,
		"gpt-4.1 503":    1,
		"gpt-4.1-typo -": 1,
		"_OTHER -":       1,
		"gpt-4.1 -":      1,
	}, by(h.metrics(t)["gen_ai.client.operation.duration"], reqModel, "error.type"))
}
