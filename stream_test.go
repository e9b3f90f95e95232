package relay

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/tokenrelay/relay/relaytest"
)

const (
	chatStreamReq      = `{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"Hi"}]}`
	chatStreamUsageReq = `{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Hi"}]}`
	responsesStreamReq = `{"model":"gpt-4o","stream":true,"input":"Hi"}`
)

// sseUpstream is an httptest upstream answering every call with body as an
// event stream, recording the request bodies.
type sseUpstream struct {
	*httptest.Server
	mu     sync.Mutex
	bodies [][]byte
}

func newSSEUpstream(t *testing.T, body []byte) *sseUpstream {
	u := &sseUpstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.bodies = append(u.bodies, b)
		u.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write(body)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *sseUpstream) body(i int) []byte {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.bodies[i]
}

// bodyRouter returns a router whose upstream answers every call with an
// event stream read from the reader newBody returns.
func bodyRouter(t testing.TB, cfg Config, newBody func() io.Reader) (*Router, *reports) {
	reps := &reports{}
	cfg.Upstreams = []Upstream{{Name: "up", BaseURL: "http://up.invalid/v1"}}
	cfg.OnReport = reps.add
	cfg.Base = roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if req.Body != nil {
			io.Copy(io.Discard, req.Body)
			req.Body.Close()
		}
		return &http.Response{
			StatusCode: 200,
			Header:     http.Header{"Content-Type": {"text/event-stream; charset=utf-8"}},
			Body:       io.NopCloser(newBody()),
			Request:    req,
		}, nil
	})
	r, err := New(cfg)
	require.NoError(t, err)
	return r, reps
}

// stream sends body to path through rt and reads the whole answer.
func stream(t testing.TB, rt http.RoundTripper, path, body string) ([]byte, error) {
	t.Helper()
	resp := post(t, rt, path, body)
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// post sends body to path through rt and returns the response.
func post(t testing.TB, rt http.RoundTripper, path, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("POST", "http://relay.invalid/v1/"+path, strings.NewReader(body))
	require.NoError(t, err)
	resp, err := rt.RoundTrip(req)
	require.NoError(t, err)
	return resp
}

// usageChunkRe finds the data line of a chat usage chunk and its blank line.
func withoutUsageChunk(t testing.TB, b []byte) []byte {
	t.Helper()
	lines := strings.SplitAfter(string(b), "\n")
	var out strings.Builder
	removed := 0
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if strings.HasPrefix(l, "data: {") && strings.Contains(l, `"choices":[]`) && strings.Contains(l, `"usage":{`) {
			removed++
			if i+1 < len(lines) && strings.TrimRight(lines[i+1], "\r\n") == "" {
				i++
			}
			continue
		}
		out.WriteString(l)
	}
	require.Equal(t, 1, removed, "fixture has one usage chunk")
	return []byte(out.String())
}

var fixtureUsage = map[string]Usage{
	"chat_stream_recorded_gpt4o_text_usage.sse":       {PromptTokens: 14, CompletionTokens: 30},
	"chat_stream_recorded_gpt4o_length_usage.sse":     {PromptTokens: 79, CompletionTokens: 1},
	"chat_stream_recorded_gpt4o_tool_calls_usage.sse": {PromptTokens: 44, CompletionTokens: 16},
	"chat_stream_go_openai_include_usage.sse":         {PromptTokens: 1, CompletionTokens: 1},
	"responses_stream_spec_example.sse":               {PromptTokens: 37, CompletionTokens: 11},
}

// TestStreamFixtures replays every recorded stream through the router, over
// a real connection and split at every byte: the caller reads the bytes the
// upstream sent, and the report has the fixture's usage.
func TestStreamFixtures(t *testing.T) {
	files, err := filepath.Glob("testdata/openai-wire/*.sse")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		name := filepath.Base(f)
		t.Run(name, func(t *testing.T) {
			raw := fixture(t, name)
			path, req := "chat/completions", chatStreamUsageReq
			if strings.HasPrefix(name, "responses") {
				path, req = "responses", responsesStreamReq
			}
			check := func(t *testing.T, got []byte, err error, reps *reports) {
				t.Helper()
				require.NoError(t, err)
				assert.Equal(t, string(raw), string(got))
				all := reps.all()
				require.Len(t, all, 1)
				rep := all[0]
				assert.True(t, rep.Stream)
				if want, ok := fixtureUsage[name]; ok {
					assert.Equal(t, want, rep.Usage)
				} else {
					assert.True(t, rep.Usage.Estimated, "no usage in %s: estimated", name)
				}
				if strings.Contains(name, "error") {
					assert.ErrorIs(t, rep.Err, ErrStreamError)
					assert.Contains(t, rep.Err.Error(), "The server had an error")
				} else {
					assert.NoError(t, rep.Err)
					assert.Positive(t, rep.TTFT)
				}
			}

			up := newSSEUpstream(t, raw)
			r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL + "/v1"}}})
			got, err := stream(t, r, path, req)
			check(t, got, err, reps)
			assert.JSONEq(t, req, string(up.body(0)), "the caller asked for usage: body sent unchanged")

			for _, mk := range []struct {
				name string
				f    func(io.Reader) io.Reader
			}{{"OneByte", iotest.OneByteReader}, {"Half", iotest.HalfReader}, {"DataErr", iotest.DataErrReader}} {
				t.Run(mk.name, func(t *testing.T) {
					r, reps := bodyRouter(t, Config{}, func() io.Reader { return mk.f(bytes.NewReader(raw)) })
					got, err := stream(t, r, path, req)
					check(t, got, err, reps)
				})
			}
		})
	}
}

