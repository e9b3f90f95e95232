package relay

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A stream is over once its content says so ([DONE], a terminal Responses
// event, or every choice's finish_reason plus the usage chunk): the
// caller's read ends, the report is made and the upstream is let go, even
// when the upstream keeps its connection open.

// heldStream is an upstream that writes body, flushes, and keeps the
// connection open until the client goes or the test ends. gone is closed
// when the client let go of the connection.
type heldStream struct {
	url  string
	gone chan struct{}
	seen atomic.Pointer[[]byte] // the request body it got
}

func newHeldStream(t *testing.T, body []byte) *heldStream {
	h := &heldStream{gone: make(chan struct{}, 16)}
	end := make(chan struct{})
	h.url = newHandlerServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		h.seen.Store(&b)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write(body)
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			h.gone <- struct{}{}
		case <-end:
		}
	}))
	t.Cleanup(func() { close(end) }) // (before the server's Close, which waits for handlers)
	return h
}

// readBounded reads resp's body on its own goroutine and fails the test if
// the read has not ended within the test's bound: a reader that waits for
// the upstream to hang up would wait until the test ends.
func readAllBounded(t *testing.T, body io.ReadCloser) []byte {
	t.Helper()
	type result struct {
		b   []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		b, err := io.ReadAll(body)
		done <- result{b, err}
	}()
	select {
	case res := <-done:
		require.NoError(t, res.err)
		body.Close()
		return res.b
	case <-time.After(time.Minute):
		body.Close()
		t.Fatal("the read waits for the upstream to close a finished stream")
		return nil
	}
}

func TestStreamEndsAtItsEnd(t *testing.T) {
	chat := fixture(t, "chat_stream_recorded_gpt4o_text_usage.sse")
	cases := []struct {
		name, path, req string
		body            []byte
		want            []byte
		usage           Usage
	}{
		{"chat-usage", "chat/completions", chatStreamUsageReq, chat, chat, Usage{PromptTokens: 14, CompletionTokens: 30}},
		{"chat-injected-usage", "chat/completions", chatStreamReq, chat, withoutUsageChunk(t, chat), Usage{PromptTokens: 14, CompletionTokens: 30}},
		{"chat-crlf", "chat/completions", chatStreamUsageReq, bytes.ReplaceAll(chat, []byte("\n"), []byte("\r\n")), bytes.ReplaceAll(chat, []byte("\n"), []byte("\r\n")), Usage{PromptTokens: 14, CompletionTokens: 30}},
		{"chat-event-lines", "chat/completions", chatStreamUsageReq, fixture(t, "chat_stream_go_openai_event_lines.sse"), fixture(t, "chat_stream_go_openai_event_lines.sse"), Usage{}},
		{"responses", "responses", responsesStreamReq, fixture(t, "responses_stream_spec_example.sse"), fixture(t, "responses_stream_spec_example.sse"), Usage{PromptTokens: 37, CompletionTokens: 11}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			up := newHeldStream(t, c.body)
			r, reps := newTestRouter(t, Config{Stream: StreamConfig{IdleTimeout: time.Hour},
				Upstreams: []Upstream{{Name: "a", BaseURL: up.url + "/v1"}}})
			resp := post(t, r, c.path, c.req)
			got := readAllBounded(t, resp.Body)
			assert.Equal(t, string(c.want), string(got))
			all := reps.all()
			require.Len(t, all, 1, "the report is made when the stream is over")
			assert.NoError(t, all[0].Err)
			if c.usage != (Usage{}) {
				assert.Equal(t, c.usage, all[0].Usage)
			}
			select { // the upstream was let go
			case <-up.gone:
			case <-time.After(time.Minute):
				t.Fatal("the upstream's connection is held")
			}
		})
	}
}

