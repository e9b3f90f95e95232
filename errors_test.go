package relay

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestErrorMessages(t *testing.T) {
	e := &Error{Op: "send", Upstream: "eu", Model: "gpt-4.1", StatusCode: 429, Err: ErrUpstreamStatus}
	assert.Equal(t, "relay: send upstream eu model gpt-4.1 status 429: upstream answered with an error status", e.Error())
	assert.True(t, errors.Is(e, ErrUpstreamStatus))
}