// TestStreamInjectedUsage: a caller that did not ask for usage gets the
// stream it asked for, the upstream was asked for usage, and the report has
// the upstream's usage.
func TestStreamInjectedUsage(t *testing.T) {
	withEvents := func(b []byte) []byte {
		return bytes.ReplaceAll(b, []byte("data: "), []byte("event: message\ndata: "))
	}
	withCRLF := func(b []byte) []byte { return bytes.ReplaceAll(b, []byte("\n"), []byte("\r\n")) }
	cases := []struct {
		name string
		body []byte
		want Usage
	}{
		{"recorded", fixture(t, "chat_stream_recorded_gpt4o_text_usage.sse"), Usage{PromptTokens: 14, CompletionTokens: 30}},
		{"tools", fixture(t, "chat_stream_recorded_gpt4o_tool_calls_usage.sse"), Usage{PromptTokens: 44, CompletionTokens: 16}},
		{"usage-null-chunks", fixture(t, "chat_stream_go_openai_include_usage.sse"), Usage{PromptTokens: 1, CompletionTokens: 1}},
		{"event-lines", withEvents(fixture(t, "chat_stream_go_openai_include_usage.sse")), Usage{PromptTokens: 1, CompletionTokens: 1}},
		{"crlf", withCRLF(fixture(t, "chat_stream_recorded_gpt4o_length_usage.sse")), Usage{PromptTokens: 79, CompletionTokens: 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want := withoutUsageChunk(t, c.body)
			if c.name == "event-lines" {
				// the event line before the usage chunk goes too
				want = bytes.Replace(want, []byte("event: message\nevent: message\n"), []byte("event: message\n"), 1)
				require.Equal(t, bytes.Count(c.body, []byte("event: message\n"))-1, bytes.Count(want, []byte("event: message\n")))
			}
			up := newSSEUpstream(t, c.body)
			r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL + "/v1"}}})
			got, err := stream(t, r, "chat/completions", chatStreamReq)
			require.NoError(t, err)
			assert.Equal(t, string(want), string(got))
			assert.True(t, gjson.GetBytes(up.body(0), "stream_options.include_usage").Bool(), "upstream asked for usage")
			rep := reps.all()[0]
			assert.Equal(t, c.want, rep.Usage)
			assert.NoError(t, rep.Err)

			// Split at every byte, and two bytes at a time.
			for _, f := range []func(io.Reader) io.Reader{iotest.OneByteReader, iotest.HalfReader} {
				r, reps := bodyRouter(t, Config{}, func() io.Reader { return f(bytes.NewReader(c.body)) })
				got, err := stream(t, r, "chat/completions", chatStreamReq)
				require.NoError(t, err)
				assert.Equal(t, string(want), string(got))
				assert.Equal(t, c.want, reps.all()[0].Usage)
			}

			// Turned off: the caller reads every byte and usage is estimated.
			r, reps = bodyRouter(t, Config{Stream: StreamConfig{KeepUsageOption: true}}, func() io.Reader { return bytes.NewReader(c.body) })
			got, err = stream(t, r, "chat/completions", chatStreamReq)
			require.NoError(t, err)
			assert.Equal(t, string(c.body), string(got))
			assert.Equal(t, c.want, reps.all()[0].Usage, "usage in the stream is still read")
		})
	}

	t.Run("relaytest", func(t *testing.T) {
		srv := relaytest.NewServer()
		defer srv.Close()
		r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL}}})
		for _, f := range []relaytest.Fault{{}, {EventLines: true}} {
			srv.Script(f)
			got, err := stream(t, r, "chat/completions", chatStreamReq)
			require.NoError(t, err)
			// Chunks keep the "usage":null the upstream adds (bytes are never
			// re-encoded); only the usage chunk itself is gone.
			assert.NotContains(t, string(got), `"usage":{`)
			assert.Contains(t, string(got), "data: [DONE]")
		}
		for _, rec := range srv.Requests() {
			assert.True(t, gjson.GetBytes(rec.Body, "stream_options.include_usage").Bool())
		}
		for _, rep := range reps.all() {
			assert.Equal(t, relaytest.DefaultCompletionTokens, rep.Usage.CompletionTokens)
			assert.False(t, rep.Usage.Estimated)
		}
	})
}

