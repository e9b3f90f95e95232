package relaytest

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
)

const (
	chatStream      = `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"Hello"}]}`
	chatStreamUsage = `{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Hello"}]}`
)

// chatContent joins the content deltas of chat chunks.
func chatContent(evs []event) string {
	var b strings.Builder
	for _, ev := range evs {
		b.WriteString(gjson.Get(ev.Data, "choices.0.delta.content").Str)
	}
	return b.String()
}

func TestChatStream(t *testing.T) {
	s := newServer(t, WithCompletionTokens(5))
	resp, _ := openStream(t, s, "/chat/completions", chatStream)
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	evs, err := newSSEReader(resp.Body).readAll()
	require.NoError(t, err)

	// role, 5 content chunks, finish, [DONE]
	require.Len(t, evs, 8)
	assert.Equal(t, "assistant", gjson.Get(evs[0].Data, "choices.0.delta.role").Str)
	assert.Equal(t, "Hello from relaytest. Hello", chatContent(evs))
	for i, ev := range evs[:7] {
		j := gjson.Parse(ev.Data)
		assert.Equal(t, "chat.completion.chunk", j.Get("object").Str)
		assert.Equal(t, "gpt-4o", j.Get("model").Str)
		assert.False(t, j.Get("usage").Exists(), "chunk %d has usage without include_usage", i)
		assert.Equal(t, "", ev.Name)
	}
	assert.Equal(t, "stop", gjson.Get(evs[6].Data, "choices.0.finish_reason").Str)
	assert.Equal(t, "[DONE]", evs[7].Data)
}

func TestChatStreamIncludeUsage(t *testing.T) {
	s := newServer(t)
	s.Script(Fault{CachedTokens: 3, ReasoningTokens: 2}, Fault{NoUsage: true})
	resp, _ := openStream(t, s, "/chat/completions", chatStreamUsage)
	evs, err := newSSEReader(resp.Body).readAll()
	require.NoError(t, err)

	require.Len(t, evs, 1+6+1+1+1) // role, 8-2 content, finish, usage, [DONE]
	usageChunks := 0
	for i, ev := range evs[:len(evs)-1] {
		u := gjson.Get(ev.Data, "usage")
		require.True(t, u.Exists(), "chunk %d", i)
		if u.Type == gjson.Null {
			continue
		}
		usageChunks++
		assert.Equal(t, len(evs)-2, i, "usage chunk must come right before [DONE]")
		assert.Equal(t, "[]", gjson.Get(ev.Data, "choices").Raw)
		assert.Equal(t, int64(8), u.Get("prompt_tokens").Int())
		assert.Equal(t, int64(8), u.Get("completion_tokens").Int())
		assert.Equal(t, int64(16), u.Get("total_tokens").Int())
		assert.Equal(t, int64(3), u.Get("prompt_tokens_details.cached_tokens").Int())
		assert.Equal(t, int64(2), u.Get("completion_tokens_details.reasoning_tokens").Int())
	}
	assert.Equal(t, 1, usageChunks)
	assert.Equal(t, "[DONE]", evs[len(evs)-1].Data)
	assert.Equal(t, strings.Join(Pieces(DefaultReply, 6), ""), chatContent(evs))

	// NoUsage: no usage chunk even when asked.
	resp, _ = openStream(t, s, "/chat/completions", chatStreamUsage)
	evs, err = newSSEReader(resp.Body).readAll()
	require.NoError(t, err)
	require.Len(t, evs, 1+8+1+1)
	for _, ev := range evs {
		assert.False(t, gjson.Get(ev.Data, "usage").Exists())
	}
}

