package relayotel

import (
	"context"
	"math"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// sums keeps the totals of an observable counter by attribute set and
// reports them at each collection. Adding to a total is an atomic add
// instead of an SDK Add, which normalizes and looks up the call's
// attribute set each time (about 2.5K instructions for each of
// relay.client.cost and relay.client.attempts per call). The totals are
// cumulative, as a synchronous counter's are; only the totals' exemplars
// are lost.
//
// Past maxCached attribute sets, further sets add to one set marked
// otel.metric.overflow, as the SDK's own cardinality limit does.
type sums struct {
	mu       sync.Mutex
	by       map[attribute.Distinct]*sum
	all      []*sum
	overflow *sum
}

// sum is one attribute set's total: float64 bits in f for a float
// counter, n for an int counter. used is set by the first add, so that a
// set built but never added to is not reported (as a synchronous counter
// would not report it).
type sum struct {
	opts []metric.ObserveOption
	f    atomic.Uint64
	n    atomic.Int64
	used atomic.Bool
}

// overflowSet is the attribute set of the totals past the cardinality
// bound.
var overflowSet = attribute.NewSet(attribute.Bool("otel.metric.overflow", true))

// get returns the total of set, made the first time.
func (s *sums) get(set attribute.Set) *sum {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.by[set.Equivalent()]; ok {
		return v
	}
	if len(s.by) >= maxCached {
		if s.overflow == nil {
			s.overflow = &sum{opts: []metric.ObserveOption{metric.WithAttributeSet(overflowSet)}}
			s.all = append(s.all, s.overflow)
		}
		return s.overflow
	}
	if s.by == nil {
		s.by = map[attribute.Distinct]*sum{}
	}
	v := &sum{opts: []metric.ObserveOption{metric.WithAttributeSet(set)}}
	s.by[set.Equivalent()] = v
	s.all = append(s.all, v)
	return v
}

// addFloat adds v to a float total.
func (t *sum) addFloat(v float64) {
	for {
		old := t.f.Load()
		if t.f.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			break
		}
	}
	t.use()
}

// addInt adds v to an int total.
func (t *sum) addInt(v int64) {
	t.n.Add(v)
	t.use()
}

// use marks the total added to. It is stored once: a store of an atomic
// is an exchange, a full barrier each time, where a load costs a plain
// read.
func (t *sum) use() {
	if !t.used.Load() {
		t.used.Store(true)
	}
}

// each calls f with every total added to.
func (s *sums) each(f func(*sum)) {
	s.mu.Lock()
	all := s.all
	s.mu.Unlock()
	for _, t := range all {
		if t.used.Load() {
			f(t)
		}
	}
}

// observeSums is the callback that reports the cost and attempt totals.
func observeSums(cost metric.Float64ObservableCounter, costs *sums, attempts metric.Int64ObservableCounter, attemptSums *sums) metric.Callback {
	return func(_ context.Context, o metric.Observer) error {
		costs.each(func(t *sum) { o.ObserveFloat64(cost, math.Float64frombits(t.f.Load()), t.opts...) })
		attemptSums.each(func(t *sum) { o.ObserveInt64(attempts, t.n.Load(), t.opts...) })
		return nil
	}
}
