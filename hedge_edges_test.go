package relay

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type regressBody struct {
	io.Reader
	closed atomic.Int32
}

func (b *regressBody) Close() error { b.closed.Add(1); return nil }

// A Base that returns a response and an error: the response is never
// handed to the caller, so its body must be closed.
func TestBaseRespAndErrBodyClosed(t *testing.T) {
	body := &regressBody{Reader: strings.NewReader(`{"x":1}`)}
	base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: body}, errors.New("boom")
	})
	r, reps := newTestRouter(t, Config{Base: base, Clock: newAutoClock(), Retry: RetryConfig{MaxAttempts: 1},
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.invalid"}}})
	req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
	resp, err := r.RoundTrip(req)
	require.Error(t, err)
	require.Nil(t, resp)
	assert.EqualValues(t, 1, body.closed.Load(), "the unreturned upstream body is closed")
	require.Len(t, reps.all(), 1)
	t.Logf("report: status=%d err=%v", reps.all()[0].StatusCode, reps.all()[0].Err)
}

// Both hedge attempts answered: the winner (a 400, not retried) has no
// usage; the loser completed with a 200 and usage, so the upstream billed
// it. Its cost must be in the report.
func TestHedgeLoserCostDroppedWhenWinnerHasNoUsage(t *testing.T) {
	h := newRaceHarness(t)
	js := func() http.Header { return http.Header{"Content-Type": {"application/json"}} } // one map a response
	h.race(t, answered(h.r.ups[0], 400, js(), io.NopCloser(strings.NewReader(`{"error":{"message":"unsupported parameter"}}`)), 0),
		answered(h.r.ups[1], 200, js(), io.NopCloser(strings.NewReader(`{"usage":{"prompt_tokens":3,"completion_tokens":1}}`)), 1))
	rep := h.report(t)
	assert.Equal(t, Usage{PromptTokens: 3, CompletionTokens: 1}, rep.HedgeUsage)
	assert.Equal(t, 4.0, rep.ListCostUSD, "the loser's 4 billed tokens are in the cost")
}

// A Base other than http.Transport leaves gzip in place; finalize decodes
// it to read usage, but a hedge loser's body is parsed raw.
func TestHedgeLoserGzipUsageLost(t *testing.T) {
	h := newRaceHarness(t)
	gz := func(s string) io.ReadCloser {
		var b bytes.Buffer
		w := gzip.NewWriter(&b)
		w.Write([]byte(s))
		w.Close()
		return io.NopCloser(&b)
	}
	hd := func() http.Header {
		return http.Header{"Content-Type": {"application/json"}, "Content-Encoding": {"gzip"}}
	}
	h.race(t, answered(h.r.ups[0], 200, hd(), gz(`{"usage":{"prompt_tokens":10,"completion_tokens":2}}`), 0),
		answered(h.r.ups[1], 200, hd(), gz(`{"usage":{"prompt_tokens":3,"completion_tokens":1}}`), 1))
	rep := h.report(t)
	assert.Equal(t, Usage{PromptTokens: 10, CompletionTokens: 2}, rep.Usage, "the winner's gzip body is decoded")
	assert.Equal(t, Usage{PromptTokens: 3, CompletionTokens: 1}, rep.HedgeUsage, "the loser's gzip body too")
	assert.Equal(t, 16.0, rep.ListCostUSD)
}

// A 2xx stream read ahead for its first token, which the retry policy
// retries (x-should-retry: true): previous.add turns it into a "lost"
// attempt with neither response nor error. When the next attempt cannot
// be admitted, giveUp finalizes that attempt.
func TestRetriedStreamThenGiveUp(t *testing.T) {
	sse, err := os.ReadFile("testdata/openai-wire/chat_stream_recorded_gpt4o_text_usage.sse")
	require.NoError(t, err)
	calls := 0
	base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		calls++
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}, "X-Should-Retry": {"true"}},
			Body: io.NopCloser(strings.NewReader(string(sse)))}, nil
	})
	r, reps := newTestRouter(t, Config{Base: base, Clock: newFakeClock(),
		Retry:     RetryConfig{MaxAttempts: 3, Backoff: func(int) time.Duration { return 0 }},
		Stream:    StreamConfig{FirstTokenTimeout: time.Second, IdleTimeout: -1},
		Limits:    Limits{MaxWait: time.Millisecond},
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.invalid", RPM: 1}}})
	req, _ := http.NewRequestWithContext(context.Background(), "POST", "http://relay/v1/chat/completions",
		strings.NewReader(`{"model":"gpt-4.1","stream":true,"messages":[{"role":"user","content":"x"}]}`))
	var resp *http.Response
	require.NotPanics(t, func() { resp, err = r.RoundTrip(req) })
	assert.Equal(t, 1, calls)
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		assert.Equal(t, 200, resp.StatusCode, "the upstream response, as the last one obtained")
	} else {
		t.Errorf("a response was obtained, yet RoundTrip returned err %v", err)
	}
	assert.Len(t, reps.all(), 1)
}

// TestTwoHedgeLosersBothBilled: a request can hedge twice (a retry after a
// first-token timeout hedges again), and each losing attempt that
// completed is read on a goroutine of its own: their usages add up in
// HedgeUsage and the cost, without a race between the readers.
func TestTwoHedgeLosersBothBilled(t *testing.T) {
	r, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://127.0.0.1:1"}},
		Prices: map[string]Price{"m": {InputPerMTok: 1e6, OutputPerMTok: 1e6}}})
	require.NoError(t, err)
	tr := newTrip(r, httptest.NewRequest("POST", "/v1/chat/completions", nil))
	var wg sync.WaitGroup
	for _, body := range []string{`{"usage":{"prompt_tokens":3,"completion_tokens":1}}`, `{"usage":{"prompt_tokens":5,"completion_tokens":2}}`} {
		a := attempt{cand: candidate{up: r.ups[0], model: "m"},
			resp: &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(body))}}
		wg.Go(func() { tr.readLoser(&a) })
	}
	wg.Wait()
	assert.Equal(t, Usage{PromptTokens: 8, CompletionTokens: 3}, tr.loserUsage())
}