// TestStreamChunksPassAsTheyArrive: the first chunk is readable while the
// upstream still holds the rest.
func TestStreamChunksPassAsTheyArrive(t *testing.T) {
	for _, req := range []string{chatStreamReq, chatStreamUsageReq} {
		release := make(chan struct{})
		var once sync.Once
		unblock := func() { once.Do(func() { close(release) }) }
		first := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n"
		rest := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"}}]}\n\ndata: [DONE]\n\n"
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, first)
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
			io.WriteString(w, rest)
		}))
		t.Cleanup(up.Close)
		t.Cleanup(unblock)
		r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL + "/v1"}}})
		hreq, _ := http.NewRequest("POST", "http://relay.invalid/v1/chat/completions", strings.NewReader(req))
		resp, err := r.RoundTrip(hreq)
		require.NoError(t, err)
		buf := make([]byte, len(first))
		_, err = io.ReadFull(resp.Body, buf)
		require.NoError(t, err)
		assert.Equal(t, first, string(buf), "first chunk read before the upstream sent the rest")
		assert.Empty(t, reps.all())
		unblock()
		tail, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		assert.Equal(t, rest, string(tail))
		resp.Body.Close()
		up.Close()
		require.Len(t, reps.all(), 1)
		assert.True(t, reps.all()[0].Usage.Estimated)
		assert.Equal(t, 1, reps.all()[0].Usage.CompletionTokens, `"Hel"+"lo" counted as "Hello"`)
	}
}

// TestStreamTruncated: a stream that ends without its terminal event is an
// error to the reader, and the report estimates the usage.
func TestStreamTruncated(t *testing.T) {
	t.Run("cut connection", func(t *testing.T) {
		srv := relaytest.NewServer()
		defer srv.Close()
		r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL}}})
		srv.Script(relaytest.Fault{CutAfter: 3})
		got, err := stream(t, r, "chat/completions", chatStreamReq)
		assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
		assert.Equal(t, 3, bytes.Count(got, []byte("data: ")))
		rep := reps.all()[0]
		assert.ErrorIs(t, rep.Err, io.ErrUnexpectedEOF)
		assert.True(t, rep.Usage.Estimated)
		assert.Equal(t, 2, rep.Usage.CompletionTokens, `"Hello" and " from"`)
		assert.Equal(t, rep.PromptTokens, rep.Usage.PromptTokens)
	})
	for _, c := range []struct{ name, path, req, body string }{
		{"chat clean EOF", "chat/completions", chatStreamReq, "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n"},
		{"chat partial line", "chat/completions", chatStreamReq, "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: {\"cho"},
		{"responses", "responses", responsesStreamReq, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n"},
		{"empty", "chat/completions", chatStreamReq, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := newSSEUpstream(t, []byte(c.body))
			r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL + "/v1"}}})
			got, err := stream(t, r, c.path, c.req)
			require.ErrorIs(t, err, io.ErrUnexpectedEOF)
			var rerr *Error
			require.ErrorAs(t, err, &rerr)
			assert.Equal(t, "stream", rerr.Op)
			assert.Equal(t, c.body, string(got))
			require.Len(t, reps.all(), 1)
			assert.ErrorIs(t, reps.all()[0].Err, io.ErrUnexpectedEOF)
		})
	}
	t.Run("terminal events", func(t *testing.T) {
		for _, ev := range []string{"response.completed", "response.incomplete", "response.failed"} {
			body := "event: " + ev + "\ndata: {\"type\":\"" + ev + "\",\"response\":{\"usage\":{\"input_tokens\":3,\"output_tokens\":2},\"error\":{\"code\":\"server_error\",\"message\":\"boom\"}}}\n\n"
			r, reps := bodyRouter(t, Config{}, func() io.Reader { return strings.NewReader(body) })
			got, err := stream(t, r, "responses", responsesStreamReq)
			require.NoError(t, err, ev)
			assert.Equal(t, body, string(got))
			rep := reps.all()[0]
			assert.Equal(t, Usage{PromptTokens: 3, CompletionTokens: 2}, rep.Usage)
			if ev == "response.failed" {
				assert.ErrorIs(t, rep.Err, ErrStreamError)
				assert.Contains(t, rep.Err.Error(), "server_error: boom")
			} else {
				assert.NoError(t, rep.Err)
			}
		}
	})
}

