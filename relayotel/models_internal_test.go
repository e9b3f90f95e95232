package relayotel

import (
	"strconv"
	"sync"
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

// TestModelsLearnConcurrent: names learned from many goroutines at once
// stop at the limit, and every caller of a name learned gets it.
func TestModelsLearnConcurrent(t *testing.T) {
	var m models
	const limit = 5
	m.init(nil, limit)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		learned = map[string]bool{}
	)
	for g := range 8 {
		wg.Go(func() {
			for i := range 20 {
				name := strconv.Itoa((g + i) % 10)
				if got := m.bound(name, true); got != otherModel {
					assert.Equal(t, name, got)
					mu.Lock()
					learned[name] = true
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	assert.Len(t, learned, limit)
	assert.Len(t, *m.known.Load(), limit)
}

// TestVouched: a call vouches for its models when an upstream was called
// and did not refuse it as a client error.
func TestVouched(t *testing.T) {
	for _, c := range []struct {
		attempts, status int
		want             bool
	}{
		{1, 200, true},
		{1, 0, true}, // no answer (a connection error, a timeout)
		{2, 503, true},
		{1, 429, true},
		{1, 404, false},
		{1, 400, false},
		{1, 401, false},
		{0, 0, false}, // no upstream called: no upstream serves it, a budget refused it...
	} {
		assert.Equal(t, c.want, vouched(&relay.Report{Attempts: c.attempts, StatusCode: c.status}), "%+v", c)
	}
}
