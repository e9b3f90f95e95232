// Package store is the contract between a relay.Router and the state its
// admissions are decided on: each upstream's rate limits (RPM and TPM),
// its hold (a 429's Retry-After, an exhausted x-ratelimit-remaining-*), its
// circuit (a run of failures, an open period that doubles after each
// failed probe, one half-open probe at a time), and the budgets' ledgers.
//
// The router decides every admission, wait and settlement against a
// State and nothing else. With relay.Config.State nil it uses NewLocal,
// which keeps all of it in the process; package redisstate keeps it on
// Redis, so that the replicas of a service share one limit, one hold, one
// circuit and one budget. Both implement the same semantics, which package
// storetest checks: a third-party store runs the same suite.
//
// # Time
//
// Every call is given the time it is made at (the router's clock), and
// decides by it: a store never reads a clock of its own to decide, so a
// fake clock drives it in tests and each replica decides by its own.
//
// # Rate limits
//
// Each limit is a bucket that holds one minute of quota and refills
// continuously, kept with GCRA: one theoretical arrival time (TAT) per
// bucket. A bucket's backlog, the time its TAT is ahead of now, says all
// of its state: 0 is a full bucket, a minute an empty one. Verdicts report
// the backlogs, so that a caller can tell when the k-th request of a queue
// would be served, and keep a local share of the limit in step (see
// Local.Mirror).
package store

import (
	"context"
	"time"
)

// State is the state that admission decides on. Implementations are safe
// for concurrent use; each call is bounded by its context.
type State interface {
	// Ledger keeps the budgets' spend.
	Ledger

	// Admit is one attempt's admission on upstream u.Name, in one step:
	//
	//  1. Unless a.Force, the circuit: while it is open the verdict is
	//     Open until the end of the open period. Once that has passed
	//     (half-open) and another's probe is in flight, Open until the
	//     probe's claim ends. Half-open with no probe in flight: when
	//     a.Probe is positive the attempt claims the probe for a.Probe
	//     (if the limits below take it: Verdict.Probe is the claim's
	//     token); else Open with the past end (an active health probe
	//     claims it).
	//  2. The hold: while one is set, nothing is taken; Wait says how
	//     long and Until when it ends. Force does not pass a hold.
	//  3. The limits: a.Owed is taken whatever is there (before the
	//     circuit keeps the attempt out, too); then one request from RPM
	//     and a.Tokens (clamped to [1, TPM]) from TPM, both or neither.
	//     When they are short, nothing more is taken and Wait says how
	//     long until they would be there.
	Admit(ctx context.Context, u Limits, a Ask, now time.Time) (Verdict, error)
	// Refund gives back requests and tokens taken from u's limits (a call
	// that never went out, the part of a TPM charge a request did not
	// use), never filling a bucket past its minute of quota.
	Refund(ctx context.Context, u Limits, requests, tokens int, now time.Time) error
	// Hold keeps upstream out until until, or a later end already set.
	Hold(ctx context.Context, upstream string, until, now time.Time) error

	// Outcome records how an attempt admitted on upstream ended, for its
	// circuit. A Success ends the failure run; with o.Probe, the token of
	// a claim made in the current open period, it closes the circuit. A
	// Failure while the circuit is closed adds to the run, which opens it
	// for p.Cooldown (or o.Hint, if longer) once it passes p.Failures; the
	// Failure of the probe (o.Probe a claim of the current open period)
	// opens it again for twice the last period, at most p.MaxCooldown (or
	// o.Hint, if longer); any other Failure while it is open or half-open
	// counts nothing (an attempt admitted before it opened, or forced
	// past it). A Neutral outcome of the probe ends its claim's lock, so
	// that another attempt may probe at once.
	Outcome(ctx context.Context, upstream string, p CircuitPolicy, o Outcome, now time.Time) (Change, error)
	// Open opens upstream's circuit until until, or leaves it open until a
	// later end already set. A new open period ends the failure run and
	// every claim on the probe of the period before: none of them can
	// close the circuit afterwards. It keeps the period's length for the
	// next doubling.
	Open(ctx context.Context, upstream string, until, now time.Time) error
}

// Limits are one upstream's rate limits, which every replica sharing a
// State gives alike.
type Limits struct {
	Name     string // the upstream's
	RPM, TPM int    // per minute; 0: none
}

// Ask is what an attempt asks of Admit besides its upstream's limits.
type Ask struct {
	// Tokens is its TPM charge; a charge under 1 counts 1, one over TPM
	// counts TPM.
	Tokens int
	// Force admits past an open circuit, not past the hold or the limits
	// (the never-empty rule: every upstream is open, and the one that
	// recovers soonest is tried). It claims no probe.
	Force bool
	// Probe, when positive, claims a half-open circuit's probe for that
	// long; 0 never claims (the circuit then waits for an active probe).
	Probe time.Duration
	// Owed are requests and tokens the caller admitted on its own while
	// the store did not answer (its local share): they are taken from the
	// limits first, whether or not they are there (a bucket may then owe
	// more than its minute, and the next requests wait it out), so that
	// the fleet's bound holds across an outage.
	Owed Owed
}

