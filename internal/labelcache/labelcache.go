// Package labelcache keeps what the observer sub-modules (relayotel,
// relayprom) build once per combination of label values: attribute sets,
// metric children. Recording a call then looks its values up instead of
// building them.
package labelcache

import (
	"maps"
	"sync"
	"sync/atomic"
)

// Max is how many combinations a Cache keeps. Label values the caller does
// not bound (requested model names) would otherwise grow it without end;
// past Max, values are built for each call and not kept.
const Max = 4096

// Cache maps keys to values built once, by build, with the context c of
// the observer that owns it. It is safe for concurrent use; its zero value
// is ready.
//
// Every recorded call reads it, and few calls add to it (a new label
// combination), so reads take no lock: the map is read through an atomic
// pointer and never changed once published; a writer, under mu, publishes
// a copy with its key added. That costs a copy of the map per combination
// (at most Max²/2 entries copied over a Cache's life, once), where a
// read-write lock costs every read two atomic read-modify-writes on a
// cache line that all readers share.
type Cache[C any, K comparable, V any] struct {
	mu sync.Mutex // held by writers
	m  atomic.Pointer[map[K]V]
}

// Get returns the value of k, building it with build(c, k) the first time.
// When two callers build it at once, both get the one kept first.
func (ch *Cache[C, K, V]) Get(c C, k K, build func(C, K) V) V {
	if m := ch.m.Load(); m != nil {
		if v, ok := (*m)[k]; ok {
			return v
		}
	}
	v := build(c, k)
	ch.mu.Lock()
	defer ch.mu.Unlock()
	old := ch.m.Load()
	var n int
	if old != nil {
		if kept, ok := (*old)[k]; ok {
			return kept
		}
		n = len(*old)
	}
	if n >= Max {
		return v
	}
	m := make(map[K]V, n+1)
	if old != nil {
		maps.Copy(m, *old)
	}
	m[k] = v
	ch.m.Store(&m)
	return v
}