// TestStreamStalled: a stream that goes quiet for the idle timeout is closed
// upstream and the reader gets ErrStreamStalled; the fake clock drives it.
func TestStreamStalled(t *testing.T) {
	for _, path := range []string{"chat/completions", "responses"} {
		t.Run(path, func(t *testing.T) {
			srv := relaytest.NewServer()
			defer srv.Close()
			clk := newFakeClock()
			r, reps := newTestRouter(t, Config{
				Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL}},
				Clock:     clk,
				// (a Responses stream stalls here before its first content:
				// held, it would be retried elsewhere, see failover_test.go)
				Stream: StreamConfig{IdleTimeout: 10 * time.Second, FailoverWindow: -1},
			})
			srv.Script(relaytest.Fault{StallAfter: 3})
			req := chatStreamReq
			if path == "responses" {
				req = responsesStreamReq
			}
			type result struct {
				b   []byte
				err error
			}
			done := make(chan result, 1)
			progress := make(chan struct{})
			go func() {
				hreq, _ := http.NewRequest("POST", "http://relay.invalid/v1/"+path, strings.NewReader(req))
				resp, err := r.RoundTrip(hreq)
				if err != nil {
					close(progress)
					done <- result{nil, err}
					return
				}
				defer resp.Body.Close()
				var b []byte
				buf := make([]byte, 64)
				signal := progress
				for {
					n, err := resp.Body.Read(buf)
					b = append(b, buf[:n]...)
					if signal != nil && bytes.Count(b, []byte("data: ")) == 3 && bytes.HasSuffix(b, []byte("\n\n")) {
						close(signal) // everything the upstream sends was read
						signal = nil
					}
					if err != nil {
						done <- result{b, err}
						return
					}
				}
			}()
			<-progress
			deadline := time.After(10 * time.Second)
			for {
				select {
				case res := <-done:
					require.ErrorIs(t, res.err, ErrStreamStalled)
					assert.Equal(t, 3, bytes.Count(res.b, []byte("data: ")))
					all := reps.all()
					require.Len(t, all, 1)
					assert.ErrorIs(t, all[0].Err, ErrStreamStalled)
					assert.True(t, all[0].Usage.Estimated)
					return
				case <-clk.armed:
					// The idle timer was (re-)armed: let an idle period pass.
					clk.Advance(10 * time.Second)
				case <-deadline:
					t.Fatal("stall not detected")
				}
			}
		})
	}
}

// TestStreamIdleOnlyWhileReading: a caller that is slow between Reads is
// not a stall.
func TestStreamIdleOnlyWhileReading(t *testing.T) {
	body := fixture(t, "chat_stream_recorded_gpt4o_text_usage.sse")
	clk := newFakeClock()
	r, reps := bodyRouter(t, Config{Clock: clk, Stream: StreamConfig{IdleTimeout: time.Second}},
		func() io.Reader { return iotest.HalfReader(bytes.NewReader(body)) })
	hreq, _ := http.NewRequest("POST", "http://relay.invalid/v1/chat/completions", strings.NewReader(chatStreamUsageReq))
	resp, err := r.RoundTrip(hreq)
	require.NoError(t, err)
	var got bytes.Buffer
	buf := make([]byte, 512)
	for {
		n, err := resp.Body.Read(buf)
		got.Write(buf[:n])
		clk.Advance(time.Hour) // the caller dawdles between reads
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
	}
	resp.Body.Close()
	assert.Equal(t, string(body), got.String())
	assert.NoError(t, reps.all()[0].Err)
}

// TestStreamErrorEvent: an error inside a 200 stream reaches Report.Err, and
// the caller reads its bytes.
func TestStreamErrorEvent(t *testing.T) {
	srv := relaytest.NewServer()
	defer srv.Close()
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL}}})
	for i, c := range []struct{ path, req string }{
		{"chat/completions", chatStreamReq}, {"chat/completions", chatStreamUsageReq}, {"responses", responsesStreamReq},
	} {
		srv.Script(relaytest.Fault{ErrorEvent: true})
		got, err := stream(t, r, c.path, c.req)
		assert.ErrorIs(t, err, io.ErrUnexpectedEOF, "relaytest ends an error stream without its terminal event")
		assert.Contains(t, string(got), `"error"`)
		rep := reps.all()[i]
		assert.ErrorIs(t, rep.Err, ErrStreamError)
		var rerr *Error
		require.ErrorAs(t, rep.Err, &rerr)
		assert.Equal(t, "stream", rerr.Op)
		assert.Equal(t, "a", rerr.Upstream)
	}
	assert.Len(t, reps.all(), 3)
}

// TestStreamEarlyClose: a caller that stops reading halfway gets one report
// with what was seen, and the upstream connection is released.
func TestStreamEarlyClose(t *testing.T) {
	gone := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"Hello\"}}]}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(gone)
	}))
	defer up.Close()
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL + "/v1"}}})
	hreq, _ := http.NewRequest("POST", "http://relay.invalid/v1/chat/completions", strings.NewReader(chatStreamReq))
	resp, err := r.RoundTrip(hreq)
	require.NoError(t, err)
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	assert.Contains(t, line, "Hello")
	require.NoError(t, resp.Body.Close())
	select {
	case <-gone:
	case <-time.After(10 * time.Second):
		t.Fatal("upstream connection not released")
	}
	resp.Body.Close()
	_, err = resp.Body.Read(make([]byte, 1))
	assert.Error(t, err)
	all := reps.all()
	require.Len(t, all, 1)
	assert.NoError(t, all[0].Err, "the caller's choice, not a failure")
	assert.Equal(t, Usage{PromptTokens: all[0].PromptTokens, CompletionTokens: 1, Estimated: true}, all[0].Usage)
	assert.Positive(t, all[0].TTFT)

	// Closed without reading: still one report. (Not held for its first
	// content: a held stream's TTFT is when the router read it.)
	up2 := newSSEUpstream(t, fixture(t, "chat_stream_recorded_gpt4o_text_usage.sse"))
	r2, reps2 := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up2.URL + "/v1"}}, Stream: StreamConfig{FailoverWindow: -1}})
	hreq, _ = http.NewRequest("POST", "http://relay.invalid/v1/chat/completions", strings.NewReader(chatStreamReq))
	resp, err = r2.RoundTrip(hreq)
	require.NoError(t, err)
	resp.Body.Close()
	resp.Body.Close()
	require.Len(t, reps2.all(), 1)
	assert.Zero(t, reps2.all()[0].TTFT, "no content chunk read: TTFT 0")
}

