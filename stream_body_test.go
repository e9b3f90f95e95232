package relay

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// closeRaceBody is an upstream body whose pending Read fails once Close is
// called, and whose Close returns only after that Read came back to its
// caller: the order in which a net/http body may wake a blocked reader.
type closeRaceBody struct {
	reading  chan struct{} // closed when the first Read blocks
	closed   chan struct{} // closed by Close
	returned chan struct{} // closed by the test once the caller's Read returned
	once     sync.Once
}

func (b *closeRaceBody) Read(p []byte) (int, error) {
	b.once.Do(func() { close(b.reading) })
	<-b.closed
	return 0, errors.New("http: read on closed response body")
}

func (b *closeRaceBody) Close() error {
	select {
	case <-b.closed:
		return nil
	default:
	}
	close(b.closed)
	select {
	case <-b.returned:
	case <-time.After(10 * time.Second): // the reader never came back: the test fails on its own
	}
	return nil
}

// TestReportBodyCloseDuringReadIsNoFailure: a caller that closes a plain
// body while another goroutine reads it (as an HTTP/2 body's Close wakes
// its reader) gets a Report without a read error, as a stream's Close
// does. (The failed Read took the lock first and recorded "read on closed
// response body".)
func TestReportBodyCloseDuringReadIsNoFailure(t *testing.T) {
	body := &closeRaceBody{reading: make(chan struct{}), closed: make(chan struct{}), returned: make(chan struct{})}
	base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		io.Copy(io.Discard, req.Body)
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}}, Body: body, Request: req}, nil
	})
	r, reps := newTestRouter(t, Config{Base: base, Clock: newAutoClock(), Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.invalid/v1"}}})
	req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
	resp, err := r.RoundTrip(req)
	require.NoError(t, err)
	go func() {
		resp.Body.Read(make([]byte, 64))
		close(body.returned)
	}()
	<-body.reading
	require.NoError(t, resp.Body.Close())
	all := reps.all()
	require.Len(t, all, 1)
	assert.NoError(t, all[0].Err, "the caller closed the body: not a failed read")
}

// TestStreamUsageRemovalDropsContentLength: an upstream that sends its
// stream with a Content-Length (a short unflushed answer, a buffering
// proxy): once the injected usage chunk is taken out, the response
// declares no length, so a proxy reading it to the end does not wait for
// bytes that never come. (It kept the upstream's 167 for 95 bytes.)
func TestStreamUsageRemovalDropsContentLength(t *testing.T) {
	sse := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":\"stop\"}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1}}\n\n" +
		"data: [DONE]\n\n"
	up := newHandlerServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Content-Length", strconv.Itoa(len(sse)))
		io.WriteString(w, sse)
	}))
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up + "/v1"}}})

	req, _ := http.NewRequest("POST", "http://relay.invalid/v1/chat/completions", strings.NewReader(chatStreamReq))
	resp, err := r.RoundTrip(req)
	require.NoError(t, err)
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.NotContains(t, string(got), `"usage"`, "the injected chunk is removed")
	assert.Equal(t, 9, reps.all()[0].Usage.PromptTokens)
	if resp.ContentLength >= 0 {
		assert.Equal(t, int64(len(got)), resp.ContentLength, "resp.ContentLength")
	}
	if cl := resp.Header.Get("Content-Length"); cl != "" {
		assert.Equal(t, strconv.Itoa(len(got)), cl, "Content-Length header")
	}

	// Through a reverse proxy, as examples/gateway serves it.
	u, _ := url.Parse("http://relay.invalid")
	proxy := httputil.NewSingleHostReverseProxy(u)
	proxy.Transport = r
	front := httptest.NewServer(proxy)
	defer front.Close()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	presp, err := client.Post(front.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatStreamReq))
	require.NoError(t, err)
	_, err = io.ReadAll(presp.Body)
	presp.Body.Close()
	assert.NoError(t, err, "the proxy's client reads the stream to its end")
}

// TestStreamDataWithExtraSpace: "data:  {...}" (two spaces) carries the
// same JSON, which the SDKs read: its content and usage count. (It was
// seen as no data at all.)
func TestStreamDataWithExtraSpace(t *testing.T) {
	body := "data:  {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":\"stop\"}]}\n\n" +
		"data:  {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":6}}\n\n" +
		"data:  [DONE]\n\n"
	r, reps := bodyRouter(t, Config{}, func() io.Reader { return strings.NewReader(body) })
	got, err := stream(t, r, "chat/completions", chatStreamUsageReq)
	require.NoError(t, err)
	assert.Equal(t, body, string(got))
	rep := reps.all()[0]
	assert.Equal(t, Usage{PromptTokens: 5, CompletionTokens: 6}, rep.Usage)
}

// TestHedgeLoserWithoutUsageIsEstimated: both attempts of a hedge answer
// 200 without a usage object; the loser is billed an estimate of its
// answer, as the winner is, not nothing (16 instead of 32 tokens).
func TestHedgeLoserWithoutUsageIsEstimated(t *testing.T) {
	h := newRaceHarness(t)
	body := chatBody("m", "hello there")
	h.tr = newTrip(h.r, httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(body)))
	_, err := h.tr.decide([]byte(body), false)
	require.NoError(t, err)
	answer := `{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there, general Kenobi."}}]}`
	js := func() http.Header { return http.Header{"Content-Type": {"application/json"}} }
	h.race(t, answered(h.r.ups[0], 200, js(), io.NopCloser(strings.NewReader(answer)), 0),
		answered(h.r.ups[1], 200, js(), io.NopCloser(strings.NewReader(answer)), 1))
	rep := h.report(t)
	require.True(t, rep.Usage.Estimated)
	winner := rep.Usage.PromptTokens + rep.Usage.CompletionTokens
	require.Positive(t, winner)
	assert.Equal(t, winner, rep.HedgeUsage.PromptTokens+rep.HedgeUsage.CompletionTokens, "the loser's identical answer, estimated as the winner's is")
	assert.Equal(t, 2*float64(winner), rep.ListCostUSD, "both answers billed ($1 a token)")
}
