package labelcache

import (
	"sync"
	"sync/atomic"
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

// TestGetWhileAdding: readers of kept keys get their values, and never
// build them again, while a writer adds other keys (under -race, a map
// changed while it is read fails here).
func TestGetWhileAdding(t *testing.T) {
	var c Cache[struct{}, int, int]
	var rebuilt atomic.Int64
	build := func(_ struct{}, k int) int { return 2 * k }
	for k := range 10 {
		c.Get(struct{}{}, k, build)
	}
	kept := func(_ struct{}, k int) int { rebuilt.Add(1); return -1 }
	var wg sync.WaitGroup
	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				k := (i + r) % 10
				if v := c.Get(struct{}{}, k, kept); v != 2*k {
					t.Errorf("key %d: %d", k, v)
					return
				}
			}
		}()
	}
	for k := 10; k < 500; k++ {
		c.Get(struct{}{}, k, build)
	}
	wg.Wait()
	assert.Zero(t, rebuilt.Load(), "a kept key was built again")
	assert.Equal(t, 998, c.Get(struct{}{}, 499, kept))
}
