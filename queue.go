package relay

import (
	"container/heap"
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Requests that wait for an upstream's limits wait in queues ordered by
// priority, highest first, then by arrival. Nothing runs in the background:
// one timer (Clock.AfterFunc) per queue wakes it when the head's tokens are
// due, and requests arriving, leaving or releasing a slot look at it too.
// A request that would not be served within its wait bound, behind the
// requests of higher priority, is shed at once (its error comes sooner,
// rather than at the end of a wait that cannot succeed): under pressure,
// the lowest priority goes first. Batch traffic uses all the headroom while
// nobody of higher priority waits.

// waiter is one request in a queue.
type waiter struct {
	prio     Priority
	seq      uint64
	tpm      int       // its TPM charge (rate queues)
	deadline time.Time // shed when it could not be served by then (rate queues)
	tooLong  error     // its error when shed
	done     chan struct{}
	err      error // set before done is closed: nil when served
	index    int   // in the heap; -1 once out
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

// arm sets the queue's timer to run pump after d, unless one fires sooner.
// It is called without q.mu held: a fake clock may run pump at once.
func (q *queue) arm(c Clock, d time.Duration, pump func()) {
	at := c.Now().Add(d)
	q.mu.Lock()
	if !q.armed.IsZero() && !q.armed.After(at) {
		q.mu.Unlock()
		return
	}
	if q.stop != nil {
		q.stop()
	}
	q.armed = at
	q.mu.Unlock()
	stop := c.AfterFunc(d, func() {
		q.mu.Lock()
		if q.armed.Equal(at) {
			q.armed, q.stop = time.Time{}, nil
		}
		q.mu.Unlock()
		pump()
	})
	q.mu.Lock()
	if q.armed.Equal(at) {
		q.stop = stop
	}
	q.mu.Unlock()
}

// waitRate queues a request for the upstream's RPM/TPM buckets and hold
// until its tokens are taken for it, it is shed (w.tooLong), or ctx ends.
func (l *limiter) waitRate(ctx context.Context, c Clock, w *waiter) error {
	q := &l.rq
	q.mu.Lock()
	q.push(w)
	d, arm := l.dispatchLocked(c.Now())
	q.mu.Unlock()
	if arm {
		q.arm(c, d, func() { l.pump(c) })
	}
	select {
	case <-w.done:
		return w.err
	case <-ctx.Done():
	}
	q.mu.Lock()
	if q.leave(w) { // served as ctx ended: its tokens go back, to the next
		l.refund(c.Now(), w.tpm)
	}
	d, arm = l.dispatchLocked(c.Now())
	q.mu.Unlock()
	if arm {
		q.arm(c, d, func() { l.pump(c) })
	}
	return ctx.Err()
}

// pump serves the rate queue's head when the timer fires.
func (l *limiter) pump(c Clock) {
	l.rq.mu.Lock()
	d, arm := l.dispatchLocked(c.Now())
	l.rq.mu.Unlock()
	if arm {
		l.rq.arm(c, d, func() { l.pump(c) })
	}
}

// dispatchLocked takes the tokens of the queue's head while they are
// there, serving it, sheds the waiters that could not be served in time,
// and returns when the new head's tokens are due. l.rq.mu is held.
func (l *limiter) dispatchLocked(now time.Time) (time.Duration, bool) {
	q := &l.rq
	for len(q.h) > 0 {
		w := q.h[0]
		if d := l.delay(now, w.tpm); d > 0 {
			l.shedLocked(now)
			if len(q.h) == 0 {
				return 0, false
			}
			return l.delay(now, q.h[0].tpm), true
		}
		l.take(now, w.tpm)
		q.finish(w, nil)
	}
	return 0, false
}

// shedLocked estimates when each waiter, in queue order, will be served,
// from the tokens there now and the refill rates, and sheds those whose
// estimate is past their deadline.
func (l *limiter) shedLocked(now time.Time) {
	q := &l.rq
	order := make(waiters, len(q.h))
	copy(order, q.h)
	sortWaiters(order)
	base := time.Duration(0)
	if h := l.hold.Load(); h > now.UnixNano() {
		base = time.Duration(h - now.UnixNano())
	}
	needR, needT := 0.0, 0.0
	for _, w := range order {
		needR++
		needT += float64(w.tpm)
		eta := max(base, bucketETA(l.rpm, now, needR), bucketETA(l.tpm, now, needT))
		if now.Add(eta).After(w.deadline) {
			q.finish(w, w.tooLong)
			needR--
			needT -= float64(w.tpm)
		}
	}
}

// bucketETA is how long until a bucket has had n tokens to give, from now.
func bucketETA(lim *rate.Limiter, now time.Time, n float64) time.Duration {
	if lim == nil {
		return 0
	}
	have := lim.TokensAt(now)
	if have >= n {
		return 0
	}
	return time.Duration(math.Ceil((n - have) / float64(lim.Limit()) * float64(time.Second)))
}

// sortWaiters sorts a copy of a heap into queue order.
func sortWaiters(ws waiters) {
	for i := 1; i < len(ws); i++ {
		for j := i; j > 0 && ws.Less(j, j-1); j-- {
			ws[j], ws[j-1] = ws[j-1], ws[j]
		}
	}
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

// release gives a slot back: to the first waiter, if any.
func (s *slots) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.h) > 0 {
		s.finish(s.h[0], nil) // the slot passes on
		return
	}
	s.used--
}

// turns orders a replica's requests that wait for the fleet's limits of
// one upstream (shared State): highest priority first, then first come.
// Only the head asks the State again, when its last verdict said the
// tokens would be there; the others wait for their turn without a round
// trip, and a request that arrives while requests of at least its priority
// wait queues behind them instead of asking. So waiting costs the State
// one call per verdict per replica, not one per waiting request, and
// interactive requests go before batch ones within each replica. Across
// replicas there is no order: each replica's head asks when it is due.
type turns struct {
	queue
	eta atomic.Int64 // unix nanoseconds when the head's tokens are due
}

// join queues w; the head gets its turn at once.
func (q *turns) join(w *waiter) {
	q.mu.Lock()
	q.push(w)
	q.wakeHeadLocked()
	q.mu.Unlock()
}

// wakeHeadLocked tells the head it is its turn; q.mu is held.
func (q *turns) wakeHeadLocked() {
	if len(q.h) > 0 && q.h[0].err == nil {
		q.h[0].err = errTurn
		close(q.h[0].done)
	}
}

// errTurn marks a waiter whose done channel was closed for its turn.
var errTurn = errors.New("relay: turn")

// await returns once w is the head, and whether it had to wait for that;
// it fails when ctx ends or the deadline passes first (then tooLong).
func (q *turns) await(ctx context.Context, c Clock, w *waiter, deadline time.Time, tooLong error) (waited bool, err error) {
	var expired chan struct{}
	for {
		q.mu.Lock()
		if q.h[0] == w {
			q.mu.Unlock()
			return waited, nil
		}
		if w.err != nil { // it was the head, and one of higher priority came
			w.err, w.done = nil, make(chan struct{})
		}
		done := w.done
		q.mu.Unlock()
		if expired == nil { // a timer only for a request that waits its turn
			expired = make(chan struct{})
			stop := c.AfterFunc(deadline.Sub(c.Now()), func() { close(expired) })
			defer stop()
		}
		waited = true
		select {
		case <-done:
		case <-expired:
			return waited, tooLong
		case <-ctx.Done():
			return waited, ctx.Err()
		}
	}
}

// head reports whether w is the head.
func (q *turns) head(w *waiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.h) > 0 && q.h[0] == w
}

// leave takes w out and gives the next head its turn.
func (q *turns) leave(w *waiter) {
	q.mu.Lock()
	if w.index >= 0 {
		heap.Remove(&q.h, w.index)
		q.n.Store(int32(len(q.h)))
	}
	q.wakeHeadLocked()
	q.mu.Unlock()
}

// ahead reports whether requests of at least priority p wait, and how
// long until the head's tokens are due (at least 1).
func (q *turns) ahead(p Priority, now time.Time) (time.Duration, bool) {
	if q.n.Load() == 0 {
		return 0, false
	}
	q.mu.Lock()
	ahead := q.queue.ahead(p)
	q.mu.Unlock()
	return max(time.Duration(q.eta.Load()-now.UnixNano()), 1), ahead
}
