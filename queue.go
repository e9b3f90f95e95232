package relay

import (
	"cmp"
	"container/heap"
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokenrelay/relay/store"
)

// Requests that wait for an upstream's limits or for one of its in-flight
// slots wait in queues ordered by priority, highest first, then by
// arrival. Nothing runs in the background: a timer (Clock.AfterFunc) wakes
// a waiter when its turn is due, and requests arriving, leaving or giving
// tokens back look at the queue too. A request that could not be served
// within its wait bound, behind the requests of higher priority, is shed
// at once (its error comes sooner, rather than at the end of a wait that
// cannot succeed): under pressure, the lowest priority goes first. Batch
// traffic uses all the headroom while nobody of higher priority waits.

// waiter is one request in a queue.
type waiter struct {
	prio     Priority
	seq      uint64
	tpm      int   // its TPM charge (turns)
	deadline int64 // Unix ns: shed when it could not be served by then (turns)
	tooLong  error // its error when shed
	// done is closed when a slot is given to it (slots); in turns, it is
	// signalled (capacity 1) each time the waiter must look again.
	done  chan struct{}
	err   error // slots: nil when served; turns: set when it must leave
	index int   // in the heap; -1 once out
}

// waiters is a heap of waiters, highest priority first, then first come.
type waiters []*waiter

func (h waiters) Len() int { return len(h) }
func (h waiters) Less(i, j int) bool {
	if h[i].prio != h[j].prio {
		return h[i].prio > h[j].prio
	}
	return h[i].seq < h[j].seq
}
func (h waiters) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *waiters) Push(x any) {
	w := x.(*waiter)
	w.index = len(*h)
	*h = append(*h, w)
}
func (h *waiters) Pop() any {
	old := *h
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	w.index = -1
	return w
}

// queue is the heap, its lock and its timer.
type queue struct {
	n     atomic.Int32 // len(h), read without the lock
	mu    sync.Mutex
	h     waiters
	seq   uint64
	armed time.Time   // when the timer fires; zero when none is set
	stop  func() bool // stops it
}

// ahead reports whether a request of priority p must queue behind
// waiters: one of them has at least its priority.
func (q *queue) ahead(p Priority) bool {
	return len(q.h) > 0 && q.h[0].prio >= p
}

// push queues w; q.mu is held.
func (q *queue) push(w *waiter) {
	q.seq++
	w.seq = q.seq
	w.done = make(chan struct{})
	heap.Push(&q.h, w)
	q.n.Store(int32(len(q.h)))
}

// finish takes w out of the queue with err; q.mu is held.
func (q *queue) finish(w *waiter, err error) {
	if w.index >= 0 {
		heap.Remove(&q.h, w.index)
		q.n.Store(int32(len(q.h)))
	}
	w.err = err
	close(w.done)
}

// leave takes a waiter whose caller gave up out of the queue. It reports
// whether the waiter had been served meanwhile (its caller must then give
// back what it was given).
func (q *queue) leave(w *waiter) (served bool) {
	if w.index < 0 {
		return w.err == nil
	}
	heap.Remove(&q.h, w.index)
	q.n.Store(int32(len(q.h)))
	return false
}

// slots caps one upstream's in-flight requests; a released slot goes to the
// waiter with the highest priority.
type slots struct {
	queue
	used, cap int
}

// try takes a slot without waiting, unless it is taken or waiters of at
// least priority p are before it.
func (s *slots) try(p Priority) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.used >= s.cap || s.ahead(p) {
		return false
	}
	s.used++
	return true
}

// wait waits for a slot, at most d (then tooLong), or until ctx ends.
func (s *slots) wait(ctx context.Context, c Clock, p Priority, d time.Duration, tooLong error) error {
	w := &waiter{prio: p}
	s.mu.Lock()
	if s.used < s.cap && !s.ahead(p) {
		s.used++
		s.mu.Unlock()
		return nil
	}
	s.push(w)
	s.mu.Unlock()
	timeout := make(chan struct{})
	stop := c.AfterFunc(d, func() { close(timeout) })
	defer stop()
	var err error
	select {
	case <-w.done:
		return nil
	case <-timeout:
		err = tooLong
	case <-ctx.Done():
		err = ctx.Err()
	}
	s.mu.Lock()
	served := s.leave(w)
	s.mu.Unlock()
	if served {
		s.release()
	}
	return err
}

