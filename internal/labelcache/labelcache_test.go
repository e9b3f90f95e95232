package labelcache

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestGetBuildsOnce: a key's value is built once and kept; concurrent
// callers all get the value kept.
func TestGetBuildsOnce(t *testing.T) {
	var c Cache[*int, string, *string]
	builds := 0
	var mu sync.Mutex
	build := func(n *int, k string) *string {
		mu.Lock()
		builds++
		*n++
		mu.Unlock()
		v := k + "!"
		return &v
	}
	var ctx int
	first := c.Get(&ctx, "a", build)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			assert.Same(t, first, c.Get(&ctx, "a", build))
		}()
	}
	wg.Wait()
	assert.Equal(t, 1, builds)
	assert.Equal(t, "a!", *first)
}

// TestGetBounded: past Max keys, values are built for each call and not
// kept.
func TestGetBounded(t *testing.T) {
	var c Cache[struct{}, int, int]
	builds := 0
	build := func(_ struct{}, k int) int { builds++; return 2 * k }
	for k := range Max {
		c.Get(struct{}{}, k, build)
	}
	assert.Equal(t, Max, builds)
	assert.Equal(t, 2*Max, c.Get(struct{}{}, Max, build))
	assert.Equal(t, 2*Max, c.Get(struct{}{}, Max, build))
	assert.Equal(t, Max+2, builds, "the key past Max is built each time")
	assert.Equal(t, 0, c.Get(struct{}{}, 0, build))
	assert.Equal(t, Max+2, builds, "a kept key is not built again")
}
