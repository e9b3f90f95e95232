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
	"github.com/tokenrelay/relay/store"
)

// State is a store.State kept on Redis: every replica of a service that
// uses the same Redis (and the same prefix) shares its upstreams' rate
// limits, holds and circuits, and its budgets. It is safe for concurrent
// use. Make one with New.
type State struct {
	c      redis.UniversalClient
	prefix string // escaped, with the trailing ':'
	run    bool   // true: run each command on its own goroutine (see New)
	keep   time.Duration
	ledger time.Duration
	failRun,
	openKeep time.Duration

	// Fail-fast, judged per hash tag (so per Redis Cluster slot): after
	// failFast calls in a row to one tag fail for want of an answer, its
	// calls fail at once with ErrUnavailable until its backoff ends;
	// then one call tries Redis again, every backoff.
	failFast int64
	backoff  time.Duration

	ups     sync.Map // upstream name -> *upKeys
	budgets sync.Map // budget name -> *budgetTag
}

// failFast is the fail-fast switch of one hash tag.
type failFast struct {
	fails     atomic.Int64
	downUntil atomic.Int64 // wall clock, Unix ns; 0: up
}

// ErrUnavailable is the error of a call made while Redis is taken to be
// unreachable (see WithFailFast): it was not sent.
var ErrUnavailable = errors.New("redisstate: redis unavailable")

var _ store.State = (*State)(nil)

// Option configures a State.
type Option func(*State)

// WithPrefix sets the prefix of every key the State writes (default
// "default"), so that several services, or several routers with their own
// upstreams, can share one Redis: States with the same prefix share
// everything, States with different prefixes nothing.
func WithPrefix(prefix string) Option {
	return func(s *State) { s.prefix = escape(prefix) + ":" }
}

