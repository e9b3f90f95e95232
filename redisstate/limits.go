package redisstate

import (
	"context"
	"fmt"
	"time"

	"github.com/tokenrelay/relay"
)

// Admit is the admission of one attempt on upstream u.Name, in one round
// trip (one script): the fleet's circuit (unless force), then the hold,
// then the RPM and TPM buckets together, both taken or neither. The
// buckets work as the router's in-process ones: each holds one minute of
// quota and refills continuously (GCRA); a TPM charge larger than the
// bucket is clamped to it, and a charge under 1 counts as 1.
//
// While the circuit is open the verdict is Open with its end; once the
// open period has passed it is Open with Until the end of the claimed
// probe (Probe) while one is in flight, and Open with the past end of the
// open period when none is: half-open, the caller may claim the probe and
// admit it with force.
func (s *State) Admit(ctx context.Context, u relay.Limits, tpm int, force bool, now time.Time) (relay.Verdict, error) {
	k := s.keys(u.Name)
	rpm, tpmLimit := max(u.RPM, 0), max(u.TPM, 0)
	charge := 0
	if tpmLimit > 0 {
		charge = min(max(tpm, 1), tpmLimit)
	}
	f := 0
	if force {
		f = 1
	}
	cmd := s.eval(ctx, admitScript, k.admit[:], now.UnixMicro(), f, rpm, tpmLimit, charge, ms(s.keep))
	r, err := cmd.Int64Slice()
	if err != nil {
		return relay.Verdict{}, wrap("admit "+u.Name, err)
	}
	switch {
	case len(r) == 2 && r[0] == 0:
		return relay.Verdict{Taken: true, Failing: r[1] == 1}, nil
	case len(r) == 2 && r[0] == 1:
		return relay.Verdict{Open: true, Until: time.UnixMicro(r[1])}, nil
	case len(r) == 3 && r[0] == 2:
		v := relay.Verdict{Wait: time.Duration(r[1]) * time.Microsecond}
		if r[2] != 0 {
			v.Until = time.UnixMicro(r[2])
		}
		return v, nil
	}
	return relay.Verdict{}, fmt.Errorf("redisstate: admit %s: unexpected reply %v", u.Name, r)
}

// Refund gives back requests and tokens taken from u's buckets, never
// filling a bucket past its minute of quota.
func (s *State) Refund(ctx context.Context, u relay.Limits, requests, tokens int, now time.Time) error {
	if (u.RPM <= 0 || requests <= 0) && (u.TPM <= 0 || tokens <= 0) {
		return nil
	}
	k := s.keys(u.Name)
	err := s.eval(ctx, refundScript, []string{k.rpm(), k.tpm()}, now.UnixMicro(),
		max(u.RPM, 0), max(u.TPM, 0), max(requests, 0), max(tokens, 0), ms(s.keep)).Err()
	return wrap("refund "+u.Name, err)
}

// Hold keeps upstream out of every replica's traffic until until (the
// later of this and any hold already set): Admit answers with the wait
// (the longest of the hold's and the limits') and the hold's end in Until.
func (s *State) Hold(ctx context.Context, upstream string, until time.Time) error {
	k := s.keys(upstream)
	err := s.eval(ctx, holdScript, []string{k.hold()}, until.UnixMicro(), s.ttl(until, s.keep)).Err()
	return wrap("hold "+upstream, err)
}