// TestStreamFirstTokenFailover: an upstream that sends headers and no first
// token within the timeout is abandoned for the next one, before anything
// reached the caller.
func TestStreamFirstTokenFailover(t *testing.T) {
	fleet := relaytest.NewFleet([]string{"slow", "fast"})
	defer fleet.Close()
	fleet.Get("slow").Script(relaytest.Fault{FirstTokenDelay: time.Hour})
	clk := newFakeClock()
	r, reps := newTestRouter(t, Config{
		Upstreams: []Upstream{{Name: "slow", BaseURL: fleet.Get("slow").URL}, {Name: "fast", BaseURL: fleet.Get("fast").URL}},
		Strategy:  StrategyPriority,
		Clock:     clk,
		Retry:     RetryConfig{Backoff: func(int) time.Duration { return 0 }},
		Stream:    StreamConfig{FirstTokenTimeout: 2 * time.Second, IdleTimeout: -1},
	})
	type result struct {
		resp *http.Response
		err  error
	}
	done := make(chan result, 1)
	go func() {
		hreq, _ := http.NewRequest("POST", "http://relay.invalid/v1/chat/completions", strings.NewReader(chatStreamReq))
		resp, err := r.RoundTrip(hreq)
		done <- result{resp, err}
	}()
	select {
	case d := <-clk.armed:
		assert.Equal(t, 2*time.Second, d)
	case <-time.After(10 * time.Second):
		t.Fatal("first-token timer not armed")
	}
	clk.Advance(2 * time.Second)
	var res result
	select {
	case res = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("no failover")
	}
	require.NoError(t, res.err)
	assert.Equal(t, "fast", res.resp.Header.Get(HeaderUpstream))
	b, err := io.ReadAll(res.resp.Body)
	require.NoError(t, err)
	res.resp.Body.Close()
	assert.Contains(t, string(b), "data: [DONE]")
	assert.NotContains(t, string(b), `"usage":{`)
	all := reps.all()
	require.Len(t, all, 1)
	assert.Equal(t, "fast", all[0].Upstream)
	assert.Equal(t, 2, all[0].Attempts)
	assert.NoError(t, all[0].Err)
	assert.Equal(t, relaytest.DefaultCompletionTokens, all[0].Usage.CompletionTokens)
	assert.Equal(t, map[string]int{"slow": 1, "fast": 1}, fleet.Calls())
}

// TestStreamNotRetriedAfterFirstToken: once content reached the caller (or
// was read ahead), a failing stream is the caller's, never retried.
func TestStreamNotRetriedAfterFirstToken(t *testing.T) {
	fleet := relaytest.NewFleet([]string{"a", "b"})
	defer fleet.Close()
	fleet.Get("a").Script(relaytest.Fault{CutAfter: 2})
	r, reps := newTestRouter(t, Config{
		Upstreams: []Upstream{{Name: "a", BaseURL: fleet.Get("a").URL}, {Name: "b", BaseURL: fleet.Get("b").URL}},
		Strategy:  StrategyPriority,
		Stream:    StreamConfig{FirstTokenTimeout: time.Minute},
	})
	_, err := stream(t, r, "chat/completions", chatStreamReq)
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
	rep := reps.all()[0]
	assert.Equal(t, 1, rep.Attempts)
	assert.Equal(t, "a", rep.Upstream)
	assert.Equal(t, 0, fleet.Get("b").Calls(), "%+v", rep)
}