// inUse returns the slots taken.
func (s *slots) inUse() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used
}

// release gives a slot back: to the first waiter, if any, unless more
// slots are taken than the cap allows (it was lowered).
func (s *slots) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.h) > 0 && s.used <= s.cap {
		s.finish(s.h[0], nil) // the slot passes on
		return
	}
	s.used--
}

// resize sets the cap to n. The slots taken stay taken; when the cap grows,
// the waiters it makes room for are served at once.
func (s *slots) resize(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cap = n
	for len(s.h) > 0 && s.used < s.cap {
		s.used++
		s.finish(s.h[0], nil)
	}
}

// turns orders this process's requests that wait for one upstream's
// limits: highest priority first, then first come. Only the head asks the
// store, once per verdict: it sleeps until the last verdict says its
// tokens are there, then asks; the others wait for their turn without a
// call, and a request that arrives while requests of at least its
// priority wait queues behind them instead of asking. From the last
// verdict on the upstream (the buckets' backlogs, the hold) the queue
// estimates when each waiter's turn comes, and sheds a waiter whose turn
// could not come before its deadline. Every verdict the store gives on
// the upstream, to a waiter or not, renews the estimate; a verdict that
// the circuit is open ends every wait; tokens given back wake the head,
// which then asks at once. Across replicas there is no order: each
// replica's head asks when its own estimate says so.
type turns struct {
	queue           // the waiters; its mutex guards the fields below
	est    estimate // the last verdict's
	stale  bool     // tokens were given back since it: the head asks at once
	asking *waiter  // the head while it asks: a verdict that took its tokens counts it already
}

// estimate is what the last verdict said of an upstream's limits.
type estimate struct {
	at               int64 // when it was given (Unix ns); 0: never
	next             int64 // the earliest the next request can be taken: the verdict's wait, if it took nothing
	hold             int64 // the hold's end
	requests, tokens int64 // the buckets' backlogs then (ns)
	rpm, tpm         int   // their limits (per minute; 0: none)
}

// due is when, by e, the buckets will have given requests more requests
// and tokens more tokens (Unix ns): GCRA's arrival time of the last of
// them, and never before the verdict's own wait.
func (e *estimate) due(requests, tokens int64) int64 {
	t := max(e.at, e.next, e.hold)
	if e.rpm > 0 {
		t = max(t, e.at+e.requests+interval(e.rpm, requests)-int64(time.Minute))
	}
	if e.tpm > 0 {
		t = max(t, e.at+e.tokens+interval(e.tpm, tokens)-int64(time.Minute))
	}
	return t
}

// interval is how long a bucket of limit a minute takes to give n tokens
// (ns).
func interval(limit int, n int64) int64 {
	return int64(float64(n) * float64(time.Minute) / float64(limit))
}

