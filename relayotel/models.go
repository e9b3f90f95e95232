package relayotel

import (
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tokenrelay/relay"
)

// otherModel is the gen_ai.request.model and gen_ai.response.model the
// metrics record for a model the Observer does not know: the value the
// conventions give an attribute outside its known set (error.type,
// http.request.method).
const otherModel = "_OTHER"

// defaultModelLimit is how many model names an Observer learns unless
// WithModelLimit says otherwise. With a few upstreams and error types per
// model, it keeps the GenAI metrics well under the SDK's default
// cardinality limit (2,000 attribute sets per instrument).
const defaultModelLimit = 32

// models is the set of model names the metrics record as themselves: those
// given to New, and those learned from calls, up to a limit; any other
// name is recorded as otherModel. The set is an immutable map, replaced
// whole when a name is learned (at most limit times), so that looking a
// name up takes no lock.
type models struct {
	known atomic.Pointer[map[string]struct{}]
	left  atomic.Int64 // how many more names may be learned
	mu    sync.Mutex   // held to learn a name
}

func (m *models) init(names []string, limit int) {
	known := make(map[string]struct{}, len(names))
	for _, n := range names {
		if n != "" {
			known[n] = struct{}{}
		}
	}
	m.known.Store(&known)
	m.left.Store(int64(max(limit, 0)))
}

// bound returns the name the metrics record for model: model itself when
// it is known or learned now (learn: the call says the model is real),
// otherModel when it is not, "" when there is none.
func (m *models) bound(model string, learn bool) string {
	if model == "" {
		return ""
	}
	if _, ok := (*m.known.Load())[model]; ok {
		return model
	}
	if learn && m.left.Load() > 0 && m.learn(model) {
		return model
	}
	return otherModel
}

// learn adds model to the set, if there is room left.
func (m *models) learn(model string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	old := *m.known.Load()
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

// vouched reports whether r shows its models to be real, for the Observer
// to learn them: an upstream was called with them and did not refuse the
// call as a client error. A name no upstream serves (relay.ErrNoUpstream),
// or that the upstream does not know (404, 400), is not learned; nor is
// one of a call that never reached an upstream (refused by a budget, a
// limit, open circuits). A 429, a 5xx or no answer at all is not about the
// model: its name is learned.
func vouched(r *relay.Report) bool {
	return r.Attempts > 0 && (r.StatusCode < 400 || r.StatusCode >= 500 || r.StatusCode == 429)
}