// TestStreamEndOfLastEventBounded: the end of the stream's last event (the
// blank line after [DONE] or after a terminal Responses event), or the
// [DONE] after every choice's finish_reason and the usage chunk, is waited
// for streamGrace at most: an upstream that holds its connection without
// sending it does not hold the caller.
func TestStreamEndOfLastEventBounded(t *testing.T) {
	chat := fixture(t, "chat_stream_recorded_gpt4o_text_usage.sse")
	responses := fixture(t, "responses_stream_spec_example.sse")
	noDone := bytes.TrimSuffix(chat, []byte("data: [DONE]\n\n"))
	require.Less(t, len(noDone), len(chat))
	cases := []struct {
		name, path, req string
		body            []byte
	}{
		{"done-without-blank-line", "chat/completions", chatStreamUsageReq, bytes.TrimSuffix(chat, []byte("\n"))},
		{"no-done", "chat/completions", chatStreamUsageReq, noDone},
		{"responses-without-blank-line", "responses", responsesStreamReq, bytes.TrimSuffix(responses, []byte("\n"))},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			up := newHeldStream(t, c.body)
			clk := newFakeClock()
			r, reps := newTestRouter(t, Config{Clock: clk, Stream: StreamConfig{IdleTimeout: time.Hour},
				Upstreams: []Upstream{{Name: "a", BaseURL: up.url + "/v1"}}})
			resp := post(t, r, c.path, c.req)
			type result struct {
				b   []byte
				err error
			}
			done := make(chan result, 1)
			go func() {
				b, err := io.ReadAll(resp.Body)
				done <- result{b, err}
			}()
			start := clk.Now()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			for {
				select {
				case res := <-done:
					resp.Body.Close()
					require.NoError(t, res.err, "a finished stream ends cleanly")
					assert.Equal(t, string(c.body), string(res.b))
					assert.Less(t, clk.Now().Sub(start), time.Hour, "ended by the idle timeout")
					all := reps.all()
					require.Len(t, all, 1)
					assert.NoError(t, all[0].Err)
					return
				case d := <-clk.armed:
					if d == streamGrace {
						clk.Advance(d)
					}
				case <-ctx.Done():
					resp.Body.Close()
					t.Fatal("the read waits for the upstream to close a finished stream")
				}
			}
		})
	}
}

// TestStreamAfterEndNotPassed: what an upstream sends after its stream's
// end (the terminal event and the blank line that ends it) is not the
// stream's: the caller's read ends there, however the bytes were cut.
func TestStreamAfterEndNotPassed(t *testing.T) {
	chat := fixture(t, "chat_stream_recorded_gpt4o_text_usage.sse")
	responses := fixture(t, "responses_stream_spec_example.sse")
	late := ": keep-alive\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"late\"}}]}\n\n"
	noBlank := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\ndata: [DONE]\n"
	cases := []struct {
		name, path, req string
		body, want      []byte
	}{
		{"chat", "chat/completions", chatStreamUsageReq, append(bytes.Clone(chat), late...), chat},
		{"chat-injected-usage", "chat/completions", chatStreamReq, append(bytes.Clone(chat), late...), withoutUsageChunk(t, chat)},
		{"no-blank-lines", "chat/completions", chatStreamUsageReq, []byte(noBlank + late), []byte(noBlank)},
		{"crlf", "chat/completions", chatStreamUsageReq, []byte("data: [DONE]\r\n\r\n" + late), []byte("data: [DONE]\r\n\r\n")},
		{"responses", "responses", responsesStreamReq, append(bytes.Clone(responses), "event: response.created\ndata: {}\n\n"...), responses},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, cut := range []func(io.Reader) io.Reader{func(r io.Reader) io.Reader { return r }, iotest.OneByteReader, iotest.HalfReader} {
				r, reps := bodyRouter(t, Config{}, func() io.Reader { return cut(bytes.NewReader(c.body)) })
				got, err := stream(t, r, c.path, c.req)
				require.NoError(t, err)
				assert.Equal(t, string(c.want), string(got))
				require.Len(t, reps.all(), 1)
				assert.NoError(t, reps.all()[0].Err)
			}
		})
	}
}

// TestStreamNotOverBeforeItsEnd: a stream whose every choice finished but
// whose usage has not come, or whose usage came before a choice finished,
// goes on.
func TestStreamNotOverBeforeItsEnd(t *testing.T) {
	body := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},\"finish_reason\":\"stop\"}]}\n\n" +
		"data: {\"choices\":[{\"index\":1,\"delta\":{\"content\":\"b\"}}]}\n\n" +
		"data: {\"choices\":[{\"index\":1,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n" +
		"data: [DONE]\n\n"
	r, reps := bodyRouter(t, Config{}, func() io.Reader { return strings.NewReader(body) })
	got, err := stream(t, r, "chat/completions", `{"model":"gpt-4o","stream":true,"n":2,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Hi"}]}`)
	require.NoError(t, err)
	assert.Equal(t, body, string(got))
	assert.Equal(t, Usage{PromptTokens: 3, CompletionTokens: 2}, reps.all()[0].Usage)
}
