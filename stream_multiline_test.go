package relay

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// event builds one SSE event whose data is split over the given data lines.
func event(lines ...string) string {
	var b strings.Builder
	for _, l := range lines {
		b.WriteString("data: " + l + "\n")
	}
	b.WriteString("\n")
	return b.String()
}

// Events whose data is split over several data: lines, as the SSE
// specification allows (here, JSON printed over several lines).
var (
	// the usage chunk, printed over four lines
	usageSplit = event(`{`, `  "id": "c1", "object": "chat.completion.chunk", "choices": [],`, `  "usage": {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}`, `}`)
	// the last chunk, its finish_reason on the second line
	finishSplit = event(`{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},`, `"finish_reason":"stop"}]}`)
)

// TestStreamMultiLineData: an event whose data is split over several data:
// lines is read as the SSE specification (and openai-go) reads it, its lines
// joined with "\n": its usage, content, finish_reason, terminal Responses
// event and error event all count, however the bytes are cut, and the caller
// reads the bytes the upstream sent. (Each line was parsed alone: all of
// these were missed.)
func TestStreamMultiLineData(t *testing.T) {
	chatHiEv := event(chatHi)
	cases := []struct {
		name, path, req, body string
		usage                 Usage // the report's usage when not estimated
		estimated             int   // else its estimated completion tokens
		clean                 bool  // the reader gets io.EOF
		errMsg                string
	}{
		{name: "usage", body: chatHiEv + event(chatStop) + usageSplit + "data: [DONE]\n\n",
			usage: Usage{PromptTokens: 5, CompletionTokens: 6}, clean: true},
		{name: "usage, first data line empty", body: chatHiEv + event(chatStop) + "data:\n" + usageSplit + "data: [DONE]\n\n",
			usage: Usage{PromptTokens: 5, CompletionTokens: 6}, clean: true},
		{name: "usage at the end, no blank line", body: chatHiEv + event(chatStop) + strings.TrimSuffix(usageSplit, "\n"),
			usage: Usage{PromptTokens: 5, CompletionTokens: 6}, clean: true},
		{name: "finish_reason, no [DONE]", body: chatHiEv + finishSplit, estimated: 1, clean: true},
		{name: "content", body: event(`{"choices":[{"index":0,"delta":{"content":`, `"Hello"},"finish_reason":null}]}`) + "data: [DONE]\n\n",
			estimated: 1, clean: true},
		{name: "chat error", body: chatHiEv + event(`{"error":`, `{"message":"boom","code":"server_error"}}`),
			estimated: 1, errMsg: "server_error: boom"},
		{name: "responses completed", path: "responses", req: responsesStreamReq,
			body: "event: response.output_text.delta\n" + event(`{"type":"response.output_text.delta","delta":"Hi"}`) +
				"event: response.completed\n" + event(`{"type":"response.completed",`, `"response":{"usage":{"input_tokens":3,"output_tokens":2}}}`),
			usage: Usage{PromptTokens: 3, CompletionTokens: 2}, clean: true},
		{name: "responses completed, no event line", path: "responses", req: responsesStreamReq,
			body: event(`{"type":"response.output_text.delta","delta":"Hi"}`) +
				event(`{"type":`, `"response.completed","response":{"usage":{"input_tokens":3,"output_tokens":2}}}`),
			usage: Usage{PromptTokens: 3, CompletionTokens: 2}, clean: true},
		{name: "responses error", path: "responses", req: responsesStreamReq,
			body:      "event: response.output_text.delta\n" + event(`{"type":"response.output_text.delta","delta":"Hi"}`) + "event: error\n" + event(`{"type":"error",`, `"code":"server_error","message":"boom"}`),
			estimated: 1, errMsg: "server_error: boom"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path, req := c.path, c.req
			if path == "" {
				path, req = "chat/completions", chatStreamUsageReq
			}
			for _, crlf := range []bool{false, true} {
				body := c.body
				if crlf {
					body = strings.ReplaceAll(body, "\n", "\r\n")
				}
				type read struct {
					split func(io.Reader) io.Reader
					buf   int // the caller's buffer, reused from Read to Read; 0: io.ReadAll
				}
				reads := []read{{split: func(r io.Reader) io.Reader { return r }}, {split: iotest.OneByteReader}, {split: iotest.HalfReader}}
				// A Read that ends between an event's last data line and its
				// blank line, the next Read reusing the buffer.
				for i := range len(body) {
					if strings.HasPrefix(body[i:], "\n\n") || strings.HasPrefix(body[i:], "\n\r\n") {
						reads = append(reads, read{split: func(r io.Reader) io.Reader { return r }, buf: i + 1})
					}
				}
				for _, rd := range reads {
					r, reps := bodyRouter(t, Config{}, func() io.Reader { return rd.split(strings.NewReader(body)) })
					var got []byte
					var err error
					if rd.buf == 0 {
						got, err = stream(t, r, path, req)
					} else {
						got, err = streamBuf(t, r, path, req, rd.buf)
					}
					assert.Equal(t, body, string(got), "the caller reads the upstream's bytes")
					if c.clean {
						assert.NoError(t, err)
					} else {
						assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
					}
					require.Len(t, reps.all(), 1)
					rep := reps.all()[0]
					if c.estimated > 0 {
						assert.True(t, rep.Usage.Estimated)
						assert.Equal(t, c.estimated, rep.Usage.CompletionTokens)
					} else {
						assert.Equal(t, c.usage, rep.Usage)
					}
					assert.Positive(t, rep.TTFT)
					if c.errMsg != "" {
						assert.ErrorIs(t, rep.Err, ErrStreamError)
						assert.ErrorContains(t, rep.Err, c.errMsg)
					} else {
						assert.NoError(t, rep.Err)
					}
				}
			}
		})
	}
}

