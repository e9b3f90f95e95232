package redisstate

import (
	"context"
	"crypto/rand"
	"time"

	"github.com/tokenrelay/relay"
)

// Failure counts a failed attempt on upstream in the fleet's run of
// consecutive failures; when the run passes b.Failures, the circuit opens
// for b.Cooldown from now and Failure returns its end. While the circuit
// is open, failures are not counted (as in the in-process breaker) and
// Failure returns the end of the open period. Once that has passed
// (half-open), a failure (the probe's, or a forced attempt's) opens the
// circuit again for b.Cooldown and ends every claim on its probe (see
// Open). b.Failures of 0 or less turns counting off: Failure then returns
// zero without a round trip. A run is forgotten WithFailureRun (one
// minute) after its last failure.
func (s *State) Failure(ctx context.Context, upstream string, b relay.CircuitPolicy, now time.Time) (time.Time, error) {
	if b.Failures <= 0 {
		return time.Time{}, nil
	}
	k := s.keys(upstream)
	until := now.Add(max(b.Cooldown, 0))
	u, err := s.eval(ctx, failureScript, []string{k.fails, k.open(), k.probe(), k.reopened(), k.claim},
		b.Failures, now.UnixMicro(), until.UnixMicro(), ms(s.failRun), ms(max(b.Cooldown, 0)+s.openKeep)).Int64()
	if err != nil || u == 0 {
		return time.Time{}, wrap("failure "+upstream, err)
	}
	return time.UnixMicro(u), nil
}

// Success ends the fleet's failure run of upstream (one DEL). With probe,
// the token of a Probe claim, it also closes the circuit for the fleet if
// that claim belongs to the current open period (a set membership test
// and the deletes, in a script). A probe slower than its lock's ttl thus
// closes the circuit, even while a newer claim is in flight; once the
// circuit has opened again (the newer probe failed, or Open), the claims
// of the period before are gone, and an old probe's success only ends the
// failure run.
func (s *State) Success(ctx context.Context, upstream string, probe string) error {
	k := s.keys(upstream)
	var err error
	if probe != "" {
		err = s.eval(ctx, successScript, []string{k.fails, k.open(), k.probe(), k.reopened(), k.claim}, probe).Err()
	} else {
		err = s.do(ctx, "del", k.fails).Err()
	}
	return wrap("success "+upstream, err)
}

// Open opens upstream's circuit for the fleet until until, or leaves it
// open until a later end already set. A new open period ends the failure
// run and every claim on the probe of the period before: the lock is
// freed, and no probe claimed before can close the circuit. The circuit
// stays half-open after until until a probe succeeds, or for ten minutes
// without traffic.
func (s *State) Open(ctx context.Context, upstream string, until time.Time) error {
	k := s.keys(upstream)
	err := s.eval(ctx, openScript, []string{k.open(), k.fails, k.probe(), k.reopened(), k.claim},
		until.UnixMicro(), s.ttl(until, s.openKeep)).Err()
	return wrap("open "+upstream, err)
}

// Probe claims upstream's half-open probe for ttl (SET NX PX in a
// script): of the replicas that ask at once, exactly one gets a token
// (crypto/rand.Text: 128 random bits or more), the others "". It gets ""
// on a closed circuit, and on one that opened again since an Admit last
// saw it half-open: a replica whose half-open verdict went stale while
// another's probe failed does not probe the new open period. The lock
// ends after ttl, or when a success of one of the period's claims closes
// the circuit, or when the circuit opens again; the token stays one of the
// open period's claims (see Success) until the circuit closes or opens
// again.
func (s *State) Probe(ctx context.Context, upstream string, ttl time.Duration) (string, error) {
	k := s.keys(upstream)
	token := rand.Text()
	n, err := s.eval(ctx, probeScript, []string{k.open(), k.probe(), k.reopened(), k.claim}, ms(ttl), token).Int64()
	if err != nil || n != 1 {
		return "", wrap("probe "+upstream, err)
	}
	return token, nil
}
