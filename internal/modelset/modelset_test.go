package modelset

import (
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestBound: given models are known; others are learned when the call
// vouches for them, up to the limit; "" never is.
func TestBound(t *testing.T) {
	var m Set
	assert.False(t, m.Bound("gpt-4.1", true), "the zero Set learns nothing")
	m.Init([]string{"gpt-4.1", ""}, 1)
	assert.False(t, m.Bound("", true))
	assert.True(t, m.Bound("gpt-4.1", false))
	assert.False(t, m.Bound("mini", false))
	assert.True(t, m.Bound("mini", true))
	assert.True(t, m.Bound("mini", false), "kept")
	assert.False(t, m.Bound("nano", true), "past the limit")
	assert.Equal(t, 2, m.Len())
}

// TestModelsLearnConcurrent: names learned from many goroutines at once
// stop at the limit, and every caller of a name learned gets it.
func TestModelsLearnConcurrent(t *testing.T) {
	var m Set
	const limit = 5
	m.Init(nil, limit)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		learned = map[string]bool{}
	)
	for g := range 8 {
		wg.Go(func() {
			for i := range 20 {
				name := strconv.Itoa((g + i) % 10)
				if m.Bound(name, true) {
					mu.Lock()
					learned[name] = true
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	assert.Len(t, learned, limit)
	assert.Equal(t, limit, m.Len())
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
		assert.Equal(t, c.want, Vouched(c.attempts, c.status), "%+v", c)
	}
}
