package errclass

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"

	"github.com/tokenrelay/relay"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type timeout struct{}

func (timeout) Error() string { return "i/o timeout" }
func (timeout) Timeout() bool { return true }

// TestErrorType: error.type names the router's errors, an error status by
// its code, and transport errors by kind.
func TestErrorType(t *testing.T) {
	wrap := func(err error) error { return &relay.Error{Op: "send", Upstream: "a", Err: err} }
	cases := []struct {
		err    error
		status int
		want   string
	}{
		{nil, 200, ""},
		{wrap(relay.ErrUpstreamStatus), 503, "503"},
		{wrap(relay.ErrUpstreamStatus), 429, "429"},
		{wrap(relay.ErrStreamError), 200, "stream_error"},
		{wrap(relay.ErrStreamMalformed), 200, "stream_malformed"},
		{wrap(relay.ErrNoUpstream), 0, "no_upstream"},
		{wrap(relay.ErrBodyTooLarge), 0, "body_too_large"},
		{wrap(relay.ErrRateLimited), 0, "rate_limited"},
		{wrap(relay.ErrCircuitOpen), 0, "circuit_open"},
		{wrap(relay.ErrFirstTokenTimeout), 0, "first_token_timeout"},
		{wrap(relay.ErrStreamStalled), 200, "stream_stalled"},
		{wrap(relay.ErrAttemptTimeout), 0, "attempt_timeout"},
		{wrap(context.Canceled), 0, "canceled"},
		{wrap(context.DeadlineExceeded), 0, "deadline_exceeded"},
		{wrap(timeout{}), 0, "timeout"},
		{wrap(&net.OpError{Op: "dial", Err: errors.New("connection refused")}), 0, "connection"},
		{wrap(io.EOF), 0, "connection"},
		{wrap(fmt.Errorf("read: %w", io.ErrUnexpectedEOF)), 200, "connection"},
		{wrap(errors.New("odd")), 0, "_OTHER"},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, Type(c.err, c.status), "%v", c.err)
	}
}

// TestOutcome: an attempt's outcome is its status class, 429 apart, or its
// error's kind.
func TestOutcome(t *testing.T) {
	for status, want := range map[int]string{0: "1xx", 101: "1xx", 200: "2xx", 204: "2xx", 301: "3xx", 400: "4xx", 404: "4xx", 429: "429", 500: "5xx", 503: "5xx"} {
		assert.Equal(t, want, Outcome(status, nil), "%d", status)
	}
	assert.Equal(t, "attempt_timeout", Outcome(0, relay.ErrAttemptTimeout))
	assert.Equal(t, "canceled", Outcome(0, context.Canceled))
}

// TestStatusClass: a status's class, 429 among the 4xx; none below 100.
func TestStatusClass(t *testing.T) {
	for status, want := range map[int]string{0: "", 99: "", 100: "1xx", 200: "2xx", 302: "3xx", 429: "4xx", 499: "4xx", 500: "5xx", 599: "5xx"} {
		assert.Equal(t, want, StatusClass(status), "%d", status)
	}
}

func TestStatus(t *testing.T) {
	assert.Equal(t, "404", Status(404))
	assert.Equal(t, "99", Status(99))
	assert.Equal(t, "600", Status(600))
}