func TestChatStreamToolCallEventLines(t *testing.T) {
	s := newServer(t)
	s.Script(Fault{ToolCall: true, EventLines: true})
	resp, _ := openStream(t, s, "/chat/completions", chatStreamUsage)
	evs, err := newSSEReader(resp.Body).readAll()
	require.NoError(t, err)
	var args strings.Builder
	for _, ev := range evs[:len(evs)-1] {
		assert.Equal(t, "message", ev.Name)
		args.WriteString(gjson.Get(ev.Data, "choices.0.delta.tool_calls.0.function.arguments").Str)
	}
	assert.Equal(t, "get_weather", gjson.Get(evs[0].Data, "choices.0.delta.tool_calls.0.function.name").Str)
	assert.Equal(t, gjson.Null, gjson.Get(evs[0].Data, "choices.0.delta.content").Type)
	assert.Equal(t, `{"city":"Paris"}`, args.String())
	assert.Equal(t, "tool_calls", gjson.Get(evs[len(evs)-3].Data, "choices.0.finish_reason").Str)
	assert.Equal(t, event{Name: "done", Data: "[DONE]"}, evs[len(evs)-1])
}

func TestResponsesStream(t *testing.T) {
	s := newServer(t, WithReply("Hi there! How can I assist you today?"), WithCompletionTokens(10))
	body := `{"model":"gpt-5","stream":true,"instructions":"You are a helpful assistant.","input":"Hello"}`
	resp, _ := openStream(t, s, "/responses", body)
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	evs, err := newSSEReader(resp.Body).readAll()
	require.NoError(t, err)

	var names []string
	var text strings.Builder
	for i, ev := range evs {
		names = append(names, ev.Name)
		j := gjson.Parse(ev.Data)
		assert.Equal(t, ev.Name, j.Get("type").Str)
		assert.Equal(t, int64(i), j.Get("sequence_number").Int())
		if ev.Name == "response.output_text.delta" {
			text.WriteString(j.Get("delta").Str)
		}
	}
	deltas := make([]string, 10)
	for i := range deltas {
		deltas[i] = "response.output_text.delta"
	}
	want := append(append([]string{"response.created", "response.in_progress",
		"response.output_item.added", "response.content_part.added"}, deltas...),
		"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed")
	assert.Equal(t, want, names)
	assert.Equal(t, "Hi there! How can I assist you today?", text.String())

	created := gjson.Get(evs[0].Data, "response")
	assert.Equal(t, "in_progress", created.Get("status").Str)
	assert.Equal(t, gjson.Null, created.Get("usage").Type)
	assert.Equal(t, "[]", created.Get("output").Raw)

	done := gjson.Get(evs[len(evs)-1].Data, "response")
	assert.Equal(t, "completed", done.Get("status").Str)
	assert.Equal(t, "gpt-5", done.Get("model").Str)
	assert.Equal(t, text.String(), done.Get("output.0.content.0.text").Str)
	assert.Equal(t, text.String(), gjson.Get(evs[len(evs)-4].Data, "text").Str)
	prompt := int64(3 + countTokens("You are a helpful assistant.") + 3 + 1 + 3)
	assert.Equal(t, prompt, done.Get("usage.input_tokens").Int())
	assert.Equal(t, int64(10), done.Get("usage.output_tokens").Int())
	assert.Equal(t, prompt+10, done.Get("usage.total_tokens").Int())
	assert.True(t, done.Get("usage.input_tokens_details.cached_tokens").Exists())
	assert.True(t, done.Get("usage.output_tokens_details.reasoning_tokens").Exists())

	s.Script(Fault{NoUsage: true})
	resp, _ = openStream(t, s, "/responses", body)
	evs, err = newSSEReader(resp.Body).readAll()
	require.NoError(t, err)
	last := evs[len(evs)-1]
	assert.Equal(t, "response.completed", last.Name)
	assert.False(t, gjson.Get(last.Data, "response.usage").Exists())
}

func TestCompletionsStream(t *testing.T) {
	s := newServer(t, WithCompletionTokens(2))
	resp, _ := openStream(t, s, "/completions", `{"model":"m","prompt":"Hello","stream":true,"stream_options":{"include_usage":true}}`)
	evs, err := newSSEReader(resp.Body).readAll()
	require.NoError(t, err)
	require.Len(t, evs, 5)
	assert.Equal(t, "Hello", gjson.Get(evs[0].Data, "choices.0.text").Str)
	assert.Equal(t, " from", gjson.Get(evs[1].Data, "choices.0.text").Str)
	assert.Equal(t, "stop", gjson.Get(evs[2].Data, "choices.0.finish_reason").Str)
	assert.Equal(t, int64(3), gjson.Get(evs[3].Data, "usage.total_tokens").Int())
	assert.Equal(t, "[DONE]", evs[4].Data)
}