// WithFailureRun sets how long a run of consecutive failures of an
// upstream is remembered after its last failure (default
// store.DefaultFailureRun, a day): failures further apart never add up to
// an open circuit.
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
// does not answer: after failures calls in a row for the keys of one hash
// tag (one upstream's, one budget's: one slot of a Redis Cluster) fail for
// want of an answer (a timeout, a refused or broken connection; not a
// canceled context, not an error reply), every call for that tag fails at
// once with ErrUnavailable, and every backoff one call is sent to try
// Redis again; its success ends the fail-fast. A dead Cluster master thus
// puts only the upstreams and budgets whose keys it holds into fallback.
// Default 10 failures, 100 ms; failures of 0 or less turns it off (every
// call then waits out its deadline while Redis stalls).
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
// router gives it Config.StateTimeout and decides from its local share
// when the call fails. No command is retried. Create the client with
// ContextTimeoutEnabled: true, so that go-redis applies the context's
// deadline to the connection itself; a client without it (or whose
// options New cannot see) is still bounded by the context, by running each
// command on a goroutine of its own that the call stops waiting for when
// the context ends (the command then ends by the client's own
// ReadTimeout). When Redis is down, calls fail at once (the connection is
// refused) or at their deadline, and go-redis reconnects by itself when
// Redis is back. New does not contact Redis; Load does.
func New(client redis.UniversalClient, opts ...Option) *State {
	s := &State{
		c:        client,
		prefix:   "default:",
		keep:     time.Minute,
		ledger:   24 * time.Hour,
		failRun:  store.DefaultFailureRun,
		openKeep: store.OpenKeep,
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
// trip, and opens connections ahead of traffic: as many as the client's
// MinIdleConns (a *redis.Client's or *redis.ClusterClient's; at most 64),
// so that the first calls of a busy replica do not each wait for a dial.
// Calls load the scripts by themselves otherwise. It is also a health
// check. Call it once at startup.
func (s *State) Load(ctx context.Context) error {
	for _, sc := range scripts {
		if err := s.c.ScriptLoad(ctx, sc.src).Err(); err != nil {
			return fmt.Errorf("redisstate: load scripts: %w", err)
		}
	}
	n := 0
	switch c := s.c.(type) {
	case *redis.Client:
		n = c.Options().MinIdleConns
	case *redis.ClusterClient:
		n = c.Options().MinIdleConns
	}
	errs := make(chan error, min(n, 64))
	for range cap(errs) {
		go func() { errs <- s.c.Ping(ctx).Err() }()
	}
	var err error
	for range cap(errs) {
		err = errors.Join(err, <-errs)
	}
	if err != nil {
		return fmt.Errorf("redisstate: open connections: %w", err)
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
	state []string // the hash: its limits, hold and circuit (KEYS of its scripts)
	ff    failFast
}

// keys returns the keys of upstream name: {relay:<prefix>:u:<name>}:s.
func (s *State) keys(name string) *upKeys {
	if k, ok := s.ups.Load(name); ok {
		return k.(*upKeys)
	}
	k := &upKeys{state: []string{"{relay:" + s.prefix + "u:" + escape(name) + "}:s"}}
	v, _ := s.ups.LoadOrStore(name, k)
	return v.(*upKeys)
}

// budgetTag is a budget's hash tag, {relay:<prefix>:b:<budget>}, and its
// fail-fast switch.
type budgetTag struct {
	tag string
	ff  failFast
}

func (s *State) budget(name string) *budgetTag {
	if b, ok := s.budgets.Load(name); ok {
		return b.(*budgetTag)
	}
	b := &budgetTag{tag: "{relay:" + s.prefix + "b:" + escape(name) + "}"}
	v, _ := s.budgets.LoadOrStore(name, b)
	return v.(*budgetTag)
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

// do runs one command on the keys of a hash tag whose fail-fast switch
// is ff, bounded by ctx.
func (s *State) do(ctx context.Context, ff *failFast, args ...any) *redis.Cmd {
	cmd := redis.NewCmd(ctx, args...)
	if err := ctx.Err(); err != nil {
		cmd.SetErr(err)
		return cmd
	}
	if !s.pass(ff) {
		cmd.SetErr(ErrUnavailable)
		return cmd
	}
	if s.run {
		cmd = s.process(ctx, cmd)
	} else {
		_ = s.c.Process(ctx, noRetry{cmd})
	}
	s.record(ctx, ff, cmd.Err())
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

// pass reports whether a call may be sent: yes unless its tag fails
// fast, and then only the first call after each backoff.
func (s *State) pass(ff *failFast) bool {
	u := ff.downUntil.Load()
	if u == 0 {
		return true
	}
	now := time.Now().UnixNano()
	return now >= u && ff.downUntil.CompareAndSwap(u, now+int64(s.backoff))
}

// record counts a call's outcome for its tag's fail-fast.
func (s *State) record(ctx context.Context, ff *failFast, err error) {
	var reply redis.Error
	if err == nil || errors.Is(err, redis.Nil) || errors.As(err, &reply) {
		if ff.fails.Load() != 0 {
			ff.fails.Store(0)
			ff.downUntil.Store(0)
		}
		return
	}
	if s.failFast <= 0 || errors.Is(ctx.Err(), context.Canceled) {
		return
	}
	if ff.fails.Add(1) >= s.failFast {
		ff.downUntil.Store(time.Now().Add(s.backoff).UnixNano())
	}
}

// ms returns d in whole milliseconds, at least 1 (a TTL of 0 is refused).
func ms(d time.Duration) int64 {
	return max(int64((d+time.Millisecond-1)/time.Millisecond), 1)
}

// ttl returns how long a key that matters until until must live, at now:
// until then, plus keep.
func ttl(until, now time.Time, keep time.Duration) int64 {
	return ms(max(until.Sub(now), 0) + keep)
}

// upArgs are the first arguments of an upstream's scripts: now (µs), how
// long its hash outlives what it holds (ms), how long a half-open circuit
// waits for a probe and a failure run is remembered (µs).
func (s *State) upArgs(now time.Time, more ...any) []any {
	return append([]any{now.UnixMicro(), ms(s.keep), s.openKeep.Microseconds(), s.failRun.Microseconds()}, more...)
}

func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("redisstate: %s: %w", op, err)
}
