package relay

import "time"

// LimitConfig configures backpressure: how long a request may wait for an
// upstream's rate limits.
type LimitConfig struct {
	// MaxWait bounds the wait for an upstream's RPM and TPM tokens. If 0, 2 s.
	MaxWait time.Duration
}

// limiter holds the rate limits of one upstream.
type limiter struct{}

func (l *limiter) init(u *Upstream, r *Router) {}
