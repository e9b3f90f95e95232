package relay

import (
	"context"
	"sync/atomic"
	"time"
)

// State is what the replicas of a service share so that an upstream's rate
// limits, its health and a budget are one number for the whole fleet, not
// one per process: with 8 replicas each holding an upstream's RPM, the
// upstream would otherwise receive 8× its limit.
//
// With Config.State nil (the default), all of it lives in the process.
// Package redisstate keeps it on Redis. The router calls a State on the
// request path, each call bounded by Config.StateTimeout; when a call
// fails or times out, the router decides that call from its in-process
// state instead (rate limits divided by Config.Replicas), says so in
// Report.StateFallback and Router.StateFallbacks, and tries the shared
// state again on the next call: a State that is down never fails a
// request. Implementations are safe for concurrent use.
type State interface {
	// Ledger keeps the fleet's budget spend (see Budget).
	Ledger

	// Admit is an attempt's admission on the fleet's view of upstream
	// u.Name, in one step (one round trip): when its circuit is open (and
	// force is false), or the upstream is held (a 429's Retry-After, an
	// exhausted x-ratelimit-remaining-*), nothing is taken and the verdict
	// says until when; else one request and tpm tokens are taken from its
	// RPM and TPM limits, or, when they are not there, nothing is taken and
	// the verdict says how long until they would be. force admits past an
	// open circuit (the never-empty rule), not past limits or holds.
	Admit(ctx context.Context, u Limits, tpm int, force bool, now time.Time) (Verdict, error)
	// Refund gives back requests and tokens taken from u's limits: for a
	// call that never went out, or the part of a TPM charge a request did
	// not use.
	Refund(ctx context.Context, u Limits, requests, tokens int, now time.Time) error
	// Hold keeps upstream out of the fleet's traffic until until.
	Hold(ctx context.Context, upstream string, until time.Time) error

	// Failure counts a failed attempt on upstream; when more than
	// b.Failures fail in a row, across the fleet, its circuit opens for
	// b.Cooldown. It returns the end of the open period, zero while closed.
	Failure(ctx context.Context, upstream string, b CircuitPolicy, now time.Time) (openUntil time.Time, err error)
	// Success counts a successful attempt: the failure run ends, and a
	// successful probe closes the circuit for the fleet.
	Success(ctx context.Context, upstream string, probe bool) error
	// Open opens upstream's circuit for the fleet until until (a replica's
	// own reason, such as its p99 latency, or a failed probe).
	Open(ctx context.Context, upstream string, until time.Time) error
	// Probe claims the half-open probe of upstream's circuit for ttl: it
	// returns true to the one replica of the fleet that gets it.
	Probe(ctx context.Context, upstream string, ttl time.Duration) (bool, error)
}

// Limits are one upstream's shared rate limits.
type Limits struct {
	Name     string
	RPM, TPM int // per minute; 0: none
}

// CircuitPolicy is the breaker's failure rule, for a shared State.
type CircuitPolicy struct {
	Failures int           // failures in a row tolerated; one more opens
	Cooldown time.Duration // how long it then stays open
}

// Verdict is the answer of State.Admit.
type Verdict struct {
	// Taken: the request and its tokens were taken.
	Taken bool
	// Wait, when nothing was taken for the limits or a hold, is how long
	// until the request could be taken.
	Wait time.Duration
	// Open: the fleet's circuit for the upstream is open until Until; an
	// Until that has passed means its open period ended and no replica's
	// probe is in flight: half-open, a replica may claim the probe (Probe).
	Open  bool
	Until time.Time
}

// stateCounters counts the calls a shared State failed.
type stateCounters struct {
	fallbacks atomic.Uint64
}

// StateFallbacks returns how many calls to Config.State failed or timed
// out, each decided from in-process state instead.
func (r *Router) StateFallbacks() uint64 { return r.stateCount.fallbacks.Load() }
