package redisstate

import (
	"context"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/tokenrelay/relay/store"
)

// Outcome records how an attempt on upstream ended, for the fleet's
// circuit (see store.State.Outcome), in one script: failures add up across
// the fleet; the probe's failure opens the circuit again for twice the
// last period (up to p.MaxCooldown), whichever replica sent it; the
// probe's success, with a claim of the current open period, closes it. An
// open period's claims are those whose token starts with its id.
func (s *State) Outcome(ctx context.Context, upstream string, p store.CircuitPolicy, o store.Outcome, now time.Time) (store.Change, error) {
	k := s.keys(upstream)
	r, err := s.eval(ctx, &k.ff, outcomeScript, k.state, s.upArgs(now, int(o.Result), o.Probe, max(o.Hint, 0).Microseconds(),
		p.Failures, max(p.Cooldown, 0).Microseconds(), max(p.MaxCooldown, 0).Microseconds(), periodID())...).Int64Slice()
	if err != nil || len(r) != 3 {
		return store.Change{}, wrap("outcome "+upstream, err)
	}
	c := store.Change{Closed: r[0] == 1, Run: int(r[2])}
	if r[1] != 0 {
		c.Opened = time.UnixMicro(r[1])
	}
	return c, nil
}

// Open opens upstream's circuit for the fleet until until, or leaves it
// open until a later end already set. A new open period ends the failure
// run and every claim on the probe of the period before.
func (s *State) Open(ctx context.Context, upstream string, until, now time.Time) error {
	k := s.keys(upstream)
	err := s.eval(ctx, &k.ff, openScript, k.state, s.upArgs(now, until.UnixMicro(), periodID())...).Err()
	return wrap("open "+upstream, err)
}

// periodID returns the id of a new open period: 64 random bits.
func periodID() string { return strconv.FormatUint(rand.Uint64(), 36) }
