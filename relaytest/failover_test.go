package relaytest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
)

const responsesStream = `{"model":"gpt-4o","input":"x","stream":true}`

// streamEvents posts a stream request and reads its events to the stream's
// clean end.
func streamEvents(t *testing.T, s *Server, endpoint, body string) []event {
	t.Helper()
	resp, _ := openStream(t, s, endpoint, body)
	evs, err := newSSEReader(resp.Body).readAll()
	require.NoError(t, err)
	return evs
}

// TestEarlyError: a stream with EarlyError fails before its first content,
// with the error of the status, and ends without [DONE].
func TestEarlyError(t *testing.T) {
	s := newServer(t)
	s.Script(Fault{EarlyError: 429}, Fault{EarlyError: 500, EventLines: true}, Fault{EarlyError: 503})
	evs := streamEvents(t, s, "/chat/completions", chatStream)
	require.Len(t, evs, 2, "the role chunk, the error")
	assert.Equal(t, "assistant", gjson.Get(evs[0].Data, "choices.0.delta.role").Str)
	assert.Equal(t, "rate_limit_exceeded", gjson.Get(evs[1].Data, "error.code").Str)
	assert.Contains(t, gjson.Get(evs[1].Data, "error.message").Str, "Please try again in 1s.")

	evs = streamEvents(t, s, "/chat/completions", chatStream)
	require.Len(t, evs, 2)
	assert.Equal(t, "error", evs[1].Name)
	assert.Equal(t, "server_error", gjson.Get(evs[1].Data, "error.type").Str)

	evs = streamEvents(t, s, "/completions", `{"model":"m","prompt":"x","stream":true}`)
	require.Len(t, evs, 1, "the error at once")
	assert.Equal(t, "server_error", gjson.Get(evs[0].Data, "error.type").Str)
}

// TestEarlyErrorResponses: a Responses stream with EarlyError sends
// response.created, then an error event, or response.failed.
func TestEarlyErrorResponses(t *testing.T) {
	s := newServer(t)
	s.Script(Fault{EarlyError: 429}, Fault{EarlyError: 500, FailedEvent: true})
	evs := streamEvents(t, s, "/responses", responsesStream)
	require.Len(t, evs, 2)
	assert.Equal(t, "response.created", evs[0].Name)
	assert.Equal(t, "error", evs[1].Name)
	assert.Equal(t, "rate_limit_exceeded", gjson.Get(evs[1].Data, "code").Str)

	evs = streamEvents(t, s, "/responses", responsesStream)
	require.Len(t, evs, 2)
	assert.Equal(t, "response.failed", evs[1].Name)
	assert.Equal(t, "failed", gjson.Get(evs[1].Data, "response.status").Str)
	assert.Equal(t, "server_error", gjson.Get(evs[1].Data, "response.error.code").Str)
}

// TestMalformed: a Malformed stream sends JSON cut short before its first
// content, then goes on.
func TestMalformed(t *testing.T) {
	s := newServer(t)
	s.Script(Fault{Malformed: true}, Fault{Malformed: true})
	evs := streamEvents(t, s, "/chat/completions", chatStream)
	require.Greater(t, len(evs), 3)
	assert.False(t, gjson.Valid(evs[1].Data), "the event before the first content")
	assert.Equal(t, "Hello", gjson.Get(evs[2].Data, "choices.0.delta.content").Str)
	assert.Equal(t, "[DONE]", evs[len(evs)-1].Data)

	evs = streamEvents(t, s, "/responses", responsesStream)
	for i, ev := range evs {
		if ev.Name == "response.output_text.delta" {
			assert.False(t, gjson.Valid(ev.Data), "the first delta event is the malformed one")
			assert.True(t, gjson.Valid(evs[i+1].Data))
			break
		}
	}
	assert.Equal(t, "response.completed", evs[len(evs)-1].Name)
}

// TestContentFilterAndEmpty: answers a content filter stopped, and answers
// with no output, plain and streamed, on every endpoint.
func TestContentFilterAndEmpty(t *testing.T) {
	s := newServer(t)
	s.Script(Fault{ContentFilter: true}, Fault{Empty: true}, Fault{ContentFilter: true}, Fault{Empty: true})
	_, b := post(t, s, "/chat/completions", `{"model":"m","messages":[{"role":"user","content":"x"}]}`)
	assert.Equal(t, "content_filter", gjson.GetBytes(b, "choices.0.finish_reason").Str)
	assert.Equal(t, gjson.Null, gjson.GetBytes(b, "choices.0.message.content").Type)
	assert.Positive(t, gjson.GetBytes(b, "usage.completion_tokens").Int())
	_, b = post(t, s, "/chat/completions", `{"model":"m","messages":[{"role":"user","content":"x"}]}`)
	assert.Equal(t, "stop", gjson.GetBytes(b, "choices.0.finish_reason").Str)
	assert.Equal(t, "", gjson.GetBytes(b, "choices.0.message.content").Str)
	_, b = post(t, s, "/responses", `{"model":"m","input":"x"}`)
	assert.Equal(t, "incomplete", gjson.GetBytes(b, "status").Str)
	assert.Equal(t, "content_filter", gjson.GetBytes(b, "incomplete_details.reason").Str)
	assert.Equal(t, "[]", gjson.GetBytes(b, "output").Raw)
	_, b = post(t, s, "/completions", `{"model":"m","prompt":"x"}`)
	assert.Equal(t, "stop", gjson.GetBytes(b, "choices.0.finish_reason").Str)
	assert.Equal(t, "", gjson.GetBytes(b, "choices.0.text").Str)

	s.Script(Fault{ContentFilter: true}, Fault{ContentFilter: true}, Fault{Empty: true})
	evs := streamEvents(t, s, "/chat/completions", chatStreamUsage)
	require.Len(t, evs, 4, "role, finish, usage, [DONE]")
	assert.Empty(t, chatContent(evs))
	assert.Equal(t, "content_filter", gjson.Get(evs[1].Data, "choices.0.finish_reason").Str)

	evs = streamEvents(t, s, "/responses", responsesStream)
	require.Len(t, evs, 3)
	assert.Equal(t, "response.incomplete", evs[2].Name)
	assert.Equal(t, "content_filter", gjson.Get(evs[2].Data, "response.incomplete_details.reason").Str)

	evs = streamEvents(t, s, "/responses", responsesStream)
	require.Len(t, evs, 3)
	assert.Equal(t, "response.completed", evs[2].Name)
	assert.Equal(t, "[]", gjson.Get(evs[2].Data, "response.output").Raw)
}