// TestStreamBadInput: whatever the upstream sends, the caller reads exactly
// those bytes, and nothing panics.
func TestStreamBadInput(t *testing.T) {
	bigArgs := strings.Repeat("x", 1<<20)
	bigLine := `data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"` + bigArgs + `"}}]}}]}`
	cases := []struct {
		name    string
		body    string
		errCode string // expected in Report.Err, when set
		clean   bool   // ends with [DONE]
	}{
		{"crlf", strings.ReplaceAll(string(fixture(t, "chat_stream_recorded_gpt4o_text_usage.sse")), "\n", "\r\n"), "", true},
		{"comments and events", ": keep-alive\n\nevent: message\nid: 1\nretry: 10\ndata: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n: bye\ndata: [DONE]\n\n", "", true},
		{"1 MiB tool call", bigLine + "\n\n" + "data: [DONE]\n\n", "", true},
		{"invalid json", "data: {\"choices\":[{\"delta\":{\"content\":\"x\n\ndata: {{{\n\ndata: nope\n\ndata: [DONE]\n\n", "", true},
		{"binary", "\x00\xff\xfe\r\r\n\x1b[0m data: \x00\n\n\xc3\x28\n" + "data: [DONE]\n\n", "", true},
		{"plain json error", string(fixture(t, "chat_stream_error_plain_json_body.txt")), "invalid_api_key", false},
		{"usage chunk variants", "data: {\"choices\":[],\"usage\":null}\n\ndata: {\"usage\":{\"prompt_tokens\":\"x\"}}\n\ndata: {\"choices\":[], \"usage\" : {\"prompt_tokens\":5,\"completion_tokens\":6}}\n\ndata: [DONE]\n\n", "", true},
		// Not SSE (one event, to the spec), but go-openai reads it line by
		// line, and so does the router: each line is a whole chunk.
		{"no blank lines", "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\ndata: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":6}}\ndata: [DONE]\n", "", true},
		{"no blank lines, no [DONE]", "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\ndata: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":6}}", "", true},
	}
	for _, c := range cases {
		for _, req := range []string{chatStreamUsageReq, chatStreamReq} {
			injected := req == chatStreamReq
			for _, split := range []func(io.Reader) io.Reader{func(r io.Reader) io.Reader { return r }, iotest.OneByteReader} {
				r, reps := bodyRouter(t, Config{}, func() io.Reader { return split(strings.NewReader(c.body)) })
				got, err := stream(t, r, "chat/completions", req)
				want := c.body
				if injected && c.name == "usage chunk variants" {
					want = strings.Replace(want, "data: {\"choices\":[], \"usage\" : {\"prompt_tokens\":5,\"completion_tokens\":6}}\n\n", "", 1)
				}
				if injected && strings.HasPrefix(c.name, "no blank lines") {
					// the usage line, with its line end when it has one
					want = strings.Replace(want, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":6}}\n", "", 1)
					want = strings.TrimSuffix(want, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":6}}")
				}
				if injected && c.name == "crlf" {
					want = strings.ReplaceAll(string(withoutUsageChunk(t, fixture(t, "chat_stream_recorded_gpt4o_text_usage.sse"))), "\n", "\r\n")
				}
				if len(want) < 4096 {
					assert.Equal(t, want, string(got), c.name)
				} else {
					assert.True(t, want == string(got), "%s: %d bytes read, want %d", c.name, len(got), len(want))
				}
				if c.clean {
					assert.NoError(t, err, c.name)
				} else {
					assert.ErrorIs(t, err, io.ErrUnexpectedEOF, c.name)
				}
				rep := reps.all()[0]
				if c.errCode != "" {
					assert.ErrorIs(t, rep.Err, ErrStreamError, c.name)
					assert.Contains(t, rep.Err.Error(), c.errCode)
					assert.NotContains(t, rep.Err.Error(), "sk-proj")
				}
				switch c.name {
				case "1 MiB tool call":
					assert.Positive(t, rep.TTFT)
					assert.True(t, rep.Usage.Estimated)
					assert.InDelta(t, len(bigLine)/4, rep.Usage.CompletionTokens, 10, "long line estimated at 4 bytes a token")
				case "usage chunk variants":
					assert.Equal(t, Usage{PromptTokens: 5, CompletionTokens: 6}, rep.Usage)
				case "no blank lines", "no blank lines, no [DONE]":
					assert.Equal(t, Usage{PromptTokens: 5, CompletionTokens: 6}, rep.Usage, c.name)
					assert.Positive(t, rep.TTFT, c.name)
				}
			}
		}
	}
}

// TestStreamReadAfterEnd: Read after the end keeps returning the same
// error, and Close after the end makes no second report.
func TestStreamReadAfterEnd(t *testing.T) {
	r, reps := bodyRouter(t, Config{}, func() io.Reader { return strings.NewReader("data: {}\n\n") })
	hreq, _ := http.NewRequest("POST", "http://relay.invalid/v1/chat/completions", strings.NewReader(chatStreamReq))
	resp, err := r.RoundTrip(hreq)
	require.NoError(t, err)
	_, err = io.ReadAll(resp.Body)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	_, err2 := resp.Body.Read(make([]byte, 8))
	assert.Equal(t, err, err2)
	resp.Body.Close()
	assert.Len(t, reps.all(), 1)
}