// TestChunkDelay shows events are flushed one by one: the first content
// event is readable while the next one waits out a ChunkDelay far longer than
// the test.
func TestChunkDelay(t *testing.T) {
	s := newServer(t)
	s.Script(Fault{ChunkDelay: time.Hour}, Fault{FirstTokenDelay: time.Hour})

	resp, cancel := openStream(t, s, "/chat/completions", chatStream)
	r := newSSEReader(resp.Body)
	role, err := r.next()
	require.NoError(t, err)
	assert.Equal(t, "assistant", gjson.Get(role.Data, "choices.0.delta.role").Str)
	first, err := r.next()
	require.NoError(t, err)
	assert.Equal(t, "Hello", gjson.Get(first.Data, "choices.0.delta.content").Str)
	cancel() // the handler's ChunkDelay ends with the client
	_, err = r.next()
	assert.Error(t, err)

	// FirstTokenDelay: the headers come at once, the first event does not.
	resp, cancel = openStream(t, s, "/responses", `{"model":"m","input":"x","stream":true}`)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	got := make(chan error, 1)
	go func() {
		_, err := newSSEReader(resp.Body).next()
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("an event arrived before FirstTokenDelay: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	cancel()
	assert.Error(t, <-got)
}

func TestStallAfter(t *testing.T) {
	s := newServer(t)
	s.Script(Fault{StallAfter: 2})
	resp, cancel := openStream(t, s, "/chat/completions", chatStream)
	r := newSSEReader(resp.Body)
	for range 2 {
		_, err := r.next()
		require.NoError(t, err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := r.next()
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("stalled stream sent more: %v", err)
	case <-time.After(30 * time.Millisecond):
	}
	cancel()
	assert.Error(t, <-got)
}

func TestCutAfter(t *testing.T) {
	s := newServer(t)
	s.Script(Fault{CutAfter: 3}, Fault{CutAfter: 5})
	resp, _ := openStream(t, s, "/chat/completions", chatStream)
	evs, err := newSSEReader(resp.Body).readAll()
	require.Error(t, err)
	assert.True(t, errors.Is(err, io.ErrUnexpectedEOF), "err = %v", err)
	require.Len(t, evs, 3)
	assert.Equal(t, "Hello from", chatContent(evs))

	resp, _ = openStream(t, s, "/responses", `{"model":"m","input":"x","stream":true}`)
	evs, err = newSSEReader(resp.Body).readAll()
	require.Error(t, err)
	assert.Len(t, evs, 5)
}

func TestErrorEvent(t *testing.T) {
	s := newServer(t)
	s.Script(Fault{ErrorEvent: true}, Fault{ErrorEvent: true, EventLines: true}, Fault{ErrorEvent: true})
	resp, _ := openStream(t, s, "/chat/completions", chatStream)
	evs, err := newSSEReader(resp.Body).readAll()
	require.NoError(t, err, "the stream ends cleanly, without [DONE]")
	require.Len(t, evs, 3)
	assert.Equal(t, "Hello", chatContent(evs))
	assert.Equal(t, "server_error", gjson.Get(evs[2].Data, "error.type").Str)
	assert.True(t, strings.HasPrefix(evs[2].Data, `{"error":`))

	resp, _ = openStream(t, s, "/chat/completions", chatStream)
	evs, err = newSSEReader(resp.Body).readAll()
	require.NoError(t, err)
	require.Len(t, evs, 3)
	assert.Equal(t, "error", evs[2].Name)

	resp, _ = openStream(t, s, "/responses", `{"model":"m","input":"x","stream":true}`)
	evs, err = newSSEReader(resp.Body).readAll()
	require.NoError(t, err)
	last := evs[len(evs)-1]
	assert.Equal(t, "error", last.Name)
	assert.Equal(t, "error", gjson.Get(last.Data, "type").Str)
	assert.Equal(t, "server_error", gjson.Get(last.Data, "code").Str)
	assert.Equal(t, "response.output_text.delta", evs[len(evs)-2].Name)
}