// behind reports whether a request of priority p charging tpm must queue
// behind the waiters (one has at least its priority), and, if so, how
// long until its turn would come (at least 1).
func (q *turns) behind(p Priority, tpm int, now time.Time) (time.Duration, bool) {
	if q.n.Load() == 0 {
		return 0, false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.ahead(p) {
		return 0, false
	}
	requests, tokens := int64(1), int64(tpm)
	for _, w := range q.h {
		if w.prio >= p {
			requests++
			tokens += int64(w.tpm)
		}
	}
	return max(time.Duration(q.est.due(requests, tokens)-now.UnixNano()), 1), true
}

// record keeps a verdict the store gave on the upstream's limits lim at
// now. Open ends every wait (errFleetOpened); else the waiters whose turn
// could no longer come before their deadlines are shed.
func (q *turns) record(v store.Verdict, lim *store.Limits, now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if v.Open {
		for len(q.h) > 0 {
			q.out(q.h[0], errFleetOpened)
		}
		return
	}
	q.est = estimate{at: now.UnixNano(), next: now.UnixNano() + int64(v.Wait), requests: int64(v.Requests), tokens: int64(v.Tokens), rpm: lim.RPM, tpm: lim.TPM}
	if !v.Until.IsZero() {
		q.est.hold = v.Until.UnixNano()
	}
	q.stale = false
	var served *waiter
	if v.Taken {
		served = q.asking
	}
	q.shedLocked(q.est.at, served)
}

// refunded tells the queue that tokens came back: the head asks at once.
func (q *turns) refunded() {
	if q.n.Load() == 0 {
		return
	}
	q.mu.Lock()
	q.stale = true
	q.signalHeadLocked()
	q.mu.Unlock()
}

// shedLocked estimates, in queue order, when each waiter's turn comes,
// and sheds those whose turn comes after now and after their deadline.
// served, when not nil, is a waiter the estimate counts as served. q.mu
// is held.
func (q *turns) shedLocked(now int64, served *waiter) {
	if len(q.h) == 0 || q.est.at == 0 {
		return
	}
	order := make(waiters, len(q.h))
	copy(order, q.h)
	slices.SortFunc(order, func(a, b *waiter) int {
		return cmp.Or(cmp.Compare(b.prio, a.prio), cmp.Compare(a.seq, b.seq))
	})
	var requests, tokens int64
	for _, w := range order {
		if w == served {
			continue
		}
		requests++
		tokens += int64(w.tpm)
		if due := q.est.due(requests, tokens); due > w.deadline && due > now {
			q.out(w, w.tooLong)
			requests--
			tokens -= int64(w.tpm)
		}
	}
	q.signalHeadLocked()
}

// out takes w out of the queue with err, and tells it. q.mu is held.
func (q *turns) out(w *waiter, err error) {
	heap.Remove(&q.h, w.index)
	q.n.Store(int32(len(q.h)))
	w.err = err
	signal(w.done)
}

// signal tells a waiter to look again.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// signalHeadLocked tells the head to look again. q.mu is held.
func (q *turns) signalHeadLocked() {
	if len(q.h) > 0 {
		signal(q.h[0].done)
	}
}

// wait queues w and waits for its turn: as the head, until its tokens are
// due by the last verdict (at once after tokens came back), then it asks
// (ask, which renews the estimate), and again after each verdict that
// they are not there, until ask took them (nil). It fails when w is shed
// or its turn would come after its deadline (w.tooLong), when the circuit
// opens (errFleetOpened, from ask or from another's verdict), or when ctx
// ends.
func (q *turns) wait(ctx context.Context, c Clock, w *waiter, ask func(now time.Time) (took bool, err error)) error {
	w.done = make(chan struct{}, 1)
	q.mu.Lock()
	q.seq++
	w.seq = q.seq
	heap.Push(&q.h, w)
	q.n.Store(int32(len(q.h)))
	q.shedLocked(c.Now().UnixNano(), nil)
	q.mu.Unlock()
	defer q.leave(w)
	var armed int64 // the due time the timer is set for
	var stop func() bool
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	for {
		at := c.Now()
		now := at.UnixNano()
		q.mu.Lock()
		err, head, due := w.err, len(q.h) > 0 && q.h[0] == w, now
		if head && !q.stale {
			due = q.est.due(1, int64(w.tpm))
		}
		q.mu.Unlock()
		switch {
		case err != nil:
			return err
		case head && due <= now: // (late, past its deadline too, it still asks: the tokens may be there)
			q.mu.Lock()
			q.asking = w
			q.mu.Unlock()
			took, err := ask(at)
			q.mu.Lock()
			q.asking = nil
			q.mu.Unlock()
			if took || err != nil {
				return err
			}
			continue
		case head && due > w.deadline:
			return w.tooLong
		case head && due != armed:
			if stop != nil {
				stop()
			}
			armed, stop = due, c.AfterFunc(time.Duration(due-now), func() { signal(w.done) })
		}
		select {
		case <-w.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// leave takes w out, if it is still in, and gives the next head its turn.
func (q *turns) leave(w *waiter) {
	q.mu.Lock()
	if w.index >= 0 {
		heap.Remove(&q.h, w.index)
		q.n.Store(int32(len(q.h)))
	}
	q.signalHeadLocked()
	q.mu.Unlock()
}
