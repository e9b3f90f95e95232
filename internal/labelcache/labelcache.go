// Package labelcache keeps what the observer sub-modules (relayotel,
// relayprom) build once per combination of label values: attribute sets,
// metric children. Recording a call then looks its values up instead of
// building them.
package labelcache

import "sync"

// Max is how many combinations a Cache keeps. Label values the caller does
// not bound (requested model names) would otherwise grow it without end;
// past Max, values are built for each call and not kept.
const Max = 4096

// Cache maps keys to values built once, by build, with the context c of
// the observer that owns it. It is safe for concurrent use; its zero value
// is ready.
type Cache[C any, K comparable, V any] struct {
	mu sync.RWMutex
	m  map[K]V
}

// Get returns the value of k, building it with build(c, k) the first time.
// When two callers build it at once, both get the one kept first.
func (ch *Cache[C, K, V]) Get(c C, k K, build func(C, K) V) V {
	ch.mu.RLock()
	v, ok := ch.m[k]
	ch.mu.RUnlock()
	if ok {
		return v
	}
	v = build(c, k)
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if old, ok := ch.m[k]; ok {
		return old
	}
	if len(ch.m) < Max {
		if ch.m == nil {
			ch.m = map[K]V{}
		}
		ch.m[k] = v
	}
	return v
}
