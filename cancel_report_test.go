package relay

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCancelledAfterHeadersIsReported: a caller that cancels its request
// once the headers are in and closes the body without reading it to its
// end (openai-go does this when its context ends) gets a report of a
// cancelled request, not of a success. A caller that read the whole answer
// before cancelling, or that closes the body unread without cancelling,
// is reported as before. (Before, the cancelled ones were reported with no
// error.)
func TestCancelledAfterHeadersIsReported(t *testing.T) {
	plain := fixture(t, "chat_response_default.json")
	sse := fixture(t, "chat_stream_recorded_gpt4o_text_usage.sse")
	for _, c := range []struct {
		name, path, req string
		body            []byte
		contentType     string
		chunked         bool // no Content-Length
	}{
		{name: "plain", path: "/v1/chat/completions", req: chatBody("gpt-4o", "Hi"), body: plain, contentType: "application/json"},
		{name: "plain, chunked", path: "/v1/chat/completions", req: chatBody("gpt-4o", "Hi"), body: plain, contentType: "application/json", chunked: true},
		{name: "stream", path: "/v1/chat/completions", req: chatStreamUsageReq, body: sse, contentType: "text/event-stream"},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := newRecorder(t, 200, c.body)
			up.header = http.Header{"Content-Type": {c.contentType}}
			if c.chunked {
				up.header.Set("Transfer-Encoding", "chunked")
			}
			r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL + "/v1"}}})
			for _, how := range []struct {
				name      string
				read      func(io.Reader) // what the caller reads before it cancels
				cancel    bool
				cancelled bool // the report says cancelled
			}{
				{name: "cancelled, closed unread", read: func(io.Reader) {}, cancel: true, cancelled: true},
				{name: "cancelled, closed half read", read: func(b io.Reader) { io.ReadFull(b, make([]byte, len(c.body)/2)) }, cancel: true, cancelled: true},
				{name: "read to EOF, then cancelled", read: func(b io.Reader) { io.ReadAll(b) }, cancel: true},
				{name: "closed unread, not cancelled", read: func(io.Reader) {}},
			} {
				n := len(reps.all())
				ctx, cancel := context.WithCancel(context.Background())
				req, err := http.NewRequestWithContext(ctx, "POST", up.URL+c.path, strings.NewReader(c.req))
				require.NoError(t, err)
				resp, err := r.RoundTrip(req)
				require.NoError(t, err, how.name)
				how.read(resp.Body)
				if how.cancel {
					cancel()
				}
				resp.Body.Close()
				cancel()
				reps := reps.all()
				require.Len(t, reps, n+1, how.name)
				rep := reps[n]
				assert.Equal(t, 200, rep.StatusCode, how.name)
				if how.cancelled {
					assert.ErrorIs(t, rep.Err, context.Canceled, how.name)
					var e *Error
					if assert.ErrorAs(t, rep.Err, &e, how.name) {
						assert.Equal(t, 200, e.StatusCode, how.name)
						assert.Equal(t, "a", e.Upstream, how.name)
					}
				} else {
					assert.NoError(t, rep.Err, how.name)
				}
			}
		})
	}
}

// TestCancelledAfterAJSONDecoderIsNotAFailure: go-openai decodes the answer
// with a json.Decoder, which stops at the value's end without reading EOF;
// a cancel after it has the whole value is not a cancelled request.
func TestCancelledAfterAJSONDecoderIsNotAFailure(t *testing.T) {
	for _, chunked := range []bool{false, true} {
		up := newRecorder(t, 200, fixture(t, "chat_response_default.json"))
		if chunked {
			up.header.Set("Transfer-Encoding", "chunked")
		}
		r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL + "/v1"}}})
		ctx, cancel := context.WithCancel(context.Background())
		req, err := http.NewRequestWithContext(ctx, "POST", up.URL+"/v1/chat/completions", strings.NewReader(chatBody("gpt-4o", "Hi")))
		require.NoError(t, err)
		resp, err := r.RoundTrip(req)
		require.NoError(t, err)
		var v map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&v))
		cancel()
		resp.Body.Close()
		require.Len(t, reps.all(), 1)
		assert.NoError(t, reps.all()[0].Err, "chunked %v", chunked)
		assert.False(t, reps.all()[0].Usage.Estimated, "chunked %v", chunked)
	}
}
