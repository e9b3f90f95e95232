package relay

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestGzipFirstToken: with FirstTokenTimeout set, a gzip-encoded
// stream (a Base other than http.Transport leaves the coding) is decoded
// before the first token is looked for, and the caller reads it decoded.
// (It was read ahead compressed: no first token, and the caller got gzip.)
func TestGzipFirstToken(t *testing.T) {
	plain := fixture(t, "chat_stream_recorded_gpt4o_text_usage.sse")
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(plain)
	zw.Close()
	up := newHandlerServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Content-Encoding", "gzip")
		w.Write(gz.Bytes())
	}))
	tr := &http.Transport{DisableCompression: true}
	defer tr.CloseIdleConnections()
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		r.Header.Set("Accept-Encoding", "gzip")
		return tr.RoundTrip(r)
	})
	r, _ := newTestRouter(t, Config{Base: base, Upstreams: []Upstream{{Name: "a", BaseURL: up}}, Stream: StreamConfig{FirstTokenTimeout: 5 * time.Second}})
	got, err := stream(t, r, "chat/completions", chatStreamUsageReq)
	assert.NoError(t, err)
	assert.True(t, bytes.Equal(plain, got), "caller got %q...", got[:min(len(got), 12)])
}

// TestDoneThenConnCut: a stream that sent [DONE] and whose
// connection then drops (no last chunk) ended cleanly: no error to the
// reader or in the report. (The read error was passed on.)
func TestDoneThenConnCut(t *testing.T) {
	body := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, bw, _ := w.(http.Hijacker).Hijack()
		defer conn.Close()
		bw.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		bw.WriteString(strconv.FormatInt(int64(len(body)), 16) + "\r\n" + body + "\r\n") // no last-chunk
		bw.Flush()
	}))
	defer srv.Close()
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL + "/v1"}}})
	_, err := stream(t, r, "chat/completions", chatStreamUsageReq)
	assert.NoError(t, err)
	assert.NoError(t, reps.all()[0].Err)
}

// TestIdleWhileBytesArrive: a stream whose event arrives a byte at
// a time, never silent for the idle timeout, is not cut as stalled, also
// when the router asked for the usage chunk itself (and so holds bytes
// back until an event ends, inside one Read). The bytes go through a pipe
// whose writes return once read, and the clock moves 100 ms a byte.
func TestIdleWhileBytesArrive(t *testing.T) {
	for _, req := range []string{chatStreamUsageReq, chatStreamReq} {
		clock := newFakeClock()
		pr, pw := io.Pipe()
		base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			io.Copy(io.Discard, r.Body)
			return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: pr, Request: r}, nil
		})
		r, _ := newTestRouter(t, Config{Base: base, Clock: clock, Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.invalid/v1"}},
			Stream: StreamConfig{IdleTimeout: 300 * time.Millisecond}})
		go func() {
			io.WriteString(pw, `data: {"choices":[{"index":0,"delta":{"content":"`)
			for range 12 {
				if _, err := io.WriteString(pw, "x"); err != nil {
					return // the stream was cut: the test fails below
				}
				clock.Advance(100 * time.Millisecond)
			}
			io.WriteString(pw, "\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
			pw.Close()
		}()
		_, err := stream(t, r, "chat/completions", req)
		assert.NoError(t, err, req)
	}
}

// TestUnterminatedUsageChunk: the usage chunk the router asked for,
// cut off by the upstream without its final newline, is still removed:
// the caller reads the stream it asked for, and the report has the usage.
// (It reached the caller.)
func TestUnterminatedUsageChunk(t *testing.T) {
	fin := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":\"stop\"}]}\n\n"
	r, reps := bodyRouter(t, Config{}, func() io.Reader {
		return strings.NewReader(fin + `data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}`)
	})
	got, err := stream(t, r, "chat/completions", chatStreamReq)
	assert.NoError(t, err)
	assert.Equal(t, fin, string(got))
	assert.Equal(t, 2, reps.all()[0].Usage.CompletionTokens)
}
