package relaytest_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relaytest"
)

var _ relay.Clock = (*relaytest.Clock)(nil)

func TestClockRunsTimersInOrderOnAdvance(t *testing.T) {
	start := time.Date(2030, 5, 6, 7, 8, 9, 0, time.UTC)
	c := relaytest.NewClock(start)
	assert.Equal(t, start, c.Now())
	var ran []string
	at := func(name string) func() {
		return func() { ran = append(ran, fmt.Sprintf("%s@%s", name, c.Now().Sub(start))) }
	}
	c.AfterFunc(3*time.Second, at("c"))
	c.AfterFunc(time.Second, func() {
		at("a")()
		c.AfterFunc(time.Second, at("b")) // due at 2s: within this Advance
	})
	stopD := c.AfterFunc(4*time.Second, at("d"))
	c.AfterFunc(10*time.Second, at("e"))
	assert.Equal(t, 4, c.Pending())

	assert.True(t, stopD(), "stopped before it ran")
	assert.False(t, stopD(), "stopped already")
	c.Advance(5 * time.Second)
	assert.Equal(t, []string{"a@1s", "b@2s", "c@3s"}, ran)
	assert.Equal(t, start.Add(5*time.Second), c.Now())
	assert.Equal(t, 1, c.Pending())

	stopE := c.AfterFunc(0, at("f"))
	c.Advance(0)
	assert.Equal(t, "f@5s", ran[len(ran)-1], "a zero wait runs at the next Advance")
	assert.False(t, stopE(), "it ran: nothing to stop")
	c.Advance(time.Hour)
	assert.Equal(t, "e@10s", ran[len(ran)-1])
	assert.Zero(t, c.Pending())
}

func TestClockWaitPending(t *testing.T) {
	c := relaytest.NewClock(time.Time{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.ErrorIs(t, c.WaitPending(ctx, 1), context.Canceled)
	assert.NoError(t, c.WaitPending(context.Background(), 0))

	done := make(chan struct{})
	go c.AfterFunc(time.Second, func() { close(done) })
	require.NoError(t, c.WaitPending(context.Background(), 1))
	c.Advance(time.Second)
	<-done
}

// TestClockDrivesRouterBackoff: a request waiting out a retry's backoff
// waits on the fake clock, and goes on when the test advances it, however
// long the backoff.
func TestClockDrivesRouterBackoff(t *testing.T) {
	clock := relaytest.NewClock(time.Time{})
	srv := relaytest.NewServer()
	defer srv.Close()
	srv.Script(relaytest.Fault{Status: http.StatusServiceUnavailable})
	var rep relay.Report
	router, err := relay.New(relay.Config{
		Upstreams: []relay.Upstream{{Name: "a", BaseURL: srv.URL}},
		Retry:     relay.RetryConfig{InitialInterval: time.Hour, MaxInterval: time.Hour, RandomizationFactor: -1},
		Clock:     clock,
		OnReport:  func(r relay.Report) { rep = r },
	})
	require.NoError(t, err)
	defer router.CloseIdleConnections()

	status := make(chan int, 1)
	go func() {
		resp, err := (&http.Client{Transport: router}).Post(srv.URL+"/chat/completions", "application/json",
			strings.NewReader(`{"model":"gpt-4.1","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			status <- 0
			return
		}
		resp.Body.Close()
		status <- resp.StatusCode
	}()
	require.NoError(t, clock.WaitPending(context.Background(), 1)) // the backoff
	assert.Equal(t, 1, srv.Calls())
	clock.Advance(time.Hour)
	assert.Equal(t, http.StatusOK, <-status)
	assert.Equal(t, 2, rep.Attempts)
	assert.Equal(t, time.Hour, rep.Latency, "the router's time is the clock's")
}

// ExampleClock tests a rate limit without waiting for it: the upstream
// allows one request a minute, and a minute passes when the test says so.
func ExampleClock() {
	srv := relaytest.NewServer()
	defer srv.Close()
	clock := relaytest.NewClock(time.Time{})
	router, err := relay.New(relay.Config{
		Upstreams: []relay.Upstream{{Name: "a", BaseURL: srv.URL, RPM: 1}},
		Limits:    relay.Limits{MaxWait: -1}, // refuse at once rather than wait
		Clock:     clock,
	})
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: router}
	send := func() string {
		resp, err := client.Post(srv.URL+"/chat/completions", "application/json",
			strings.NewReader(`{"model":"gpt-4.1","messages":[{"role":"user","content":"hi"}]}`))
		if errors.Is(err, relay.ErrRateLimited) {
			return "rate limited"
		}
		if err != nil {
			return err.Error()
		}
		resp.Body.Close()
		return resp.Status
	}
	fmt.Println(send())
	fmt.Println(send())
	clock.Advance(time.Minute)
	fmt.Println(send())
	// Output:
	// 200 OK
	// rate limited
	// 200 OK
}
