package redisstate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tokenrelay/relay"
)

// State is a relay.State kept on Redis: every replica of a service that
// uses the same Redis (and the same prefix) shares its upstreams' rate
// limits, holds and circuits, and its budgets. It is safe for concurrent
// use. Make one with New.
type State struct {
	c      redis.UniversalClient
	prefix string // escaped, with the trailing ':'
	clock  func() time.Time
	run    bool // true: run each command on its own goroutine (see New)
	keep   time.Duration
	ledger time.Duration
	failRun,
	openKeep time.Duration

	// Fail-fast: after failFast calls in a row fail for want of an answer,
	// calls fail at once with ErrUnavailable until downUntil (wall clock,
	// Unix ns); then one call tries Redis again, every backoff.
	failFast  int64
	backoff   time.Duration
	fails     atomic.Int64
	downUntil atomic.Int64

	ups sync.Map // upstream name -> *upKeys
}

// ErrUnavailable is the error of a call made while Redis is taken to be
// unreachable (see WithFailFast): it was not sent.
var ErrUnavailable = errors.New("redisstate: redis unavailable")

var _ relay.State = (*State)(nil)

// Option configures a State.
type Option func(*State)

// WithPrefix sets the prefix of every key the State writes (default
// "default"), so that several services, or several routers with their own
// upstreams, can share one Redis: States with the same prefix share
// everything, States with different prefixes nothing.
func WithPrefix(prefix string) Option {
	return func(s *State) { s.prefix = escape(prefix) + ":" }
}

// WithClock sets the clock that decides how long keys live (their TTL),
// for the calls that are given no time: Hold, Open, Reserve and Settle.
// Default time.Now. It never decides an admission, a budget or a circuit:
// those are decided from the times the router passes (see the package
// documentation on clocks). A test with a fake clock far from the real
// time passes its clock here.
func WithClock(now func() time.Time) Option {
	return func(s *State) { s.clock = now }
}

// WithFailureRun sets how long a run of consecutive failures of an
// upstream is remembered after its last failure (default one minute): a
// run that stops without a success is forgotten after that, so failures
// minutes apart never add up to an open circuit.
func WithFailureRun(d time.Duration) Option {
	return func(s *State) {
		if d > 0 {
			s.failRun = d
		}
	}
}

// WithBudgetRetention sets how long a budget's ledger for a window is kept
// after the window ends (default 24 hours), for Usage and Keys of past
// windows.
func WithBudgetRetention(d time.Duration) Option {
	return func(s *State) {
		if d > 0 {
			s.ledger = d
		}
	}
}

// WithFailFast sets when the State stops sending calls to a Redis that
// does not answer: after failures calls in a row fail for want of an
// answer (a timeout, a refused or broken connection; not a canceled
// context, not an error reply), every call fails at once with
// ErrUnavailable, and every backoff one call is sent to try Redis again;
// its success ends the fail-fast. Default 10 failures, 100 ms; failures
// of 0 or less turns it off (every call then waits out its deadline while
// Redis stalls). Calls that time out because the caller's process is
// overloaded count too: the replica then decides from its in-process
// state for a backoff, which keeps it within its share of the limits.
func WithFailFast(failures int, backoff time.Duration) Option {
	return func(s *State) {
		s.failFast = int64(failures)
		if backoff > 0 {
			s.backoff = backoff
		}
	}
}

