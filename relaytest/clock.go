package relaytest

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Clock is a fake clock for tests of a relay.Router: hand it to the
// router as Config.Clock (it has the methods of relay.Clock) and the
// router's time moves only when the test calls Advance. Limiter refills,
// breaker cooldowns, latency windows and budget windows follow it, and
// the router's waits (backoff, hedge delay, limiter wait, attempt timeout)
// end when Advance reaches them, so a test of a policy, a limit or a
// breaker runs at once and gives the same result on any machine.
//
// A function scheduled with AfterFunc runs during the Advance that
// reaches its time, on Advance's goroutine, before Advance returns;
// functions fall due in the order of their times, and Now reads each one's
// time while it runs. A waiting request is in RoundTrip on another
// goroutine: WaitPending tells the test when it has started to wait.
//
// The zero Clock is not usable; make one with NewClock. A Clock is safe
// for simultaneous use by multiple goroutines.
type Clock struct {
	mu      sync.Mutex
	now     time.Time
	timers  []*clockTimer
	changed chan struct{} // closed and replaced when a timer is added
}

type clockTimer struct {
	at   time.Time
	f    func()
	done bool // ran or stopped
}

// NewClock returns a Clock reading start; the zero start is 2026-01-01
// 00:00 UTC.
func NewClock(start time.Time) *Clock {
	if start.IsZero() {
		start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	return &Clock{now: start, changed: make(chan struct{})}
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc schedules f to run when Advance reaches d from now (at the next
// Advance when d <= 0). stop cancels it and reports whether it prevented
// the call, as time.Timer.Stop does.
func (c *Clock) AfterFunc(d time.Duration, f func()) (stop func() bool) {
	c.mu.Lock()
	t := &clockTimer{at: c.now.Add(max(d, 0)), f: f}
	c.timers = append(c.timers, t)
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if t.done {
			return false
		}
		t.done = true
		c.drop(t)
		return true
	}
}

// Advance moves the clock d forward, running each function scheduled for
// a time up to the new one (those its functions schedule too) in the
// order of their times, with the clock at that time while it runs.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(max(d, 0))
	for {
		t := c.next(end)
		if t == nil {
			c.now = end
			c.mu.Unlock()
			return
		}
		t.done = true
		c.drop(t)
		if t.at.After(c.now) {
			c.now = t.at
		}
		c.mu.Unlock()
		t.f()
		c.mu.Lock()
	}
}

// next returns the earliest pending timer due by end, or nil; c.mu is
// held.
func (c *Clock) next(end time.Time) *clockTimer {
	var first *clockTimer
	for _, t := range c.timers {
		if !t.at.After(end) && (first == nil || t.at.Before(first.at)) {
			first = t
		}
	}
	return first
}

// drop removes t from the pending timers; c.mu is held.
func (c *Clock) drop(t *clockTimer) {
	if i := slices.Index(c.timers, t); i >= 0 {
		c.timers = slices.Delete(c.timers, i, i+1)
	}
}

// Pending returns the number of scheduled functions that have neither run
// nor been stopped.
func (c *Clock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// WaitPending blocks until at least n scheduled functions are pending
// (e.g. a request waiting for a limiter's tokens or a backoff), or ctx
// ends, and returns ctx.Err() then.
func (c *Clock) WaitPending(ctx context.Context, n int) error {
	for {
		c.mu.Lock()
		pending, changed := len(c.timers), c.changed
		c.mu.Unlock()
		if pending >= n {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
