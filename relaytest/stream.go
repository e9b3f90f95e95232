package relaytest

import (
	"bytes"
	"encoding/json"
	"net/http"
	"time"

	"github.com/tidwall/gjson"
)

var jsonNull = json.RawMessage("null")

// sse writes one server-sent-event stream, flushing every event and applying
// the stream fields of the call's Fault.
type sse struct {
	a        *answer
	rc       *http.ResponseController
	events   int // data events sent
	contents int // content events sent
	seq      int // Responses sequence_number
	first    time.Time
}

// startStream writes and flushes the headers of a stream, then waits the
// fault's FirstTokenDelay.
func (a *answer) startStream() *sse {
	ct := a.contentType("text/event-stream")
	h := a.w.Header()
	h.Set("Content-Type", ct)
	h.Set("Cache-Control", "no-cache")
	a.w.WriteHeader(http.StatusOK)
	e := &sse{a: a, rc: http.NewResponseController(a.w)}
	if err := e.rc.Flush(); err != nil {
		panic(http.ErrAbortHandler)
	}
	a.s.sleep(a.r.Context(), a.f.FirstTokenDelay)
	return e
}

// send writes one event (an event line when name is not empty, then the data
// line and a blank line) and flushes it. It then applies CutAfter and
// StallAfter, which end the call by aborting the handler.
func (e *sse) send(name string, data []byte) {
	var b bytes.Buffer
	if name != "" {
		b.WriteString("event: " + name + "\n")
	}
	b.WriteString("data: ")
	b.Write(data)
	b.WriteString("\n\n")
	if _, err := e.a.w.Write(b.Bytes()); err != nil {
		panic(http.ErrAbortHandler)
	}
	if err := e.rc.Flush(); err != nil {
		panic(http.ErrAbortHandler)
	}
	e.events++
	f := e.a.f
	if f.CutAfter > 0 && e.events >= f.CutAfter {
		panic(http.ErrAbortHandler)
	}
	if f.StallAfter > 0 && e.events >= f.StallAfter {
		e.a.s.waitEnd(e.a.r.Context())
	}
}

// content sends a content event, after ChunkDelay unless it is the first.
func (e *sse) content(name string, data []byte) {
	if e.contents > 0 {
		e.a.s.sleep(e.a.r.Context(), e.a.f.ChunkDelay)
		if p := e.a.f.ChunkInterval; p > 0 {
			// Paced from the first event, so timer slack does not add up.
			e.a.s.sleep(e.a.r.Context(), time.Until(e.first.Add(time.Duration(e.contents)*p)))
		}
	} else {
		e.first = time.Now()
	}
	e.contents++
	e.send(name, data)
}

// eventName returns name when the fault asks for event lines on a chat or
// completions stream.
func (a *answer) eventName(name string) string {
	if a.f.EventLines {
		return name
	}
	return ""
}

func (a *answer) streamError(e *sse) {
	e.send(a.eventName("error"), errorJSON(streamErrorMessage, "server_error", "", ""))
}

// earlyError sends the error event of a Fault.EarlyError, on a chat or
// completions stream, and reports whether it did: the stream then ends.
func (a *answer) earlyError(e *sse) bool {
	if a.f.EarlyError == 0 {
		return false
	}
	e.send(a.eventName("error"), errorBody(a.f.EarlyError, gjson.GetBytes(a.body, "model").Str, a.r))
	return true
}

// malformed sends the event of a Fault.Malformed: JSON cut short.
func (a *answer) malformed(e *sse, name string) {
	if a.f.Malformed {
		e.send(name, []byte(`{"id":"relaytest-malformed","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"cont`))
	}
}

// contentEvents sends n content events, event(i) for each; with
// Fault.ErrorEvent the stream ends in an error event after the first (or at
// once when there is none), and contentEvents reports false.
func (a *answer) contentEvents(e *sse, n int, event func(i int) []byte) bool {
	for i := range n {
		if i == 0 {
			a.malformed(e, a.eventName("message"))
		}
		e.content(a.eventName("message"), event(i))
		if i == 0 && a.f.ErrorEvent {
			a.streamError(e)
			return false
		}
	}
	if n == 0 && a.f.ErrorEvent {
		a.streamError(e)
		return false
	}
	return true
}

// chatStream answers a chat completion with "stream": true.
func (a *answer) chatStream(req gjson.Result, id, model string, now int64, u usage, pieces []string) {
	includeUsage := req.Get("stream_options.include_usage").Bool() && !a.f.NoUsage
	chunk := func(choices []chunkChoice) []byte {
		c := chatChunk{ID: id, Object: "chat.completion.chunk", Created: now, Model: model,
			SystemFingerprint: "fp_relaytest", Choices: choices}
		if includeUsage {
			c.Usage = jsonNull
		}
		return mustJSON(c)
	}
	e := a.startStream()

	first := chunkDelta{Role: "assistant", Content: json.RawMessage(`""`), Refusal: jsonNull}
	parts := pieces
	finish := a.finish(u)
	if a.f.ToolCall && !a.f.ContentFilter {
		tc := toolCall{Index: ptr(0), ID: "call_relaytest" + itoa(a.n), Type: "function"}
		tc.Function.Name = toolName
		first.Content, first.ToolCalls = jsonNull, []toolCall{tc}
		parts, finish = toolArgs, "tool_calls"
	}
	e.send(a.eventName("message"), chunk([]chunkChoice{{Delta: first}}))
	if a.earlyError(e) {
		return
	}
	ok := a.contentEvents(e, len(parts), func(i int) []byte {
		var d chunkDelta
		if a.f.ToolCall {
			tc := toolCall{Index: ptr(0)}
			tc.Function.Arguments = parts[i]
			d.ToolCalls = []toolCall{tc}
		} else {
			d.Content = mustJSON(parts[i])
		}
		return chunk([]chunkChoice{{Delta: d}})
	})
	if !ok {
		return
	}
	e.send(a.eventName("message"), chunk([]chunkChoice{{Delta: chunkDelta{}, FinishReason: &finish}}))
	if includeUsage {
		e.send(a.eventName("message"), mustJSON(chatChunk{ID: id, Object: "chat.completion.chunk", Created: now,
			Model: model, SystemFingerprint: "fp_relaytest", Choices: []chunkChoice{}, Usage: mustJSON(u.chat())}))
	}
	e.send(a.eventName("done"), []byte("[DONE]"))
}