// New returns a State on client, a *redis.Client, *redis.ClusterClient,
// *redis.Ring, a failover client, or anything else that implements
// redis.UniversalClient. Every key of one upstream carries the same hash
// tag, and so does every key of one budget, so each script touches a
// single slot of a Redis Cluster.
//
// Each call makes one round trip and is bounded by its context: the
// router gives it a deadline of a few milliseconds and decides from its
// in-process state when the call fails. No command is retried. Create the
// client with ContextTimeoutEnabled: true, so that go-redis applies the
// context's deadline to the connection itself; a client without it (or
// whose options New cannot see) is still bounded by the context, by
// running each command on a goroutine of its own that the call stops
// waiting for when the context ends (the command then ends by the
// client's own ReadTimeout). When Redis is down, calls fail at once (the
// connection is refused) or at their deadline, and go-redis reconnects by
// itself when Redis is back. New does not contact Redis; Load does.
func New(client redis.UniversalClient, opts ...Option) *State {
	s := &State{
		c:        client,
		prefix:   "default:",
		clock:    time.Now,
		keep:     time.Minute,
		ledger:   24 * time.Hour,
		failRun:  time.Minute,
		openKeep: 10 * time.Minute,
		failFast: 10,
		backoff:  100 * time.Millisecond,
		run:      !contextTimeouts(client),
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

// contextTimeouts reports whether the client applies a context's deadline
// to its connections.
func contextTimeouts(c redis.UniversalClient) bool {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// Load loads the State's scripts into Redis (on every primary of a
// cluster), so that the first call of each does not pay a second round
// trip; calls load them by themselves otherwise. It is also a health
// check.
func (s *State) Load(ctx context.Context) error {
	for _, sc := range scripts {
		if err := s.c.ScriptLoad(ctx, sc.src).Err(); err != nil {
			return fmt.Errorf("redisstate: load scripts: %w", err)
		}
	}
	return nil
}

// ClockOffset returns how far now is ahead of Redis's clock (TIME), less
// half the round trip. Every replica's clock decides its admissions (see
// the package documentation); a monitor that compares each replica's
// offset can alert when they drift apart.
func (s *State) ClockOffset(ctx context.Context, now time.Time) (time.Duration, error) {
	start := time.Now()
	t, err := s.c.Time(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("redisstate: time: %w", err)
	}
	rtt := time.Since(start)
	return now.Sub(t.Add(rtt / 2)), nil
}

// upKeys are the keys of one upstream, all under one hash tag.
type upKeys struct {
	admit [7]string // open, probe, hold, rpm, tpm, reopened, fails: the Admit script's KEYS
	fails string
	claim string // the tokens of the probe claims of the open period (a set)
}

func (k *upKeys) open() string  { return k.admit[0] }
func (k *upKeys) probe() string { return k.admit[1] }
func (k *upKeys) hold() string  { return k.admit[2] }
func (k *upKeys) rpm() string   { return k.admit[3] }
func (k *upKeys) tpm() string   { return k.admit[4] }

// reopened exists from the moment an open period starts until a caller
// sees it over (Admit): a probe claimed on an older view of the circuit
// is refused while it exists.
func (k *upKeys) reopened() string { return k.admit[5] }

// keys returns the keys of upstream name: {relay:<prefix>:u:<name>}:<what>.
func (s *State) keys(name string) *upKeys {
	if k, ok := s.ups.Load(name); ok {
		return k.(*upKeys)
	}
	tag := "{relay:" + s.prefix + "u:" + escape(name) + "}:"
	k := &upKeys{
		admit: [7]string{tag + "open", tag + "probe", tag + "hold", tag + "rpm", tag + "tpm", tag + "reopened", tag + "fails"},
		fails: tag + "fails",
		claim: tag + "claim",
	}
	v, _ := s.ups.LoadOrStore(name, k)
	return v.(*upKeys)
}

// budgetTag returns the hash tag of budget's keys: {relay:<prefix>:b:<budget>}.
func (s *State) budgetTag(budget string) string {
	return "{relay:" + s.prefix + "b:" + escape(budget) + "}"
}

var escaper = strings.NewReplacer("%", "%25", ":", "%3A", "{", "%7B", "}", "%7D")

// escape makes a name safe inside a hash tag and unambiguous between the
// colons of a key: %, :, { and } are percent-encoded.
func escape(name string) string {
	if !strings.ContainsAny(name, "%:{}") {
		return name
	}
	return escaper.Replace(name)
}

// noRetry is a command go-redis never retries: a script that took tokens
// must not take them twice, and a retry would outlast the caller's
// deadline anyway.
type noRetry struct{ *redis.Cmd }

func (noRetry) NoRetry() bool { return true }

// do runs one command, bounded by ctx.
func (s *State) do(ctx context.Context, args ...any) *redis.Cmd {
	cmd := redis.NewCmd(ctx, args...)
	if err := ctx.Err(); err != nil {
		cmd.SetErr(err)
		return cmd
	}
	if !s.pass() {
		cmd.SetErr(ErrUnavailable)
		return cmd
	}
	if s.run {
		cmd = s.process(ctx, cmd)
	} else {
		_ = s.c.Process(ctx, noRetry{cmd})
	}
	s.record(ctx, cmd.Err())
	return cmd
}

// process runs cmd on a goroutine of its own, and stops waiting for it
// when ctx ends: for clients that do not bound their connections by the
// context.
func (s *State) process(ctx context.Context, cmd *redis.Cmd) *redis.Cmd {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.c.Process(ctx, noRetry{cmd})
	}()
	select {
	case <-done:
		return cmd
	case <-ctx.Done():
		// The command goes on until the client's own timeouts end it;
		// its result is dropped.
		out := redis.NewCmd(ctx)
		out.SetErr(ctx.Err())
		return out
	}
}

// pass reports whether a call may be sent: yes unless the State fails
// fast, and then only the first call after each backoff.
func (s *State) pass() bool {
	u := s.downUntil.Load()
	if u == 0 {
		return true
	}
	now := time.Now().UnixNano()
	return now >= u && s.downUntil.CompareAndSwap(u, now+int64(s.backoff))
}

// record counts a call's outcome for the fail-fast.
func (s *State) record(ctx context.Context, err error) {
	var reply redis.Error
	if err == nil || errors.Is(err, redis.Nil) || errors.As(err, &reply) {
		if s.fails.Load() != 0 {
			s.fails.Store(0)
			s.downUntil.Store(0)
		}
		return
	}
	if s.failFast <= 0 || errors.Is(ctx.Err(), context.Canceled) {
		return
	}
	if s.fails.Add(1) >= s.failFast {
		s.downUntil.Store(time.Now().Add(s.backoff).UnixNano())
	}
}

// ms returns d in whole milliseconds, at least 1 (a TTL of 0 is refused).
func ms(d time.Duration) int64 {
	return max(int64((d+time.Millisecond-1)/time.Millisecond), 1)
}

// ttl returns how long a key that matters until until must live: until
// that moment by the State's clock, plus keep.
func (s *State) ttl(until time.Time, keep time.Duration) int64 {
	return ms(max(until.Sub(s.clock()), 0) + keep)
}

func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("redisstate: %s: %w", op, err)
}