// Owed is what a replica admitted without the store.
type Owed struct {
	Requests, Tokens int
}

// Verdict is the answer of Admit.
type Verdict struct {
	// Taken: the request and its tokens were taken.
	Taken bool
	// Probe, with Taken, is the token of the probe claim the attempt
	// carries (Outcome with it closes or reopens the circuit); "" when it
	// is not the probe.
	Probe string
	// Failing, with Taken: a run of failures is in progress, which the
	// attempt's success should end (Outcome).
	Failing bool
	// Open: the circuit keeps the attempt out until Until. An Until that
	// has passed means half-open with no probe in flight, and nothing
	// claimed it (Ask.Probe was 0).
	Open bool
	// Until is the end of the open period (or of the claim of the probe
	// in flight) when Open, else the end of the hold that keeps the
	// attempt out, if one does.
	Until time.Time
	// Wait, when nothing was taken and the circuit did not keep the
	// attempt out, is how long until it could be taken: the longest of
	// the hold's and the limits' waits.
	Wait time.Duration
	// Requests and Tokens are the backlogs of the RPM and TPM buckets
	// (how far their TATs are ahead of now; 0 for a full bucket or no
	// limit), after the request when Taken. Zero when Open.
	Requests, Tokens time.Duration
}

// CircuitPolicy is the rule of an upstream's circuit, which every replica
// gives alike.
type CircuitPolicy struct {
	// Failures is how many failures in a row are tolerated; one more opens
	// the circuit. 0 or less: failures never open a closed circuit (a
	// failure in half-open still opens it again).
	Failures int
	// Cooldown is the first open period.
	Cooldown time.Duration
	// MaxCooldown caps the open period, which each failure in half-open
	// doubles; at or under Cooldown, it never grows.
	MaxCooldown time.Duration
}

// Result sorts an attempt's outcome for the circuit.
type Result uint8

// Results.
const (
	Neutral Result = iota // neither: a 4xx, a canceled call
	Success               // a 2xx or 3xx
	Failure               // a 5xx, a 429, a connection error or a timeout
)

// Outcome is how an admitted attempt ended.
type Outcome struct {
	Result Result
	// Probe is the token of the probe claim the attempt carried
	// (Verdict.Probe), "" for any other attempt.
	Probe string
	// Hint, for a Failure, is how long the upstream asked to be left
	// alone (Retry-After): a circuit it opens stays open at least that
	// long.
	Hint time.Duration
}

// Change is what an Outcome did to the circuit.
type Change struct {
	// Opened is the end of the open period when the outcome opened the
	// circuit (from closed, or again from half-open); zero otherwise.
	Opened time.Time
	// Run is the failure run that opened a closed circuit; 0 when it
	// opened again from half-open, or did not open.
	Run int
	// Closed: the probe's success closed the circuit.
	Closed bool
}

// Ledger keeps budget spend: reservations and settled spend per budget
// key. Amounts are in nano-units (1e-9) of the billing currency, so sums
// are exact. Implementations are safe for concurrent use, and Reserve is
// atomic: two requests never both take the last of a budget.
type Ledger interface {
	// Reserve sets hold h.ID of k to h.Amount (a new hold, a top-up of
	// one, or a smaller amount, which always fits) if k's spend plus its
	// reservations, with h at its new amount, stay within limit. Reserving
	// the same hold twice at the same amount changes nothing, so a call
	// that may or may not have been applied (a timeout) can be repeated or
	// settled. A hold no longer counts once now passes h.Expires. A hold
	// already settled is not made again: a Reserve applied after the
	// Settle of its hold (a late reply) is refused.
	Reserve(ctx context.Context, k BudgetKey, limit int64, h Hold, now time.Time) (Reservation, error)
	// Settle ends hold id of k, whatever it holds (nothing when there is
	// no such hold: never made, settled, or expired), and adds spent to
	// k's spend. id "" settles no hold: it only adds spent.
	Settle(ctx context.Context, k BudgetKey, id string, spent int64, now time.Time) error
	// Usage returns k's spend and what its live holds reserve.
	Usage(ctx context.Context, k BudgetKey, now time.Time) (spent, reserved int64, err error)
	// Keys returns the keys budget has ledgers for in the window ending at
	// end, for relay.Router.Spend.
	Keys(ctx context.Context, budget string, end time.Time) ([]string, error)
}

// BudgetKey names one ledger: a budget, a scope key, and the window, by
// its end.
type BudgetKey struct {
	Budget string    // the budget's name
	Key    string    // the scope's key ("" for relay.AllTraffic)
	Window time.Time // the end of the window
}

// Hold is one request's reservation in one ledger.
type Hold struct {
	ID      string    // the request's, unique in the fleet
	Amount  int64     // all it reserves, in nano-units of the billing currency
	Expires time.Time // when it stops counting if never settled (relay.Budget.HoldFor)
}

// Reservation is the answer of Reserve.
type Reservation struct {
	// OK: the hold is set to its amount.
	OK bool
	// Left is what is left of the limit after the call: the limit less
	// k's spend and live reservations (the hold included when OK); it may
	// be negative when spend ran over.
	Left int64
}