// textStream answers a legacy completion with "stream": true.
func (a *answer) textStream(req gjson.Result, id, model string, now int64, u usage, pieces []string) {
	includeUsage := req.Get("stream_options.include_usage").Bool() && !a.f.NoUsage
	chunk := func(choices []textChoice, usage json.RawMessage) []byte {
		c := textCompletion{ID: id, Object: "text_completion", Created: now, Model: model,
			SystemFingerprint: "fp_relaytest", Choices: choices, Usage: usage}
		if includeUsage && usage == nil {
			c.Usage = jsonNull
		}
		return mustJSON(c)
	}
	e := a.startStream()
	if a.earlyError(e) || !a.contentEvents(e, len(pieces), func(i int) []byte { return chunk([]textChoice{{Text: pieces[i]}}, nil) }) {
		return
	}
	finish := a.finish(u)
	e.send(a.eventName("message"), chunk([]textChoice{{FinishReason: &finish}}, nil))
	if includeUsage {
		e.send(a.eventName("message"), chunk([]textChoice{}, mustJSON(struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
			TotalTokens      int `json:"total_tokens"`
		}{u.prompt, u.completion, u.prompt + u.completion})))
	}
	e.send(a.eventName("done"), []byte("[DONE]"))
}

// field is one member of an ordered JSON object.
type field struct {
	k string
	v any
}

// object marshals fields as a JSON object, in order.
func object(fields ...field) []byte {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, f := range fields {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(mustJSON(f.k))
		b.WriteByte(':')
		b.Write(mustJSON(f.v))
	}
	b.WriteByte('}')
	return b.Bytes()
}

// event sends one Responses event: an event line named typ and a data line
// whose "type" is typ, followed by "sequence_number" and fields.
func (e *sse) event(typ string, content bool, fields ...field) {
	data := object(append([]field{{"type", typ}, {"sequence_number", e.seq}}, fields...)...)
	e.seq++
	if content {
		e.content(typ, data)
	} else {
		e.send(typ, data)
	}
}

// responsesStream answers a Responses API call with "stream": true, with the
// events of the real API: response.created, response.in_progress,
// response.output_item.added, response.content_part.added,
// response.output_text.delta (one per piece), response.output_text.done,
// response.content_part.done, response.output_item.done,
// response.completed. There is no [DONE].
func (a *answer) responsesStream(done *response, pieces []string) {
	e := a.startStream()
	start := *done
	start.Status, start.CompletedAt, start.Output, start.Usage = "in_progress", nil, []outputItem{}, jsonNull
	e.event("response.created", false, field{"response", start})
	if a.f.EarlyError != 0 {
		a.responsesEarlyError(e, start)
		return
	}
	e.event("response.in_progress", false, field{"response", start})
	if len(done.Output) == 0 { // Fault.ContentFilter, Fault.Empty
		end := "response.completed"
		if done.Status == "incomplete" {
			end = "response.incomplete"
		}
		e.event(end, false, field{"response", done})
		return
	}

	item := done.Output[0]
	itemID, text := item.ID, item.Content[0].Text
	added := item
	added.Status, added.Content = "in_progress", []outputText{}
	e.event("response.output_item.added", false, field{"output_index", 0}, field{"item", added})
	loc := []field{{"item_id", itemID}, {"output_index", 0}, {"content_index", 0}}
	with := func(f ...field) []field { return append(append([]field{}, loc...), f...) }
	e.event("response.content_part.added", false,
		with(field{"part", outputText{Type: "output_text", Text: "", Annotations: []any{}}})...)
	for i, p := range pieces {
		if i == 0 {
			a.malformed(e, "response.output_text.delta")
		}
		e.event("response.output_text.delta", true, with(field{"delta", p})...)
		if i == 0 && a.f.ErrorEvent {
			a.responsesError(e)
			return
		}
	}
	if len(pieces) == 0 && a.f.ErrorEvent {
		a.responsesError(e)
		return
	}
	e.event("response.output_text.done", false, with(field{"text", text})...)
	e.event("response.content_part.done", false, with(field{"part", item.Content[0]})...)
	e.event("response.output_item.done", false, field{"output_index", 0}, field{"item", item})
	e.event("response.completed", false, field{"response", done})
}

// responsesEarlyError sends the error of a Fault.EarlyError on a Responses
// stream: an error event, or response.failed with FailedEvent.
func (a *answer) responsesEarlyError(e *sse, r response) {
	err := gjson.GetBytes(errorBody(a.f.EarlyError, r.Model, a.r), "error")
	code := err.Get("code").Str
	if code == "" {
		code = err.Get("type").Str
	}
	if !a.f.FailedEvent {
		e.event("error", false, field{"code", code}, field{"message", err.Get("message").Str}, field{"param", nil})
		return
	}
	r.Status = "failed"
	r.Error = map[string]string{"code": code, "message": err.Get("message").Str}
	e.event("response.failed", false, field{"response", r})
}

func (a *answer) responsesError(e *sse) {
	e.event("error", false, field{"code", "server_error"}, field{"message", streamErrorMessage}, field{"param", nil})
}
