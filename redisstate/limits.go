package redisstate

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/tokenrelay/relay/store"
)

// Admit is the admission of one attempt on upstream u.Name, in one round
// trip (one script): the circuit (unless a.Force; in half-open, the claim
// of the probe), then the hold, then the RPM and TPM buckets together,
// both taken or neither. The buckets hold one minute of quota each and
// refill continuously (GCRA); a TPM charge larger than the bucket is
// clamped to it, and a charge under 1 counts as 1.
func (s *State) Admit(ctx context.Context, u store.Limits, a store.Ask, now time.Time) (store.Verdict, error) {
	k := s.keys(u.Name)
	rpm, tpmLimit := max(u.RPM, 0), max(u.TPM, 0)
	charge := 0
	if tpmLimit > 0 {
		charge = min(max(a.Tokens, 1), tpmLimit)
	}
	force := 0
	if a.Force {
		force = 1
	}
	r, err := s.eval(ctx, &k.ff, admitScript, k.state, s.upArgs(now, force, a.Probe.Microseconds(),
		strconv.FormatUint(rand.Uint64(), 36), rpm, tpmLimit, charge, max(a.Owed.Requests, 0), max(a.Owed.Tokens, 0))...).Slice()
	if err != nil {
		return store.Verdict{}, wrap("admit "+u.Name, err)
	}
	n := func(i int) int64 {
		v, _ := r[i].(int64)
		return v
	}
	us := func(i int) time.Duration { return time.Duration(n(i)) * time.Microsecond }
	switch {
	case len(r) == 5 && n(0) == 0:
		token, _ := r[4].(string)
		return store.Verdict{Taken: true, Failing: n(1) == 1, Requests: us(2), Tokens: us(3), Probe: token}, nil
	case len(r) == 2 && n(0) == 1:
		return store.Verdict{Open: true, Until: time.UnixMicro(n(1))}, nil
	case len(r) == 5 && n(0) == 2:
		v := store.Verdict{Wait: us(1), Requests: us(3), Tokens: us(4)}
		if n(2) != 0 {
			v.Until = time.UnixMicro(n(2))
		}
		return v, nil
	}
	return store.Verdict{}, fmt.Errorf("redisstate: admit %s: unexpected reply %v", u.Name, r)
}

// Refund gives back requests and tokens taken from u's buckets, never
// filling a bucket past its minute of quota.
func (s *State) Refund(ctx context.Context, u store.Limits, requests, tokens int, now time.Time) error {
	if (u.RPM <= 0 || requests <= 0) && (u.TPM <= 0 || tokens <= 0) {
		return nil
	}
	k := s.keys(u.Name)
	err := s.eval(ctx, &k.ff, refundScript, k.state, s.upArgs(now, max(u.RPM, 0), max(u.TPM, 0), max(requests, 0), max(tokens, 0))...).Err()
	return wrap("refund "+u.Name, err)
}

// Hold keeps upstream out of every replica's traffic until until (the
// later of this and any hold already set): Admit answers with the wait
// (the longest of the hold's and the limits') and the hold's end in Until.
func (s *State) Hold(ctx context.Context, upstream string, until, now time.Time) error {
	k := s.keys(upstream)
	err := s.eval(ctx, &k.ff, holdScript, k.state, s.upArgs(now, until.UnixMicro())...).Err()
	return wrap("hold "+upstream, err)
}
