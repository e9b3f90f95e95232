package relaytest

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
)

// TestSchedule: a Schedule sees every call once it is recorded, with the
// fault it took from the queue, and the Server answers with the fault it
// returns; its done func runs once the answer is written.
func TestSchedule(t *testing.T) {
	var mu sync.Mutex
	var seen []Fault
	var calls []Recorded
	done := make(chan string, 4)
	s := newServer(t, WithSchedule(func(r *http.Request, call Recorded, f Fault) (Fault, func()) {
		mu.Lock()
		seen, calls = append(seen, f), append(calls, call)
		mu.Unlock()
		if !f.IsZero() {
			return f, nil // scripted: answered as scripted
		}
		return Fault{CompletionTokens: 3, CachedTokens: 2}, func() { done <- call.Endpoint }
	}))
	s.Script(Fault{Status: http.StatusTeapot})

	resp, _ := post(t, s, "/chat/completions", chatHello)
	assert.Equal(t, http.StatusTeapot, resp.StatusCode, "the scripted fault reached the schedule")

	resp, b := post(t, s, "/chat/completions", chatHello)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	j := gjson.ParseBytes(b)
	assert.Equal(t, int64(3), j.Get("usage.completion_tokens").Int(), "CompletionTokens replaces the server's 8")
	assert.Equal(t, int64(2), j.Get("usage.prompt_tokens_details.cached_tokens").Int())
	assert.Equal(t, "stop", j.Get("choices.0.finish_reason").Str)
	assert.Equal(t, "chat/completions", <-done)

	// The request's max tokens still bound CompletionTokens.
	resp, b = post(t, s, "/chat/completions", `{"model":"gpt-4o","max_tokens":2,"messages":[{"role":"user","content":"Hello"}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, int64(2), gjson.GetBytes(b, "usage.completion_tokens").Int())
	assert.Equal(t, "length", gjson.GetBytes(b, "choices.0.finish_reason").Str)
	<-done

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, calls, 3)
	assert.False(t, seen[0].IsZero())
	assert.True(t, seen[1].IsZero(), "an empty queue gives the zero Fault")
	assert.Equal(t, "chat/completions", calls[1].Endpoint)
	assert.JSONEq(t, chatHello, string(calls[1].Body))
	assert.Equal(t, int64(8), int64(PromptTokens("chat/completions", calls[1].Body)), "PromptTokens counts as the answer's usage does")
	assert.Equal(t, gjson.GetBytes(b, "usage.prompt_tokens").Int(), int64(PromptTokens("chat/completions", calls[2].Body)))
}

// TestIsZero: every field of a Fault makes it non-zero.
func TestIsZero(t *testing.T) {
	assert.True(t, Fault{}.IsZero())
	assert.True(t, Fault{Header: http.Header{}}.IsZero(), "an empty header map adds nothing")
	for i, f := range []Fault{
		{Status: 500}, {Header: http.Header{"A": {"b"}}}, {Body: "x"}, {ContentType: "x"}, {Delay: 1}, {Drop: true},
		{Hang: true}, {CachedTokens: 1}, {ReasoningTokens: 1}, {NoUsage: true}, {ChunkDelay: 1}, {FirstTokenDelay: 1},
		{StallAfter: 1}, {CutAfter: 1}, {ErrorEvent: true}, {EventLines: true}, {ToolCall: true}, {ChunkInterval: 1},
		{CompletionTokens: 1},
	} {
		assert.False(t, f.IsZero(), "fault %d: %+v", i, f)
	}
}

// TestChunkInterval: a stream's content events come at least
// ChunkInterval apart, counted from the first, so the last of 5 comes at
// least 4 intervals after the call was sent (a timer never fires early, so
// the bound holds on any machine).
func TestChunkInterval(t *testing.T) {
	const every = 15 * time.Millisecond
	s := newServer(t, WithCompletionTokens(5))
	s.Script(Fault{ChunkInterval: every})
	start := time.Now()
	resp, _ := openStream(t, s, "/chat/completions", chatStream)
	evs, err := newSSEReader(resp.Body).readAll()
	require.NoError(t, err)
	took := time.Since(start)
	assert.Equal(t, "Hello from relaytest. Hello", chatContent(evs), "5 content events")
	assert.GreaterOrEqual(t, took, 4*every)
}

// PromptTokens of a body that is not JSON is 0.
func TestPromptTokensNotJSON(t *testing.T) {
	assert.Zero(t, PromptTokens("chat/completions", []byte("not json")))
	assert.Zero(t, PromptTokens("chat/completions", nil))
}