// TestStreamConcurrentClose: Close from another goroutine during a blocked
// Read is safe and makes one report.
func TestStreamConcurrentClose(t *testing.T) {
	pr, pw := io.Pipe()
	defer pw.Close()
	// (the upstream writes once RoundTrip returned: not held)
	r, reps := bodyRouter(t, Config{Stream: StreamConfig{FailoverWindow: -1}}, func() io.Reader { return pr })
	hreq, _ := http.NewRequest("POST", "http://relay.invalid/v1/chat/completions", strings.NewReader(chatStreamReq))
	resp, err := r.RoundTrip(hreq)
	require.NoError(t, err)
	go func() {
		pw.Write([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"))
	}()
	readDone := make(chan error, 1)
	go func() {
		_, err := io.ReadAll(resp.Body)
		readDone <- err
	}()
	time.Sleep(10 * time.Millisecond) // let the Read block; the test holds either way
	resp.Body.Close()
	pr.CloseWithError(errors.New("closed"))
	<-readDone
	assert.Len(t, reps.all(), 1)
}

// FuzzStream feeds arbitrary bytes, cut at arbitrary points, through the
// router: the caller's bytes always equal the input, minus only the injected
// usage chunk when the router asked for usage; they, and what the router read
// (the report's usage, error and TTFT), are the same whether the input comes
// cut or a byte at a time, or is read through a small reused buffer.
func FuzzStream(f *testing.F) {
	for _, name := range []string{"chat_stream_go_openai_include_usage.sse", "chat_stream_go_openai_event_lines.sse", "responses_stream_spec_example.sse", "chat_stream_error_in_stream.sse"} {
		b, err := bodyFixture(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, uint16(7), uint16(300), true)
		f.Add(b, uint16(1), uint16(2), false)
	}
	f.Add([]byte("event: message\r\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\r\n\r\n\x00"), uint16(3), uint16(40), true)
	// events whose data is split over several data: lines
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\n\ndata: \"x\"}}]}\n\nevent: message\ndata: {\ndata: \"choices\":[],\ndata: \"usage\":{\"prompt_tokens\":1}}\n\ndata: [DONE]\n\n"), uint16(5), uint16(90), true)
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\ndata: [DONE]\n"), uint16(9), uint16(70), true)
	f.Add([]byte("data: {\"choices\":[],\r\ndata: \"usage\":{\"prompt_tokens\":1}}\r\nid: 1\r\n\r\ndata: {\"choices\":[],\r\ndata: \"usage\":{}}"), uint16(2), uint16(60), true)
	// what an upstream sends after the stream's end
	f.Add([]byte("data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\ndata: [DONE]\r\n\r\n: ping\n\ndata: {\"choices\":[]}\n\n"), uint16(4), uint16(150), true)
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\ndata: [DONE]\ndata: {\"choices\":[{\"delta\":{\"content\":\"late\"}}]}\n"), uint16(11), uint16(50), false)
	f.Add([]byte("event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":2,\"output_tokens\":1}}}\n\r\nevent: response.created\ndata: {}\n\n"), uint16(20), uint16(110), false)
	f.Fuzz(func(t *testing.T, in []byte, c1, c2 uint16, inject bool) {
		cuts := []int{int(c1) % (len(in) + 1), int(c2) % (len(in) + 1)}
		if cuts[0] > cuts[1] {
			cuts[0], cuts[1] = cuts[1], cuts[0]
		}
		req := chatStreamUsageReq
		if inject {
			req = chatStreamReq
		}
		// what the router read: the same however the bytes are cut
		type seen struct {
			usage Usage
			err   string
			ttft  bool
		}
		var want *seen
		bufN := 0 // the caller's buffer, reused from Read to Read; 0: io.ReadAll
		read := func(cuts []int) []byte {
			r, reps := bodyRouter(t, Config{}, func() io.Reader {
				if cuts == nil {
					return iotest.OneByteReader(bytes.NewReader(in))
				}
				return &cutReader{b: in, cuts: cuts}
			})
			var got []byte
			if bufN > 0 {
				got, _ = streamBuf(t, r, "chat/completions", req, bufN)
			} else {
				got, _ = stream(t, r, "chat/completions", req)
			}
			if len(reps.all()) != 1 {
				t.Fatalf("%d reports", len(reps.all()))
			}
			rep := reps.all()[0]
			s := seen{usage: rep.Usage, ttft: rep.TTFT > 0}
			if rep.Err != nil {
				s.err = rep.Err.Error()
			}
			if want == nil {
				want = &s
			} else if s != *want {
				t.Fatalf("the router read %+v, and %+v with other cuts", s, *want)
			}
			return got
		}
		got := read(cuts)
		if !bytes.Equal(got, read(nil)) {
			t.Fatalf("output depends on how reads are cut")
		}
		bufN = 1 + int(c1^c2)%97
		if !bytes.Equal(got, read([]int{})) {
			t.Fatalf("output depends on the caller's buffer")
		}
		// What the caller read is what the upstream sent, up to the
		// stream's end (an upstream may send more after it), less one usage
		// chunk (whole lines) when the router asked for usage.
		over := func(b []byte) bool {
			for _, end := range []string{"[DONE]", "response.completed", "response.incomplete", "response.failed"} {
				if bytes.Contains(b, []byte(end)) {
					return true
				}
			}
			return false
		}
		if bytes.HasPrefix(in, got) {
			if len(got) < len(in) && !over(got) {
				t.Fatalf("caller read %q, part of the input %q", got, in)
			}
			return
		}
		if !inject {
			t.Fatalf("caller read %q, upstream sent %q", got, in)
		}
		i := 0
		for i < len(got) && got[i] == in[i] {
			i++
		}
		for j := i; j >= 0; j-- {
			if j > 0 && in[j-1] != '\n' {
				continue
			}
			for e := j; e < len(in); e++ {
				if in[e] != '\n' {
					continue
				}
				rest := in[e+1:]
				if bytes.HasPrefix(rest, got[j:]) && bytes.Contains(in[j:e], []byte(`"usage"`)) && (len(rest) == len(got)-j || over(got)) {
					return
				}
			}
		}
		t.Fatalf("caller read %q, not the input %q minus one usage chunk", got, in)
	})
}

