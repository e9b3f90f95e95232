package relay

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay/internal/tokens"
)

func TestReportBodyCloseDuringRead(t *testing.T) {
	gate := make(chan struct{})
	srv := newHandlerServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"choices":[`))
		w.(http.Flusher).Flush()
		select {
		case <-gate:
		case <-r.Context().Done():
		}
	}))
	defer close(gate)
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: srv}}})
	req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
	resp, err := r.RoundTrip(req)
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		io.Copy(io.Discard, resp.Body) // blocks until Close
	}()
	resp.Body.Close() // before, during or after the reader's Read: one report either way
	wg.Wait()
	assert.Len(t, reps.all(), 1)
}

func TestReportCarriesRequestContext(t *testing.T) {
	srvs := newServers(t, 1)
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: srvs[0].URL}}})
	type key struct{}
	for _, body := range []string{chatBody("gpt-4.1", "x"), strings.Repeat("x", 10)} {
		ctx := context.WithValue(context.Background(), key{}, body)
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://relay/v1/chat/completions", strings.NewReader(body))
		resp, err := r.RoundTrip(req)
		require.NoError(t, err)
		resp.Body.Close()
	}
	ctx := context.WithValue(context.Background(), key{}, "too large")
	r.s.maxBody = 4
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://relay/v1/chat/completions", strings.NewReader("12345"))
	_, err := r.RoundTrip(req)
	require.ErrorIs(t, err, ErrBodyTooLarge)
	list := reps.all()
	require.Len(t, list, 3)
	assert.Equal(t, chatBody("gpt-4.1", "x"), list[0].Context.Value(key{}))
	assert.Equal(t, "too large", list[2].Context.Value(key{}))
}

func TestReportUsageAndCost(t *testing.T) {
	up := newRecorder(t, 200, fixture(t, "chat_response_cached_reasoning_SYNTHESIZED.json"))
	r, reps := newTestRouter(t, Config{
		Upstreams: []Upstream{{Name: "relay", BaseURL: up.URL, PriceFactor: 0.5}},
		Prices:    map[string]Price{"o3-mini": {InputPerMTok: 1.10, CachedInputPerMTok: 0.55, OutputPerMTok: 4.40}},
	})
	_, b := do(t, r, "POST", "http://x/v1/chat/completions", chatBody("o3-mini", "hi"))
	assert.Equal(t, fixture(t, "chat_response_cached_reasoning_SYNTHESIZED.json"), b, "body byte for byte")
	rep := reps.all()[0]
	assert.Equal(t, Usage{PromptTokens: 2006, CompletionTokens: 300, ReasoningTokens: 192, CachedTokens: 1920, ServiceTier: "default"}, rep.Usage)
	assert.True(t, rep.Priced)
	list := (86*1.10 + 1920*0.55 + 300*4.40) / 1e6
	assert.InDelta(t, list, rep.ListCostUSD, 1e-12)
	assert.InDelta(t, list*0.5, rep.CostUSD, 1e-12)
}

func TestReportUnpricedModel(t *testing.T) {
	up := newRecorder(t, 200, fixture(t, "chat_response_default.json"))
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}}, Prices: map[string]Price{}})
	do(t, r, "POST", "http://x/v1/chat/completions", chatBody("mystery-model", "hi"))
	rep := reps.all()[0]
	assert.False(t, rep.Priced)
	assert.Zero(t, rep.CostUSD)
	assert.Positive(t, rep.Usage.PromptTokens, "usage is still reported")
}

func TestReportWhenBodyNeverRead(t *testing.T) {
	up := newRecorder(t, 200, fixture(t, "chat_response_default.json"))
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}}})
	req, _ := http.NewRequest("POST", "http://x/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "hi")))
	resp, err := r.RoundTrip(req)
	require.NoError(t, err)
	assert.Empty(t, reps.all())
	resp.Body.Close()
	require.Len(t, reps.all(), 1)
	assert.Equal(t, 200, reps.all()[0].StatusCode)
	assert.Equal(t, int64(0), r.byName["a"].inflight.Load(), "in-flight released")
}

func TestReportEstimatesUsageWhenAbsent(t *testing.T) {
	up := newRecorder(t, 200, []byte(`{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there, general Kenobi."}}]}`))
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}}})
	do(t, r, "POST", "http://x/v1/chat/completions", chatBody("gpt-4.1", "hi"))
	rep := reps.all()[0]
	assert.True(t, rep.Usage.Estimated)
	assert.Equal(t, rep.PromptTokens, rep.Usage.PromptTokens)
	assert.Equal(t, tokens.O200K.Count("Hello there, general Kenobi."), rep.Usage.CompletionTokens)
}

func TestUsageFromTailOfLargeBody(t *testing.T) {
	var big bytes.Buffer
	big.WriteString(`{"object":"list","data":[`)
	for i := 0; big.Len() < usageTeeMax+1000; i++ {
		if i > 0 {
			big.WriteByte(',')
		}
		big.WriteString(`{"object":"embedding","index":0,"embedding":[0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8]}`)
	}
	big.WriteString(`],"model":"text-embedding-3-small","usage":{"prompt_tokens":7,"total_tokens":7}}`)
	up := newRecorder(t, 200, big.Bytes())
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}}})
	_, b := do(t, r, "POST", "http://x/v1/embeddings", `{"model":"text-embedding-3-small","input":"hello"}`)
	assert.Equal(t, big.Len(), len(b))
	assert.Equal(t, 7, reps.all()[0].Usage.PromptTokens)
}

// TestUsageFromTailBeforeAMemberNamedUsage: in the tail of an answer over
// 4 MiB the usage object is found when a later member is also named
// "usage" (metadata, here) but is not one. (The last "usage" key was taken
// whatever its value: the report estimated the usage.)
func TestUsageFromTailBeforeAMemberNamedUsage(t *testing.T) {
	body := `{"id":"resp_1","object":"response","status":"completed","model":"gpt-4o","output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"` +
		strings.Repeat("All work and no play. ", usageTeeMax/20) + `"}]}],` +
		`"usage":{"input_tokens":12,"output_tokens":99000,"total_tokens":99012},"metadata":{"usage":"a string, not a usage"}}`
	up := newRecorder(t, 200, []byte(body))
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}}})
	_, b := do(t, r, "POST", "http://x/v1/responses", `{"model":"gpt-4o","input":"Hi"}`)
	assert.Equal(t, len(body), len(b))
	assert.Equal(t, Usage{PromptTokens: 12, CompletionTokens: 99000}, reps.all()[0].Usage)
}

// TestReportPricedWhateverTheStatus: Priced says the model has a price, on
// error responses too (their cost is 0: nothing was billed).
func TestReportPricedWhateverTheStatus(t *testing.T) {
	for _, status := range []int{400, 429, 500} {
		up := newRecorder(t, status, []byte(`{"error":{"message":"no"}}`))
		r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}}, Retry: RetryConfig{MaxAttempts: 1}})
		req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
		resp, err := r.RoundTrip(req)
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		rep := reps.all()[0]
		assert.Equal(t, status, rep.StatusCode)
		assert.True(t, rep.Priced, "gpt-4.1 has a price (status %d)", status)
		assert.Zero(t, rep.CostUSD)
	}
}
