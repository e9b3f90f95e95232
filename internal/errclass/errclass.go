// Package errclass names what happened to a call the same way in every
// integration (relayotel's error.type, relayprom's labels): an attempt's
// outcome (a status class, or its error's kind) and a call's error type
// (the router's sentinel, an error status, or a transport error's kind).
package errclass

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

// Status is code as a string.
func Status(code int) string {
	if code >= 100 && code < len(statusTexts) {
		return statusTexts[code]
	}
	return strconv.Itoa(code)
}

// Outcome classifies an upstream call: a status class, with 429 apart, or
// the kind of its error.
func Outcome(status int, err error) string {
	switch {
	case err != nil:
		return Kind(err)
	case status == 429:
		return "429"
	case status < 100:
		return "1xx"
	}
	return StatusClass(status)
}

// StatusClass is the class of an HTTP status: "2xx" … "5xx", "1xx"; "" below
// 100 (no response).
func StatusClass(code int) string {
	switch {
	case code >= 500:
		return "5xx"
	case code >= 400:
		return "4xx"
	case code >= 300:
		return "3xx"
	case code >= 200:
		return "2xx"
	case code >= 100:
		return "1xx"
	}
	return ""
}

// sentinels are the router's errors that name their own error type.
var sentinels = []struct {
	err  error
	name string
}{
	{relay.ErrStreamError, "stream_error"},
	{relay.ErrStreamMalformed, "stream_malformed"},
	{relay.ErrNoUpstream, "no_upstream"},
	{relay.ErrBodyTooLarge, "body_too_large"},
	{relay.ErrRateLimited, "rate_limited"},
	{relay.ErrCircuitOpen, "circuit_open"},
	{relay.ErrFirstTokenTimeout, "first_token_timeout"},
	{relay.ErrStreamStalled, "stream_stalled"},
	{relay.ErrBudgetExceeded, "budget_exceeded"},
	{relay.ErrContextWindow, "context_window"},
	{relay.ErrNoTaggedUpstream, "no_tagged_upstream"},
}

// Type is the type of a call's error: "" when it succeeded.
func Type(err error, status int) string {
	if err == nil {
		return ""
	}
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			return s.name
		}
	}
	if status >= 400 {
		return Status(status)
	}
	return Kind(err)
}

// Kind names a transport error.
func Kind(err error) string {
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			return s.name
		}
	}
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
