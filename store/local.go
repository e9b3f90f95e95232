package store

import (
	"context"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"
)

// minute is the span of quota a bucket holds.
const minute = int64(time.Minute)

// Local is the in-process State: the default of relay.Config.State, and
// the local share a router keeps in step with a shared State (Mirror), to
// decide from while that one does not answer. Its zero value is not
// usable; make one with NewLocal. It is safe for concurrent use, and
// several routers may share one, as replicas share a store on Redis.
type Local struct {
	failRun, openKeep time.Duration
	ups               sync.Map // upstream name -> *upstream
	ledger
}

var _ State = (*Local)(nil)

// Option configures a Local.
type Option func(*Local)

// WithFailureRun sets how long a run of consecutive failures is
// remembered after its last failure (default DefaultFailureRun): failures
// further apart never add up to an open circuit.
func WithFailureRun(d time.Duration) Option {
	return func(l *Local) {
		if d > 0 {
			l.failRun = d
		}
	}
}

// NewLocal returns an in-process State.
func NewLocal(opts ...Option) *Local {
	l := &Local{failRun: DefaultFailureRun, openKeep: OpenKeep}
	l.ledger.init()
	for _, o := range opts {
		o(l)
	}
	return l
}

// DefaultFailureRun is how long a failure run is remembered after its last
// failure, unless the store is told otherwise: a day, so that the
// failures of an upstream that fails every request open its circuit
// however seldom it is called.
const DefaultFailureRun = 24 * time.Hour

// OpenKeep is how long a circuit stays half-open, waiting for a probe,
// after its open period ends: then it is forgotten (closed), as a shared
// store's keys expire.
const OpenKeep = 10 * time.Minute

// upstream is one upstream's state. Times are Unix nanoseconds; 0 is none.
type upstream struct {
	mu       sync.Mutex
	rpm, tpm int64 // the buckets' TATs
	hold     int64
	circuit
}

// circuit is an upstream's circuit.
type circuit struct {
	open   int64  // the end of the open period; 0: closed
	period string // the open period's id: the prefix of its claims' tokens
	cool   int64  // the open period's length, which a failure in half-open doubles
	lock   int64  // the end of the probe claim in flight
	holder string // its token
	fails  int    // the failure run
	last   int64  // the run's last failure
}

func (l *Local) get(name string) *upstream {
	if u, ok := l.ups.Load(name); ok {
		return u.(*upstream)
	}
	u, _ := l.ups.LoadOrStore(name, &upstream{})
	return u.(*upstream)
}

// gcra returns a bucket's new TAT if n tokens are taken from it at now,
// and how long until they are there (0: now). limit is per minute.
func gcra(tat int64, limit, n int, now int64) (int64, int64) {
	tat = max(tat, now) + increment(limit, n)
	return tat, max(tat-minute-now, 0)
}

// increment is what n tokens move a bucket's TAT by.
func increment(limit, n int) int64 {
	return int64(math.Round(float64(n) * float64(minute) / float64(limit)))
}

// charge is a TPM charge, clamped to [1, tpm].
func charge(tokens, tpm int) int {
	return min(max(tokens, 1), tpm)
}

// backlog is how far a TAT is ahead of now.
func backlog(tat, now int64) time.Duration { return time.Duration(max(tat-now, 0)) }

// halfOpen reports whether the circuit's open period has passed, not so
// long ago that it is forgotten.
func (c *circuit) isOpen(now int64, keep time.Duration) (open, half bool) {
	switch {
	case c.open == 0:
		return false, false
	case now < c.open:
		return true, false
	case now < c.open+int64(keep):
		return true, true
	}
	*c = circuit{fails: c.fails, last: c.last} // forgotten: closed
	return false, false
}

func (l *Local) Admit(_ context.Context, lim Limits, a Ask, now time.Time) (Verdict, error) {
	t := now.UnixNano()
	u := l.get(lim.Name)
	u.mu.Lock()
	defer u.mu.Unlock()
	u.owe(lim, a.Owed, t)
	claim := false
	if open, half := u.isOpen(t, l.openKeep); open && !a.Force {
		switch {
		case !half:
			return Verdict{Open: true, Until: time.Unix(0, u.open)}, nil
		case u.lock > t:
			return Verdict{Open: true, Until: time.Unix(0, u.lock)}, nil
		case a.Probe <= 0:
			return Verdict{Open: true, Until: time.Unix(0, u.open)}, nil
		}
		claim = true
	}
	var wait int64
	v := Verdict{Requests: backlog(u.rpm, t), Tokens: backlog(u.tpm, t)}
	if u.hold > t {
		wait, v.Until = u.hold-t, time.Unix(0, u.hold)
	}
	rtat, ttat := u.rpm, u.tpm
	if lim.RPM > 0 {
		var w int64
		rtat, w = gcra(u.rpm, lim.RPM, 1, t)
		wait = max(wait, w)
	}
	if lim.TPM > 0 {
		var w int64
		ttat, w = gcra(u.tpm, lim.TPM, charge(a.Tokens, lim.TPM), t)
		wait = max(wait, w)
	}
	if wait > 0 {
		v.Wait = time.Duration(wait)
		return v, nil
	}
	u.rpm, u.tpm = rtat, ttat
	v = Verdict{Taken: true, Failing: u.failing(t, l.failRun), Requests: backlog(rtat, t), Tokens: backlog(ttat, t)}
	if claim {
		v.Probe = u.period + ":" + strconv.FormatUint(rand.Uint64(), 36)
		u.lock, u.holder = t+int64(a.Probe), v.Probe
	}
	return v, nil
}

