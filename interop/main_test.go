package interop

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	. "github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relaytest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// reports collects a router's reports.
type reports struct {
	mu   sync.Mutex
	list []Report
}

func (r *reports) add(rep Report) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.list = append(r.list, rep)
}

func (r *reports) all() []Report {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Report(nil), r.list...)
}

// newTestRouter builds a router whose reports it collects, trying the
// upstreams in configuration order unless cfg sets a strategy or a jitter.
func newTestRouter(t *testing.T, cfg Config) (*Router, *reports) {
	t.Helper()
	if cfg.Strategy == StrategyAffinity && cfg.Jitter == 0 {
		cfg.Strategy = StrategyPriority
	}
	reps := &reports{}
	cfg.OnReport = reps.add
	r, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(r.CloseIdleConnections)
	return r, reps
}

// newServers starts n fake upstreams named u0, u1...
func newServers(t *testing.T, n int) []*relaytest.Server {
	srvs := make([]*relaytest.Server, n)
	for i := range srvs {
		srvs[i] = newFakeServer(t, relaytest.WithName(fmt.Sprintf("u%d", i)))
	}
	return srvs
}

// newFakeServer starts a fake upstream that t closes.
func newFakeServer(t *testing.T, opts ...relaytest.Option) *relaytest.Server {
	srv := relaytest.NewServer(opts...)
	t.Cleanup(srv.Close)
	return srv
}

// newSSEUpstream starts a fake upstream that answers every call with body
// as an event stream.
func newSSEUpstream(t *testing.T, body []byte) *relaytest.Server {
	srv := newFakeServer(t)
	srv.SetDefault(relaytest.Fault{Body: string(body), ContentType: "text/event-stream"})
	return srv
}

// newSilentUpstream starts a fake upstream that never answers: each call
// ends when its caller goes away.
func newSilentUpstream(t *testing.T) *relaytest.Server {
	srv := newFakeServer(t)
	srv.SetDefault(relaytest.Fault{Hang: true})
	return srv
}

// fixture reads a wire sample from testdata/openai-wire.
func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/openai-wire/" + name)
	require.NoError(t, err)
	return b
}

// testClock is a Clock that moves only when Advance says so; armed
// receives the length of every wait the router starts. With jump set, a
// wait ends at once instead, the clock moving on by its length.
type testClock struct {
	mu     sync.Mutex
	now    time.Time
	jump   bool
	armed  chan time.Duration
	timers []*testTimer
}

type testTimer struct {
	at   time.Time
	f    func()
	done bool // fired or stopped
}

func newTestClock() *testClock {
	return &testClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), armed: make(chan time.Duration, 64)}
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) AfterFunc(d time.Duration, f func()) func() bool {
	c.mu.Lock()
	if c.jump {
		c.now = c.now.Add(d)
		c.mu.Unlock()
		f()
		return func() bool { return false }
	}
	tm := &testTimer{at: c.now.Add(d), f: f}
	c.timers = append(c.timers, tm)
	c.mu.Unlock()
	select {
	case c.armed <- d:
	default:
	}
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		stopped := !tm.done
		tm.done = true
		return stopped
	}
}

// Advance moves the clock by d and runs the timers that came due.
func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []*testTimer
	for _, tm := range c.timers {
		if !tm.done && !tm.at.After(c.now) {
			tm.done = true
			due = append(due, tm)
		}
	}
	c.mu.Unlock()
	for _, tm := range due {
		tm.f()
	}
}
