package relayprom

// The classification of outcomes and errors is relayotel's, so that both
// integrations name the same facts the same way.

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"

	"github.com/tokenrelay/relay"
)

// statusTexts are the status codes as strings, for error types.
var statusTexts = func() (t [600]string) {
	for i := 100; i < len(t); i++ {
		t[i] = strconv.Itoa(i)
	}
	return t
}()

func statusText(code int) string {
	if code >= 100 && code < len(statusTexts) {
		return statusTexts[code]
	}
	return strconv.Itoa(code)
}

// outcomeOf classifies an upstream call: a status class, with 429 apart, or
// the kind of its error.
func outcomeOf(status int, err error) string {
	switch {
	case err != nil:
		return errorKind(err)
	case status == 429:
		return "429"
	case status >= 500:
		return "5xx"
	case status >= 400:
		return "4xx"
	case status >= 300:
		return "3xx"
	case status >= 200:
		return "2xx"
	}
	return "1xx"
}

// sentinels are the router's errors that name their own error type.
var sentinels = []struct {
	err  error
	name string
}{
	{relay.ErrStreamError, "stream_error"},
	{relay.ErrNoUpstream, "no_upstream"},
	{relay.ErrBodyTooLarge, "body_too_large"},
	{relay.ErrRateLimited, "rate_limited"},
	{relay.ErrCircuitOpen, "circuit_open"},
	{relay.ErrFirstTokenTimeout, "first_token_timeout"},
	{relay.ErrStreamStalled, "stream_stalled"},
}

// errorType is the type of a call's error: "" when it succeeded.
func errorType(err error, status int) string {
	if err == nil {
		return ""
	}
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			return s.name
		}
	}
	if status >= 400 {
		return statusText(status)
	}
	return errorKind(err)
}

// errorKind names a transport error.
func errorKind(err error) string {
	switch {
	case errors.Is(err, relay.ErrAttemptTimeout):
		return "attempt_timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded"
	}
	var t interface{ Timeout() bool }
	if errors.As(err, &t) && t.Timeout() {
		return "timeout"
	}
	var op *net.OpError
	if errors.As(err, &op) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return "connection"
	}
	return "_OTHER"
}
