package relayotel

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/tokenrelay/relay"
)

// TestModelsBound: named models are themselves; others are learned when
// the call vouches for them, up to the limit, and "_OTHER" past it or
// unvouched; no model stays "".
func TestModelsBound(t *testing.T) {
	var m models
	m.init([]string{"gpt-4.1", ""}, 1)
	assert.Equal(t, "", m.bound("", true))
	assert.Equal(t, "gpt-4.1", m.bound("gpt-4.1", false))
	assert.Equal(t, otherModel, m.bound("mini", false))
	assert.Equal(t, "mini", m.bound("mini", true))
	assert.Equal(t, "mini", m.bound("mini", false), "kept")
	assert.Equal(t, otherModel, m.bound("nano", true), "past the limit")

	m.init(nil, -1)
	assert.Equal(t, otherModel, m.bound("gpt-4.1", true), "a negative limit learns none")
}

// TestVouched: the Observer learns from the calls modelset.Vouched
// accepts.
func TestVouched(t *testing.T) {
	assert.True(t, vouched(&relay.Report{Attempts: 1, StatusCode: 200}))
	assert.False(t, vouched(&relay.Report{Attempts: 1, StatusCode: 404}))
}
