package relayotel_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relaytest"
)

// A stream request answered with an error status (no chunk ever came)
// must not record time_to_first_chunk.
func TestRegressTTFCOnErrorStatus(t *testing.T) {
	a := server(t, "a")
	a.Script(relaytest.Fault{Status: 429})
	h := newHarness(t, relay.Config{
		Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}},
		Retry:     relay.RetryConfig{MaxAttempts: 1},
	})
	resp := h.chat(t, chatBody("gpt-4.1", true))
	require.Equal(t, 429, resp.StatusCode)
	rep := h.report(t)
	t.Logf("report: Stream=%v TTFT=%v Err=%v", rep.Stream, rep.TTFT, rep.Err)
	m := h.metrics(t)
	assert.NotContains(t, m, "gen_ai.client.operation.time_to_first_chunk", "no chunk came: a 429 JSON error")
	got := kvs(attrs(h.spans(t)["chat gpt-4.1"]))
	assert.NotContains(t, got, "gen_ai.response.time_to_first_chunk")
}

// First-token failover: the abandoned attempt's outcome and the retry's
// reason should name the first-token timeout, not "_OTHER".
func TestRegressFirstTokenOutcome(t *testing.T) {
	a, b := server(t, "a"), server(t, "b")
	a.Script(relaytest.Fault{FirstTokenDelay: 2 * time.Second})
	h := newHarness(t, relay.Config{
		Strategy:  relay.StrategyPriority,
		Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}, {Name: "b", BaseURL: b.URL}},
		Stream:    relay.StreamConfig{FirstTokenTimeout: 100 * time.Millisecond},
	})
	h.chat(t, chatBody("gpt-4.1", true))
	rep := h.report(t)
	require.NoError(t, rep.Err)
	require.Equal(t, "b", rep.Upstream)
	atts := h.attempts()
	require.Len(t, atts, 2)
	t.Logf("attempt 1: %v", kvs(attrs(atts[0])))
	m := h.metrics(t)
	t.Logf("attempts: %+v", m["relay.client.attempts"].Points)
	t.Logf("retries: %+v", m["relay.client.retries"].Points)
	assert.NotEqual(t, "_OTHER", attrs(atts[0])["error.type"].AsString())
	for _, p := range m["relay.client.retries"].Points {
		assert.NotContains(t, p.Attrs, "_OTHER")
	}
}

// A budget refusal's error.type.
func TestRegressBudgetErrorType(t *testing.T) {
	a := server(t, "a")
	h := newHarness(t, relay.Config{Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}},
		Budgets: []relay.Budget{{Name: "tight", Limit: 1e-9, Window: relay.Window{Every: time.Hour}}}})
	_, err := h.do(t, context.Background(), http.MethodPost, "chat/completions", chatBody("gpt-4.1", false))
	require.ErrorIs(t, err, relay.ErrBudgetExceeded)
	got := kvs(attrs(h.spans(t)["chat gpt-4.1"]))
	t.Logf("span: %v", got)
	m := h.metrics(t)
	t.Logf("duration: %+v", m["gen_ai.client.operation.duration"].Points)
	assert.NotEqual(t, "_OTHER", got["error.type"])
}

// Closing the response body before reading it ends the span once.
func TestCloseBeforeReadEndsSpanOnce(t *testing.T) {
	a := server(t, "a")
	h := newHarness(t, relay.Config{Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}}})
	for _, stream := range []bool{false, true} {
		h.rec.Reset()
		req, _ := http.NewRequest(http.MethodPost, "http://relay.test/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", stream)))
		resp, err := h.router.RoundTrip(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		resp.Body.Close()
		io.ReadAll(resp.Body)
		n := 0
		for _, s := range h.rec.Ended() {
			if s.Name() == "chat gpt-4.1" {
				n++
			}
		}
		assert.Equal(t, 1, n)
		assert.Empty(t, openSpans(h))
	}
}

func openSpans(h *harness) []string {
	ended := map[string]bool{}
	for _, s := range h.rec.Ended() {
		ended[s.SpanContext().SpanID().String()] = true
	}
	var open []string
	for _, s := range h.rec.Started() {
		if !ended[s.SpanContext().SpanID().String()] {
			open = append(open, s.Name())
		}
	}
	return open
}

type closedBody struct{}

func (closedBody) Read([]byte) (int, error) {
	return 0, errors.New("http: invalid Read on closed Body")
}
func (closedBody) Close() error { return nil }

func TestClosedRequestBodyEndsSpan(t *testing.T) {
	a := server(t, "a")
	h := newHarness(t, relay.Config{Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}}})
	req, _ := http.NewRequest(http.MethodPost, "http://relay.test/v1/chat/completions", io.NopCloser(nil))
	req.Body = closedBody{}
	req.ContentLength = 100
	_, err := h.router.RoundTrip(req)
	require.Error(t, err)
	assert.Empty(t, openSpans(h))
	spans := h.spans(t)
	for n, s := range spans {
		t.Logf("%s %v %v", n, kvs(attrs(s)), s.Status())
	}
	assert.Len(t, spans, 1)
	m := h.metrics(t)
	t.Logf("%v", names(m))
}

// A chat call refused for its body size fails before it is classified:
// gen_ai.client.operation.duration has a point for it, with the operation
// its URL path names and error.type body_too_large. (It had none.)
func TestRegressBodyTooLargeDuration(t *testing.T) {
	a := server(t, "a")
	h := newHarness(t, relay.Config{Upstreams: []relay.Upstream{{Name: "a", BaseURL: a.URL}}, MaxBodyBytes: 10})
	_, err := h.do(t, t.Context(), http.MethodPost, "chat/completions", chatBody("gpt-4.1", false))
	require.ErrorIs(t, err, relay.ErrBodyTooLarge)
	span := h.spans(t)["chat"]
	require.NotNil(t, span)
	assert.Equal(t, "body_too_large", attrs(span)["error.type"].AsString())
	m := h.metrics(t)
	assert.Contains(t, m, "gen_ai.client.operation.duration", "the failed chat call is not in the duration metric")
}
