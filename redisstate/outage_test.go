package redisstate

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tokenrelay/relay/store"
)

// server is a redis-server of the test's own, on a loopback port.
type server struct {
	t    *testing.T
	port string
	cmd  *exec.Cmd
}

// startServer starts a redis-server on a free loopback port (or on port,
// when given), without persistence, or skips the test when there is no
// redis-server on PATH.
func startServer(t *testing.T, port string) *server {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server is not on PATH: the outage tests need one to start and kill")
	}
	if port == "" {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port = strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
		l.Close()
	}
	s := &server{t: t, port: port}
	s.cmd = exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.kill)
	c := redis.NewClient(&redis.Options{Addr: s.addr(), MaxRetries: -1})
	defer c.Close()
	for deadline := time.Now().Add(10 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on port %s does not answer: %v", port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *server) addr() string { return "127.0.0.1:" + s.port }

// kill ends the server with SIGKILL, by its PID, and reaps it.
func (s *server) kill() {
	if s.cmd.ProcessState != nil {
		return
	}
	s.cmd.Process.Kill()
	s.cmd.Wait()
}

func (s *server) signal(sig syscall.Signal) {
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatal(err)
	}
}

var policy = store.CircuitPolicy{Failures: 2, Cooldown: 30 * time.Second, MaxCooldown: 5 * time.Minute}

// calls makes one call of each kind, each bounded by its own deadline d,
// and returns the errors and the longest time one took.
func calls(s *State, d time.Duration, now time.Time) (errs []error, longest time.Duration) {
	u := store.Limits{Name: "a", RPM: 1_000_000, TPM: 1_000_000}
	k := store.BudgetKey{Budget: "b", Window: now.Truncate(time.Hour).Add(time.Hour)}
	for _, f := range []func(ctx context.Context) error{
		func(ctx context.Context) error { _, err := s.Admit(ctx, u, store.Ask{Tokens: 10}, now); return err },
		func(ctx context.Context) error { return s.Refund(ctx, u, 1, 10, now) },
		func(ctx context.Context) error { return s.Hold(ctx, "a", now, now) },
		func(ctx context.Context) error {
			_, err := s.Outcome(ctx, "a", policy, store.Outcome{Result: store.Failure}, now)
			return err
		},
		func(ctx context.Context) error {
			_, err := s.Outcome(ctx, "a", policy, store.Outcome{Result: store.Success}, now)
			return err
		},
		func(ctx context.Context) error { return s.Open(ctx, "a", now, now) },
		func(ctx context.Context) error {
			_, err := s.Reserve(ctx, k, 1<<62, store.Hold{ID: "h", Amount: 1}, now)
			return err
		},
		func(ctx context.Context) error { return s.Settle(ctx, k, "h", 1, now) },
		func(ctx context.Context) error { _, _, err := s.Usage(ctx, k, now); return err },
		func(ctx context.Context) error { _, err := s.Keys(ctx, "b", k.Window); return err },
	} {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		start := time.Now()
		err := f(ctx)
		longest = max(longest, time.Since(start))
		cancel()
		errs = append(errs, err)
	}
	return errs, longest
}

func allFailed(errs []error) bool {
	for _, err := range errs {
		if err == nil {
			return false
		}
	}
	return true
}

func firstErr(errs []error) error {
	return errors.Join(errs...)
}

// slack is what a call may take past its deadline on a loaded 2-core
// machine (the race detector included) and still count as prompt.
const slack = 100 * time.Millisecond

