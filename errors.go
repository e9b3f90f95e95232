package relay

import (
	"errors"
	"fmt"
	"strings"
)

// Errors callers may branch on with errors.Is. Every error the router returns
// or reports is an *Error wrapping one of these (or a context or transport
// error), with a message prefixed "relay: ". No error ever contains an API
// key.
var (
	// ErrNoUpstream: no configured upstream serves the requested model.
	ErrNoUpstream = errors.New("relay: no upstream serves the model")
	// ErrBodyTooLarge: the request body exceeds Config.MaxBodyBytes; no
	// upstream was called.
	ErrBodyTooLarge = errors.New("relay: request body too large")
	// ErrRateLimited: every candidate upstream's limiter refused the request
	// within Config.Limits.MaxWait; no upstream was called.
	ErrRateLimited = errors.New("relay: rate limited by every upstream")
	// ErrCircuitOpen: every candidate's circuit opened while the request was
	// being routed, and no response was obtained.
	ErrCircuitOpen = errors.New("relay: every candidate's circuit is open")
	// ErrAttemptTimeout: an attempt got no response headers within
	// RetryConfig.AttemptTimeout. It is retried like a connection error.
	ErrAttemptTimeout = errors.New("relay: no response headers within the attempt timeout")
	// ErrFirstTokenTimeout: a stream sent no content within
	// StreamConfig.FirstTokenTimeout; the router tried the next candidate.
	ErrFirstTokenTimeout = errors.New("relay: no first token within the first-token timeout")
	// ErrStreamStalled: a stream sent no byte for the idle timeout.
	ErrStreamStalled = errors.New("relay: stream stalled")
	// ErrStreamError: a 200 stream carried an error event (`data:
	// {"error":...}` in chat and completions streams; an `error` or
	// `response.failed` event in Responses streams). It appears only in
	// Report.Err: the caller reads the event's bytes as the upstream sent
	// them.
	ErrStreamError = errors.New("relay: upstream sent an error in the stream")
	// ErrUpstreamStatus: the final response had a status of 400 or more.
	// The response itself is still returned to the caller with err == nil;
	// this error only appears in Report.Err.
	ErrUpstreamStatus = errors.New("relay: upstream answered with an error status")
)

// Error describes a failed request. It wraps the cause (a sentinel above, a
// context error or a transport error).
type Error struct {
	Op         string // what failed, e.g. "read body", "send", "route"
	Upstream   string // upstream name, when one was involved
	Model      string // model sent, when known
	StatusCode int    // upstream status, when one came
	Err        error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("relay: ")
	b.WriteString(e.Op)
	if e.Upstream != "" {
		b.WriteString(" upstream ")
		b.WriteString(e.Upstream)
	}
	if e.Model != "" {
		b.WriteString(" model ")
		b.WriteString(e.Model)
	}
	if e.StatusCode != 0 {
		fmt.Fprintf(&b, " status %d", e.StatusCode)
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(strings.TrimPrefix(e.Err.Error(), "relay: "))
	}
	return b.String()
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }
