package redisstate

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The outage tests kill servers on purpose: go-redis would log every
	// refused dial.
	redis.SetLogger(quiet{})
	if cfg := os.Getenv(replicaEnv); cfg != "" {
		os.Exit(runReplica(cfg)) // a replica of the fleet harness
	}
	goleak.VerifyTestMain(m)
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// closeClient closes c and waits for the goroutine go-redis starts to
// redial a server that refused it (it checks for the close once a second).
func closeClient(t testing.TB, c redis.UniversalClient) {
	c.Close()
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if !strings.Contains(string(buf[:runtime.Stack(buf, true)]), "tryDial") {
			return
		}
	}
	t.Error("go-redis still redials 3s after the client was closed")
}

// t0 is the fake time the tests start at.
var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// backend is a Redis a test runs against: miniredis in the process, or a
// real redis-server.
type backend struct {
	name  string
	mini  *miniredis.Miniredis // nil for a real server
	c     *redis.Client
	calls *counter // commands sent through c
}

// counter is a go-redis hook counting commands, one per round trip
// (no command here is pipelined).
type counter struct {
	mu    sync.Mutex
	n     atomic.Int64
	quiet atomic.Bool // do not record names (benchmarks)
	names []string
}

func (h *counter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}
func (h *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		if !h.quiet.Load() {
			name := cmd.Name()
			if args := cmd.Args(); name == "evalsha" && len(args) > 1 {
				name = scriptName(fmt.Sprint(args[1]))
			}
			h.mu.Lock()
			h.names = append(h.names, name)
			h.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

// scriptName names the script of an EVALSHA by its SHA1: "admit",
// "reserve", ...
func scriptName(sha string) string {
	for name, sc := range map[string]*script{"admit": admitScript, "refund": refundScript, "hold": holdScript, "outcome": outcomeScript,
		"open": openScript, "reserve": reserveScript, "settle": settleScript, "usage": usageScript} {
		if sc.sha == sha {
			return name
		}
	}
	return "evalsha"
}

// evals returns how many scripts were sent.
func (h *counter) evals() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, name := range h.names {
		if name == "eval" || name == "evalsha" || scripted[name] {
			n++
		}
	}
	return n
}

// scripted are the names scriptName gives.
var scripted = map[string]bool{"admit": true, "refund": true, "hold": true, "outcome": true, "open": true, "reserve": true, "settle": true, "usage": true}

// newClient returns a client for addr as the package recommends, closed
// when the test ends.
func newClient(t testing.TB, addr string) (*redis.Client, *counter) {
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	h := &counter{}
	c.AddHook(h)
	t.Cleanup(func() { c.Close() })
	return c, h
}

func newMini(t testing.TB) *backend {
	m := miniredis.RunT(t)
	c, h := newClient(t, m.Addr())
	return &backend{name: "miniredis", mini: m, c: c, calls: h}
}

// realAddr is the address of the real redis-server tests use.
func realAddr() string {
	if a := os.Getenv("RELAY_TEST_REDIS"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

// newReal returns the real redis-server at RELAY_TEST_REDIS (default
// 127.0.0.1:6379), or skips the test when none answers. CI checks that one
// does (.ci/redis-check).
func newReal(t testing.TB) *backend {
	c, h := newClient(t, realAddr())
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Skipf("no redis-server answers at %s (set RELAY_TEST_REDIS): %v", realAddr(), err)
	}
	return &backend{name: "redis", c: c, calls: h}
}

// runs counts the States made in this process, for unique prefixes.
var runs atomic.Int64

// state returns a State on b under a prefix of its own, whose keys are
// deleted when the test ends.
func (b *backend) state(t testing.TB, opts ...Option) *State {
	prefix := fmt.Sprintf("test-%d-%d-%d", os.Getpid(), time.Now().UnixNano(), runs.Add(1))
	t.Cleanup(func() { b.clean(t, prefix) })
	return New(b.c, append([]Option{WithPrefix(prefix)}, opts...)...)
}

// clean deletes every key under prefix.
func (b *backend) clean(t testing.TB, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	keys, err := b.c.Keys(ctx, "{relay:"+prefix+":*").Result()
	if err != nil {
		t.Logf("clean %s: %v", prefix, err)
		return
	}
	if len(keys) > 0 {
		b.c.Del(ctx, keys...)
	}
}

// keysUnder returns the keys of a State's prefix.
func (b *backend) keysUnder(t testing.TB, s *State) []string {
	keys, err := b.c.Keys(context.Background(), "{relay:"+s.prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// both runs f against miniredis and, when one answers, a real redis-server.
func both(t *testing.T, f func(t *testing.T, b *backend)) {
	t.Run("miniredis", func(t *testing.T) { f(t, newMini(t)) })
	t.Run("redis", func(t *testing.T) { f(t, newReal(t)) })
}

// ctxT bounds a test's Redis calls, so that a Redis that never answers
// ends the test instead of hanging it. The bound is not a verdict on
// speed: on a loaded host the concurrent tests' thousands of calls to
// miniredis (Lua run in Go) take more than the 5 s it once was.
func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func must[T any](t testing.TB) func(v T, err error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// check is must for goroutines other than the test's: it reports the
// error and goes on with the zero value.
func check[T any](t testing.TB) func(v T, err error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Error(err)
		}
		return v
	}
}

func noErr(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if strings.EqualFold(v, s) {
			return true
		}
	}
	return false
}