// TestRedisKilled: a redis-server killed by its PID while replicas call it
// makes every call fail within its deadline, with no retry; restarted on
// the same port, it serves the same State again (go-redis reconnects, the
// scripts load again) with no help.
func TestRedisKilled(t *testing.T) {
	srv := startServer(t, "")
	// go-redis's defaults (three retries with backoff) are left on: the
	// State turns them off per command.
	c := redis.NewClient(&redis.Options{Addr: srv.addr(), ContextTimeoutEnabled: true})
	defer closeClient(t, c)
	s := New(c)
	const deadline = 10 * time.Millisecond
	if errs, _ := calls(s, time.Second, t0); !allOK(errs) {
		t.Fatalf("before the kill: %v", firstErr(errs))
	}

	// Replicas call without pause while the server is killed.
	var stop atomic.Bool
	var wg sync.WaitGroup
	var mu sync.Mutex
	var longest time.Duration
	var failed, ok int
	for range 4 {
		wg.Go(func() {
			for !stop.Load() {
				time.Sleep(time.Millisecond) // a replica's traffic, not a busy loop
				errs, l := calls(s, deadline, t0)
				mu.Lock()
				longest = max(longest, l)
				for _, err := range errs {
					if err != nil {
						failed++
					} else {
						ok++
					}
				}
				mu.Unlock()
			}
		})
	}
	time.Sleep(100 * time.Millisecond)
	srv.kill()
	time.Sleep(300 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	t.Logf("while killed: %d calls succeeded (before the kill), %d failed; longest call %s (deadline %s)", ok, failed, longest, deadline)
	if failed == 0 || ok == 0 {
		t.Fatalf("%d ok, %d failed: the kill did not happen mid-run", ok, failed)
	}
	if longest > deadline+slack {
		t.Fatalf("a call took %s, past its deadline %s", longest, deadline)
	}
	// Down: every call fails, promptly.
	errs, l := calls(s, deadline, t0)
	if !allFailed(errs) || l > deadline+slack {
		t.Fatalf("Redis down: errors %v, longest %s", errs, l)
	}

	restarted := startServer(t, srv.port)
	defer restarted.kill()
	var recovered time.Duration
	for start := time.Now(); ; {
		errs, _ := calls(s, 50*time.Millisecond, t0)
		if allOK(errs) {
			recovered = time.Since(start)
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("no recovery 10s after the restart: %v", firstErr(errs))
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("every call succeeds %s after the restart", recovered.Round(time.Millisecond))
}

// TestRedisStalled: a redis-server that stops answering (SIGSTOP) fails
// every call at its deadline, whether or not the client has
// ContextTimeoutEnabled; once it answers again (SIGCONT) the calls
// succeed.
func TestRedisStalled(t *testing.T) {
	srv := startServer(t, "")
	for _, ctxTimeouts := range []bool{true, false} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", ctxTimeouts), func(t *testing.T) {
			c := redis.NewClient(&redis.Options{Addr: srv.addr(), ContextTimeoutEnabled: ctxTimeouts, ReadTimeout: 2 * time.Second})
			defer closeClient(t, c)
			s := New(c, WithFailFast(3, 200*time.Millisecond))
			if s.run == ctxTimeouts {
				t.Fatalf("New did not see ContextTimeoutEnabled=%v", ctxTimeouts)
			}
			if errs, _ := calls(s, time.Second, t0); !allOK(errs) {
				t.Fatalf("before the stop: %v", firstErr(errs))
			}
			srv.signal(syscall.SIGSTOP)
			const deadline = 20 * time.Millisecond
			errs, longest := calls(s, deadline, t0)
			srv.signal(syscall.SIGCONT)
			if !allFailed(errs) {
				t.Fatalf("a call succeeded against a stopped server: %v", errs)
			}
			// The first six calls are upstream a's (one hash tag), the
			// others budget b's: each tag fails fast on its own.
			for i, err := range errs {
				timeout := errors.Is(err, context.DeadlineExceeded) || isTimeout(err)
				first := i < 3 || i >= 6 && i < 9
				if first && !timeout || !first && !errors.Is(err, ErrUnavailable) {
					t.Fatalf("call %d: %v, want a timeout for the first 3 calls of each hash tag and ErrUnavailable (fail-fast) after", i, err)
				}
			}
			t.Logf("stopped server: 10 calls failed (3 timeouts per hash tag, then fail-fast), the longest in %s (deadline %s)", longest, deadline)
			for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
				errs, _ := calls(s, time.Second, t0)
				if allOK(errs) {
					break
				}
				if time.Since(start) > 10*time.Second {
					t.Fatalf("no recovery after SIGCONT: %v", firstErr(errs))
				}
			}
		})
	}
}

// TestFailFast: after three calls in a row time out, calls fail at once
// without a round trip; every backoff one call alone tries Redis again;
// once Redis answers, calls go through again.
func TestFailFast(t *testing.T) {
	srv := startServer(t, "")
	c, h := newClient(t, srv.addr())
	s := New(c, WithFailFast(3, 300*time.Millisecond))
	u := store.Limits{Name: "a", RPM: 1000}
	admit := func(d time.Duration) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		start := time.Now()
		_, err := s.Admit(ctx, u, store.Ask{}, t0)
		return time.Since(start), err
	}
	if _, err := admit(time.Second); err != nil {
		t.Fatal(err)
	}
	srv.signal(syscall.SIGSTOP)
	defer srv.signal(syscall.SIGCONT)
	for i := range 3 {
		if _, err := admit(20 * time.Millisecond); err == nil || errors.Is(err, ErrUnavailable) {
			t.Fatalf("call %d to a stopped server: %v, want a timeout", i, err)
		}
	}
	sent := h.evals()
	for i := range 100 {
		if d, err := admit(20 * time.Millisecond); !errors.Is(err, ErrUnavailable) || d > time.Millisecond+slack/10 {
			t.Fatalf("call %d after 3 timeouts: %v in %s, want ErrUnavailable at once", i, err, d)
		}
	}
	if n := h.evals() - sent; n != 0 {
		t.Fatalf("%d commands sent while failing fast", n)
	}
	// After the backoff, one of many concurrent calls is sent.
	time.Sleep(300 * time.Millisecond)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() { admit(20 * time.Millisecond) })
	}
	wg.Wait()
	if n := h.evals() - sent; n != 1 {
		t.Fatalf("%d commands sent by concurrent calls after the backoff, want 1", n)
	}
	srv.signal(syscall.SIGCONT)
	time.Sleep(300 * time.Millisecond)
	if _, err := admit(time.Second); err != nil {
		t.Fatalf("the first call after the backoff, Redis answering: %v", err)
	}
	if _, err := admit(time.Second); err != nil {
		t.Fatalf("the call after a success: %v", err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func allOK(errs []error) bool { return firstErr(errs) == nil }

// TestCanceledContext: a call whose context is already done fails at once,
// without a round trip.
func TestCanceledContext(t *testing.T) {
	b := newMini(t)
	s := b.state(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	before := b.calls.n.Load()
	if _, err := s.Admit(ctx, store.Limits{Name: "a", RPM: 1}, store.Ask{}, t0); !errors.Is(err, context.Canceled) {
		t.Fatalf("Admit with a canceled context: %v", err)
	}
	if _, err := s.Reserve(ctx, store.BudgetKey{Budget: "b", Window: w1}, 10, store.Hold{ID: "h", Amount: 1}, t0); !errors.Is(err, context.Canceled) {
		t.Fatalf("Reserve with a canceled context: %v", err)
	}
	if n := b.calls.n.Load() - before; n != 0 {
		t.Fatalf("%d commands sent with a canceled context", n)
	}
}