func bodyFixture(name string) ([]byte, error) {
	return os.ReadFile("testdata/openai-wire/" + name)
}

// cutReader returns b in pieces ending at cuts.
type cutReader struct {
	b    []byte
	off  int
	cuts []int
}

func (c *cutReader) Read(p []byte) (int, error) {
	if c.off >= len(c.b) {
		return 0, io.EOF
	}
	end := len(c.b)
	for _, x := range c.cuts {
		if x > c.off && x < end {
			end = x
		}
	}
	n := copy(p, c.b[c.off:end])
	c.off += n
	return n, nil
}

// TestStreamWithCallersAcceptEncoding: a caller that asks for gzip itself
// (so net/http would not decompress) still reads a clean stream, without
// the usage chunk the router asked for; an upstream that gzips anyway (a
// Base that does not decompress) is decoded too.
func TestStreamWithCallersAcceptEncoding(t *testing.T) {
	plain := fixture(t, "chat_stream_recorded_gpt4o_text_usage.sse")
	gz := func(b []byte) []byte {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		zw.Write(b)
		zw.Close()
		return buf.Bytes()
	}
	up := newHandlerServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.Header().Set("Content-Encoding", "gzip")
			w.Write(gz(plain))
			return
		}
		w.Write(plain)
	}))
	for _, c := range []struct {
		name string
		base http.RoundTripper
	}{
		{"default transport", nil},
		{"a Base that keeps the coding", roundTripFunc(func(r *http.Request) (*http.Response, error) {
			r.Header.Set("Accept-Encoding", "gzip")
			return (&http.Transport{DisableCompression: true}).RoundTrip(r)
		})},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, reps := newTestRouter(t, Config{Base: c.base, Upstreams: []Upstream{{Name: "a", BaseURL: up}}})
			req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatStreamReq))
			req.Header.Set("Accept-Encoding", "gzip")
			resp, err := r.RoundTrip(req)
			require.NoError(t, err)
			got, err := io.ReadAll(resp.Body)
			require.NoError(t, err, "a complete stream ends cleanly")
			resp.Body.Close()
			assert.Equal(t, string(withoutUsageChunk(t, plain)), string(got))
			rep := reps.all()[0]
			assert.NoError(t, rep.Err)
			assert.False(t, rep.Usage.Estimated)
		})
	}
}

// TestStreamErrorEventKeyRedacted: an error event that echoes a key is in
// Report.Err without it.
func TestStreamErrorEventKeyRedacted(t *testing.T) {
	const key = "sk-proj-configured-key-0123"
	body := "data: {\"error\":{\"message\":\"Incorrect API key provided: " + key + ". Also sk-other-0123456789 and hs_live_abcdef12\",\"code\":\"invalid_api_key\"}}\n\n"
	up := newSSEUpstream(t, []byte(body))
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL, APIKey: key}, {Name: "b", BaseURL: up.URL, APIKey: "hs_live_xyz9876543", KeyPrefixes: []string{"hs_live_"}}}})
	req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatStreamReq))
	resp, err := r.RoundTrip(req)
	require.NoError(t, err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	rep := reps.all()[0]
	require.ErrorIs(t, rep.Err, ErrStreamError)
	msg := rep.Err.Error()
	assert.Contains(t, msg, "Incorrect API key provided: [redacted]")
	for _, secret := range []string{key, "sk-other-0123456789", "hs_live_abcdef12"} {
		assert.NotContains(t, msg, secret)
	}
}

func TestIsEventStream(t *testing.T) {
	for ct, want := range map[string]bool{
		"text/event-stream":                     true,
		"text/event-stream; charset=utf-8":      true,
		"Text/Event-Stream;charset=UTF-8":       true,
		" text/event-stream ":                   true,
		"text/event-stream;":                    true,
		"text/event-streams":                    false,
		"text/event":                            false,
		"application/json":                      false,
		"application/json; x=text/event-stream": false,
		"":                                      false,
	} {
		h := http.Header{}
		if ct != "" {
			h.Set("Content-Type", ct)
		}
		assert.Equal(t, want, isEventStream(h), "%q", ct)
	}
	assert.False(t, isEventStream(nil))
}