// streamBuf is stream reading the answer through one n-byte buffer, reused
// from Read to Read as io.Copy does.
func streamBuf(t testing.TB, rt http.RoundTripper, path, body string, n int) ([]byte, error) {
	t.Helper()
	resp := post(t, rt, path, body)
	defer resp.Body.Close()
	var out bytes.Buffer
	_, err := io.CopyBuffer(struct{ io.Writer }{&out}, onlyReader{resp.Body}, make([]byte, n)) // out's ReadFrom would not use the buffer
	return out.Bytes(), err
}

// TestStreamMultiLineUsageChunkRemoved: the usage chunk the router asked for,
// its data split over several lines, is removed whole (its event: line, its
// data lines, its blank line), and the caller's bytes are otherwise those the
// upstream sent, however they are cut. (It reached the caller.)
func TestStreamMultiLineUsageChunkRemoved(t *testing.T) {
	head := event(chatHi) + event(chatStop)
	cases := []struct{ name, body, want string }{
		{"lf", head + usageSplit + "data: [DONE]\n\n", head + "data: [DONE]\n\n"},
		{"event lines", head + "event: message\n" + usageSplit + "event: message\ndata: [DONE]\n\n", head + "event: message\ndata: [DONE]\n\n"},
		{"split finish_reason before", event(chatHi) + finishSplit + usageSplit + "data: [DONE]\n\n", event(chatHi) + finishSplit + "data: [DONE]\n\n"},
		{"at the end, no blank line", head + strings.TrimSuffix(usageSplit, "\n"), head},
		{"at the end, no line end", head + strings.TrimSuffix(usageSplit, "\n\n"), head},
		// on one line, removed at its line's end with the blank line after it
		{"one line", head + noBlankLines[2] + "\ndata: [DONE]\n\n", head + "data: [DONE]\n\n"},
		{"one line, event lines", head + "event: message\n" + noBlankLines[2] + "\nevent: message\ndata: [DONE]\n\n", head + "event: message\ndata: [DONE]\n\n"},
		{"one line, no blank lines", strings.Join(noBlankLines, ""), strings.Join(noBlankLines[:2], "") + noBlankLines[3]},
		{"one line, at the end", head + noBlankLines[2] + "\n", head},
		{"one line, at the end, no line end", head + strings.TrimSuffix(noBlankLines[2], "\n"), head},
	}
	for _, c := range cases {
		for _, crlf := range []bool{false, true} {
			body, want := c.body, c.want
			if crlf {
				body, want = strings.ReplaceAll(body, "\n", "\r\n"), strings.ReplaceAll(want, "\n", "\r\n")
			}
			// Cut at every byte offset, and a byte at a time.
			for cut := 0; cut <= len(body)+1; cut++ {
				newBody := func() io.Reader { return &cutReader{b: []byte(body), cuts: []int{cut}} }
				if cut > len(body) {
					newBody = func() io.Reader { return iotest.OneByteReader(strings.NewReader(body)) }
				}
				{
					r, reps := bodyRouter(t, Config{}, newBody)
					got, err := stream(t, r, "chat/completions", chatStreamReq)
					require.NoError(t, err, "%s crlf=%v cut=%d", c.name, crlf, cut)
					require.Equal(t, want, string(got), "%s crlf=%v cut=%d", c.name, crlf, cut)
					rep := reps.all()[0]
					require.Equal(t, Usage{PromptTokens: 5, CompletionTokens: 6}, rep.Usage, "%s crlf=%v cut=%d", c.name, crlf, cut)
					require.NoError(t, rep.Err)
				}
			}
		}
	}
}

