package relay

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeClock is a Clock that moves only when told to.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
	// waiting is signalled each time a timer is armed, so a test can wait
	// for the router to start waiting before it advances the clock.
	armed chan time.Duration
	// auto makes every wait return at once: the clock jumps forward by the
	// wait and the function runs before AfterFunc returns. waits records
	// the durations asked for.
	auto  bool
	waits []time.Duration
}

type fakeTimer struct {
	at      time.Time
	f       func()
	stopped bool
	fired   bool
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), armed: make(chan time.Duration, 64)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) func() bool {
	c.mu.Lock()
	if c.auto {
		c.waits = append(c.waits, d)
		c.now = c.now.Add(d)
		c.mu.Unlock()
		f()
		return func() bool { return false }
	}
	t := &fakeTimer{at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	c.mu.Unlock()
	select {
	case c.armed <- d:
	default:
	}
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		if t.fired || t.stopped {
			return false
		}
		t.stopped = true
		return true
	}
}

func newAutoClock() *fakeClock {
	c := newFakeClock()
	c.auto = true
	return c
}

// Waits returns the waits asked for so far.
func (c *fakeClock) Waits() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.waits...)
}

// Advance moves the clock and runs the timers that came due, in order.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []*fakeTimer
	for _, t := range c.timers {
		if !t.fired && !t.stopped && !t.at.After(c.now) {
			t.fired = true
			due = append(due, t)
		}
	}
	c.mu.Unlock()
	sort.Slice(due, func(i, j int) bool { return due[i].at.Before(due[j].at) })
	for _, t := range due {
		t.f()
	}
}

// reports collects OnReport calls.
type reports struct {
	mu   sync.Mutex
	list []Report
}

func (r *reports) add(rep Report) {
	r.mu.Lock()
	r.list = append(r.list, rep)
	r.mu.Unlock()
}

func (r *reports) all() []Report {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Report(nil), r.list...)
}

// trackedBody is a request body that counts its Close calls.
type trackedBody struct {
	io.Reader
	closes atomic.Int32
}

func (b *trackedBody) Close() error { b.closes.Add(1); return nil }

func newTrackedBody(s string) *trackedBody { return &trackedBody{Reader: bytes.NewBufferString(s)} }

// fixture reads a wire sample from testdata/openai-wire.
func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/openai-wire/" + name)
	if err != nil {
		t.Fatalf("fixture %s: %v", name, err)
	}
	return b
}

// roundTripFunc adapts a function to http.RoundTripper.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// roundTripAsync sends a chat request with ctx through rt on its own
// goroutine and delivers RoundTrip's error (the body, if any, is closed).
func roundTripAsync(rt http.RoundTripper, ctx context.Context) <-chan error {
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
		resp, err := rt.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	return errc
}
