// Package modelset bounds the model names that label metrics: the names
// given, and up to a limit more learned from calls that show them to be
// real. relayotel and relayprom share it, so that both record the same
// models by default.
package modelset

import (
	"strings"
	"sync"
	"sync/atomic"
)

// DefaultLimit is how many model names a Set learns unless told otherwise.
// With a few upstreams and error types per model, it keeps a metric's
// label sets in the hundreds (OpenTelemetry's SDK caps an instrument at
// 2,000 by default).
const DefaultLimit = 32

// Set is the model names metrics record as themselves: those given to
// Init, and those learned from calls, up to a limit. The names are an
// immutable map, replaced whole when a name is learned (at most limit
// times), so that looking a name up takes no lock. The zero Set knows no
// name and learns none; it is safe for concurrent use once Init returned.
type Set struct {
	known atomic.Pointer[map[string]struct{}]
	left  atomic.Int64 // how many more names may be learned
	mu    sync.Mutex   // held to learn a name
}

// Init sets the names known from the start and how many more may be
// learned (a negative limit learns none).
func (m *Set) Init(names []string, limit int) {
	known := make(map[string]struct{}, len(names))
	for _, n := range names {
		if n != "" {
			known[n] = struct{}{}
		}
	}
	m.known.Store(&known)
	m.left.Store(int64(max(limit, 0)))
}

// Bound reports whether model is one the metrics record as itself: known,
// or learned now (learn: the call shows the model to be real, see
// Vouched) while there is room left. "" is never known.
func (m *Set) Bound(model string, learn bool) bool {
	if model == "" {
		return false
	}
	if k := m.known.Load(); k != nil {
		if _, ok := (*k)[model]; ok {
			return true
		}
	}
	return learn && m.left.Load() > 0 && m.learn(model)
}

// Len returns the number of names known, learned ones included.
func (m *Set) Len() int {
	if k := m.known.Load(); k != nil {
		return len(*k)
	}
	return 0
}

// learn adds model to the set, if there is room left.
func (m *Set) learn(model string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	var old map[string]struct{}
	if k := m.known.Load(); k != nil {
		old = *k
	}
	if _, ok := old[model]; ok {
		return true
	}
	if m.left.Load() <= 0 {
		return false
	}
	known := make(map[string]struct{}, len(old)+1)
	for n := range old {
		known[n] = struct{}{}
	}
	known[strings.Clone(model)] = struct{}{} // not a part of a request's body, kept
	m.known.Store(&known)
	m.left.Add(-1)
	return true
}

// Vouched reports whether a call shows its models to be real, for a Set
// to learn them: an upstream was called (attempts > 0) and did not refuse
// the call as a client error. A name no upstream serves, or that the
// upstream does not know (404, 400), is not learned; nor is one of a call
// that never reached an upstream (refused by a budget, a limit, open
// circuits). A 429, a 5xx or no answer at all is not about the model: its
// name is learned.
func Vouched(attempts, status int) bool {
	return attempts > 0 && (status < 400 || status >= 500 || status == 429)
}