// TestStreamMultiLineOverLimit: an event whose joined data is over 256 KiB
// (here a 4 MiB tool call printed over lines of 64 KiB, each under the
// limit) passes through unread, as a line over the limit does: the caller
// reads its bytes, its content counts at 4 bytes a token, the events after
// it are read, and the memory the router takes for it stays bounded. (Its
// lines were read one by one, each as a chunk.)
func TestStreamMultiLineOverLimit(t *testing.T) {
	const n = 64
	lines := []string{`{"choices":[{"index":0,"delta":{"tool_calls":[`}
	for i := range n {
		sep := ","
		if i == n-1 {
			sep = ""
		}
		lines = append(lines, `{"index":0,"function":{"arguments":"`+strings.Repeat("x", 64<<10)+`"}}`+sep)
	}
	lines = append(lines, `]},"finish_reason":null}]}`)
	data := strings.Join(lines, "\n")
	body := event(lines...) + event(chatStop) + "data: [DONE]\n\n"
	for _, req := range []string{chatStreamUsageReq, chatStreamReq} {
		r, reps := bodyRouter(t, Config{}, func() io.Reader { return iotest.HalfReader(strings.NewReader(body)) })
		alloc := allocatedBySecondRead(t, r, "chat/completions", req, body)
		all := reps.all()
		require.Len(t, all, 2)
		rep := all[1]
		assert.NoError(t, rep.Err, "finish_reason after the long event read: a clean end")
		assert.Positive(t, rep.TTFT)
		assert.True(t, rep.Usage.Estimated)
		assert.InDelta(t, len(data)/4, rep.Usage.CompletionTokens, 2, "the long event counted at 4 bytes a token")
		t.Logf("%d bytes allocated reading a %d-byte event", alloc, len(data))
		assert.Less(t, alloc, uint64(3<<19), "bytes allocated reading a %d-byte event", len(data))
	}
}

// allocatedBySecondRead streams path with body req through r twice (the
// first loads the tokenizer), reading with a 32 KiB buffer, checks that the
// second read the want bytes to a clean end, and returns the bytes the
// second allocated.
func allocatedBySecondRead(t *testing.T, r http.RoundTripper, path, req, want string) uint64 {
	t.Helper()
	got := bytes.NewBuffer(make([]byte, 0, len(want)))
	buf := make([]byte, 32<<10)
	read := func() error {
		got.Reset()
		resp := post(t, r, path, req)
		defer resp.Body.Close()
		_, err := io.CopyBuffer(got, onlyReader{resp.Body}, buf)
		return err
	}
	require.NoError(t, read())
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	err := read()
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	assert.True(t, want == got.String(), "%d bytes read, want %d", got.Len(), len(want))
	return after.TotalAlloc - before.TotalAlloc
}

// noBlankLines is a chat stream whose upstream sends no blank line between
// its chunks, one line each: content, finish_reason, usage, [DONE].
var noBlankLines = []string{
	"data: " + chatHi + "\n",
	"data: " + chatStop + "\n",
	`data: {"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":6,"total_tokens":11}}` + "\n",
	"data: [DONE]\n",
}

// TestStreamNoBlankLinesChunkAtItsLine: from an upstream that sends no blank
// line between its chunks, each chunk reaches the caller, and is read by the
// router (its content for TTFT), at the end of its own line, not when the
// next line begins; with the usage option injected, the usage line is
// removed. The upstream sends each line only after the caller read the one
// before. (With the option injected, the caller's Read waited for the next
// line, which never came; TTFT was taken at the second line.)
func TestStreamNoBlankLinesChunkAtItsLine(t *testing.T) {
	for _, req := range []string{chatStreamReq, chatStreamUsageReq} {
		injected := req == chatStreamReq
		t.Run(fmt.Sprintf("injected=%v", injected), func(t *testing.T) {
			clk := newFakeClock()
			pr, pw := io.Pipe()
			lines := make(chan string, len(noBlankLines)) // what the upstream sends, in order
			go func() {
				for l := range lines {
					pw.Write([]byte(l))
				}
				pw.Close()
			}()
			closeLines := sync.OnceFunc(func() { close(lines) }) // the upstream's end
			defer closeLines()
			defer pw.CloseWithError(errors.New("test over")) // a Read still blocked fails
			// (the upstream sends each line once the one before was read:
			// not held for its first content)
			r, reps := bodyRouter(t, Config{Clock: clk, Stream: StreamConfig{IdleTimeout: -1, FailoverWindow: -1}}, func() io.Reader { return pr })
			hreq, _ := http.NewRequest("POST", "http://relay.invalid/v1/chat/completions", strings.NewReader(req))
			resp, err := r.RoundTrip(hreq)
			require.NoError(t, err)
			defer resp.Body.Close()
			buf := make([]byte, 4096)
			read := func() (string, error) {
				type result struct {
					n   int
					err error
				}
				done := make(chan result, 1)
				go func() { n, err := resp.Body.Read(buf); done <- result{n, err} }()
				select {
				case res := <-done:
					return string(buf[:res.n]), res.err
				case <-time.After(10 * time.Second): // a watchdog: the bytes are there already
					t.Fatal("Read still waits for a line the upstream does not send")
					return "", nil
				}
			}
			for i, l := range noBlankLines {
				clk.Advance(time.Second)
				lines <- l
				if injected && i == 2 {
					continue // removed: the caller reads [DONE] next
				}
				got, err := read()
				require.NoError(t, err)
				require.Equal(t, l, got, "line %d", i)
			}
			closeLines()
			got, err := read()
			assert.Equal(t, io.EOF, err)
			assert.Empty(t, got)
			rep := reps.all()[0]
			assert.NoError(t, rep.Err)
			assert.Equal(t, Usage{PromptTokens: 5, CompletionTokens: 6}, rep.Usage)
			assert.Equal(t, time.Second, rep.TTFT, "taken at the content line, one second in")
		})
	}
}