// owe takes what a caller admitted without the store from u's buckets,
// whatever is there.
func (u *upstream) owe(lim Limits, o Owed, now int64) {
	if lim.RPM > 0 && o.Requests > 0 {
		u.rpm = max(u.rpm, now) + increment(lim.RPM, o.Requests)
	}
	if lim.TPM > 0 && o.Tokens > 0 {
		u.tpm = max(u.tpm, now) + increment(lim.TPM, o.Tokens)
	}
}

// failing reports whether a failure run is in progress.
func (c *circuit) failing(now int64, run time.Duration) bool {
	return c.fails > 0 && now < c.last+int64(run)
}

func (l *Local) Refund(_ context.Context, lim Limits, requests, tokens int, now time.Time) error {
	t := now.UnixNano()
	u := l.get(lim.Name)
	u.mu.Lock()
	defer u.mu.Unlock()
	u.rpm = refund(u.rpm, lim.RPM, requests, t)
	u.tpm = refund(u.tpm, lim.TPM, tokens, t)
	return nil
}

// refund gives n tokens back to a bucket: its TAT moves back, never past
// now (a full bucket).
func refund(tat int64, limit, n int, now int64) int64 {
	if limit <= 0 || n <= 0 || tat <= now {
		return tat
	}
	tat -= increment(limit, min(n, limit))
	if tat <= now {
		return 0
	}
	return tat
}

func (l *Local) Hold(_ context.Context, upstream string, until, _ time.Time) error {
	u := l.get(upstream)
	u.mu.Lock()
	u.hold = max(u.hold, until.UnixNano())
	u.mu.Unlock()
	return nil
}

func (l *Local) Outcome(_ context.Context, upstream string, p CircuitPolicy, o Outcome, now time.Time) (Change, error) {
	t := now.UnixNano()
	u := l.get(upstream)
	u.mu.Lock()
	defer u.mu.Unlock()
	open, half := u.isOpen(t, l.openKeep)
	switch o.Result {
	case Success:
		u.fails = 0
		if open && o.Probe != "" && claimOf(o.Probe) == u.period {
			u.circuit = circuit{}
			return Change{Closed: true}, nil
		}
	case Neutral:
		if o.Probe != "" && o.Probe == u.holder {
			u.lock, u.holder = 0, ""
		}
	case Failure:
		switch {
		case half && o.Probe != "" && claimOf(o.Probe) == u.period:
			cool := max(u.cool, int64(p.Cooldown))
			if int64(p.MaxCooldown) > cool {
				cool = min(2*cool, int64(p.MaxCooldown))
			}
			return Change{Opened: u.reopen(t+max(cool, int64(o.Hint)), cool)}, nil
		case open || p.Failures <= 0:
			return Change{}, nil
		}
		if !u.failing(t, l.failRun) {
			u.fails = 0
		}
		u.fails++
		u.last = t
		if u.fails > p.Failures {
			run := u.fails
			return Change{Opened: u.reopen(t+max(int64(p.Cooldown), int64(o.Hint)), int64(p.Cooldown)), Run: run}, nil
		}
	}
	return Change{}, nil
}

// claimOf returns the open period a probe token was claimed in.
func claimOf(token string) string {
	period, _, _ := strings.Cut(token, ":")
	return period
}

// reopen starts a new open period until until, cool long for the next
// doubling: the run, the lock and every claim of the period before end.
func (c *circuit) reopen(until, cool int64) time.Time {
	*c = circuit{open: until, cool: cool, period: strconv.FormatUint(rand.Uint64(), 36)}
	return time.Unix(0, until)
}

func (l *Local) Open(_ context.Context, upstream string, until, now time.Time) error {
	t, end := now.UnixNano(), until.UnixNano()
	u := l.get(upstream)
	u.mu.Lock()
	defer u.mu.Unlock()
	if open, _ := u.isOpen(t, l.openKeep); open && u.open >= end {
		return nil
	}
	u.reopen(end, max(u.cool, end-t))
	return nil
}

// Mirror sets u's state to what a verdict of the shared store said of the
// fleet's, for a local share of the limits (the fleet's divided by the
// number of replicas): the buckets get the fleet's backlogs (the same
// share of a minute, so this replica's share of what the fleet has left),
// a hold the verdict names holds here too, and the circuit follows the
// fleet's: open when the verdict said so, closed when it admitted an
// attempt that was neither forced nor the probe. A router calls it with
// every verdict, so that when the shared store stops answering it decides
// from where the fleet was, not from a full bucket.
func (l *Local) Mirror(u Limits, v Verdict, forced bool, now time.Time) {
	t := now.UnixNano()
	s := l.get(u.Name)
	s.mu.Lock()
	defer s.mu.Unlock()
	if v.Open {
		if until := v.Until.UnixNano(); until > t && until > s.open {
			s.reopen(until, until-t)
		}
		return
	}
	if v.Taken && !forced && v.Probe == "" {
		s.open, s.lock, s.holder = 0, 0, ""
	}
	if !v.Until.IsZero() {
		s.hold = max(s.hold, v.Until.UnixNano())
	}
	if u.RPM > 0 {
		s.rpm = t + int64(v.Requests)
	}
	if u.TPM > 0 {
		s.tpm = t + int64(v.Tokens)
	}
}
