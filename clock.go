package relay

import (
	"context"
	"time"
)

// Clock is the router's source of time: reading it, and waiting on it. The
// router computes every time-based transition (breaker cooldowns, limiter
// refills, latency windows) from Now, and waits (backoff, hedge delay,
// per-attempt timeout) only through AfterFunc, so a test can drive all of it
// with a fake clock and no sleep.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has elapsed, unless stop
	// is called first; stop reports whether it prevented the call, as
	// time.Timer.Stop does.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}

// sleep waits d on c, or until ctx ends, whichever is first. It returns
// ctx.Err() when ctx ended first.
func sleep(ctx context.Context, c Clock, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	done := make(chan struct{})
	stop := c.AfterFunc(d, func() { close(done) })
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		stop()
		return ctx.Err()
	}
}
