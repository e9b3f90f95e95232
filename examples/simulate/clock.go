package main

import (
	"time"

	"github.com/tokenrelay/relay"
)

// simEpoch is where every simClock starts: the same simulated instant in
// every run, so that a budget's window (a day, aligned to 00:00 UTC) never
// ends during one.
var simEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// simClock is the router's clock in the modes that count per minute or per
// window (budget, priority, the replicas comparison): it reads simulated
// time, the fleet's, running 1/timeScale times faster than the wall clock
// from simEpoch, and waits on the wall clock for the scaled-down duration.
// An RPM limit then means requests per simulated minute, as the fleet's
// service times are simulated times. It is safe for concurrent use.
type simClock struct{ start time.Time }

var _ relay.Clock = (*simClock)(nil)

func newSimClock() *simClock { return &simClock{start: time.Now()} }

// Now returns the simulated time: simEpoch plus the wall-clock time since
// the clock started, ×1/timeScale.
func (c *simClock) Now() time.Time {
	return simEpoch.Add(time.Duration(float64(time.Since(c.start)) / timeScale))
}

// AfterFunc calls f once d of simulated time has passed.
func (c *simClock) AfterFunc(d time.Duration, f func()) (stop func() bool) {
	return time.AfterFunc(scaled(d), f).Stop
}

// unscaled converts a wall-clock duration to simulated time.
func unscaled(d time.Duration) time.Duration { return time.Duration(float64(d) / timeScale) }

// routerTiming returns the relay modes' retry, breaker and stream settings
// on the router's clock. They are chosen in simulated time (the default
// 100 ms → 1.2 s backoff would be 10–120 s of simulated time, the default
// 30 s cooldown 25 minutes, longer than a run): on the real clock (sim
// false) they are scaled to wall-clock time, and the router's other
// defaults (breaker P99 1.5 s, stream idle 25 s) are wall-clock times; on a
// simClock they stand as they are, and those defaults are set to their
// simulated equivalents, so that both clocks run the same router.
func routerTiming(sim bool) (relay.RetryConfig, relay.BreakerConfig, relay.StreamConfig) {
	at := scaled
	var b relay.BreakerConfig
	var st relay.StreamConfig
	if sim {
		at = func(d time.Duration) time.Duration { return d }
		b.P99, st.IdleTimeout = unscaled(1500*time.Millisecond), unscaled(25*time.Second)
	}
	retry := relay.RetryConfig{
		MaxAttempts:     3,
		InitialInterval: at(200 * time.Millisecond),
		MaxInterval:     at(2 * time.Second),
		MaxRetryAfter:   at(10 * time.Second),
		AttemptTimeout:  at(attemptTimeout),
	}
	// Busy: a recent p99 over 5 s of simulated time.
	b.BusyP99, b.Cooldown, b.MaxCooldown = at(5*time.Second), at(30*time.Second), at(5*time.Minute)
	return retry, b, st
}
