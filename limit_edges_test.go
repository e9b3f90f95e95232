package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay/store"
)

// TestStaleLatenciesReopenAfterRecovery: the p99 breaker empties the
// latency window when it opens; requests sent before the opening that
// complete afterwards keep their slow latencies out of it, so once the
// probe closes the breaker, a fast success does not reopen it. (They added
// them, and the first success after recovery found the p99 over the bound.)
func TestStaleLatenciesReopenAfterRecovery(t *testing.T) {
	clock := newFakeClock()
	gate1, gate2 := make(chan struct{}), make(chan struct{})
	var inA atomic.Int32
	base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if req.URL.Host == "a.test" {
			id := req.Header.Get("X-Id")
			if strings.HasPrefix(id, "s") {
				inA.Add(1)
				if id < "s20" && len(id) == 3 || len(id) == 2 {
					<-gate1
				} else {
					<-gate2
				}
			}
		}
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody}, nil
	})
	var mu sync.Mutex
	var evs []string
	r, _ := newTestRouter(t, Config{Clock: clock, Base: base,
		Breaker:   BreakerConfig{P99: time.Second, MinSamples: 20, OnChange: func(e BreakerEvent) { mu.Lock(); evs = append(evs, e.From.String()+"->"+e.To.String()); mu.Unlock() }},
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}, {Name: "b", BaseURL: "http://b.test/v1"}}})
	u := r.byName["a"]
	sendID := func(id string) *http.Response {
		req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
		req.Header.Set("X-Id", id)
		resp, err := r.RoundTrip(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp
	}
	var wg sync.WaitGroup
	for i := range 40 {
		id := "s" + itoa(i)
		wg.Go(func() { sendID(id) })
	}
	require.Eventually(t, func() bool { return inA.Load() == 40 }, 5*time.Second, time.Millisecond)
	clock.Advance(3 * time.Second) // every one of them takes 3 s
	close(gate1)                   // s0..s19 answer: the p99 opens the breaker
	require.Eventually(t, func() bool { return stateOf(r, u, clock.Now()) == StateOpen }, 5*time.Second, time.Millisecond)
	require.Zero(t, u.lat.count(), "window emptied on opening")
	close(gate2) // s20..s39, sent before the opening, answer now
	wg.Wait()
	clock.Advance(30 * time.Second) // cooldown over
	resp := sendID("probe")
	require.Equal(t, "a", resp.Header.Get(HeaderUpstream))
	require.Equal(t, StateClosed, stateOf(r, u, clock.Now()), "the probe closed it")
	// A healthy, instant answer after recovery.
	resp = sendID("fast")
	require.Equal(t, "a", resp.Header.Get(HeaderUpstream))
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, StateClosed, stateOf(r, u, clock.Now()), "a fast success after recovery reopened it; events %v", evs)
}

// gatedBase is a Base whose calls block until gate is closed; it counts
// calls and records the fake-clock time of each.
type gatedBase struct {
	clock *fakeClock
	gate  chan struct{}
	calls atomic.Int32
	mu    sync.Mutex
	at    []time.Time
}

func (g *gatedBase) RoundTrip(req *http.Request) (*http.Response, error) {
	g.calls.Add(1)
	g.mu.Lock()
	g.at = append(g.at, g.clock.Now())
	g.mu.Unlock()
	select {
	case <-g.gate:
	case <-req.Context().Done():
		return nil, req.Context().Err()
	}
	return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody}, nil
}

// gatedRouter is a router on one upstream "a" with an RPM limit, one
// in-flight slot and a 10-minute MaxWait, on a fake clock, whose calls
// wait for base's gate.
func gatedRouter(t *testing.T, rpm int) (*Router, *gatedBase, *fakeClock) {
	clock := newFakeClock()
	base := &gatedBase{clock: clock, gate: make(chan struct{})}
	r, _ := newTestRouter(t, Config{Clock: clock, Base: base,
		Limits:    Limits{MaxWait: 10 * time.Minute},
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1", RPM: rpm, MaxInFlight: 1}}})
	return r, base, clock
}

func goSend(r http.RoundTripper, ctx context.Context, prio string) <-chan error {
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
		if prio != "" {
			req.Header.Set(HeaderPriority, prio)
		}
		resp, err := r.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	return errc
}

// TestSlotWaitersBypassRPM: requests that found RPM tokens but no
// in-flight slot wait for the slot, then ask for their tokens again: with
// RPM 2 and MaxInFlight 1, at most two of five go out in one instant.
// (They took the tokens without looking whether they were still there,
// and all five went.)
func TestSlotWaitersBypassRPM(t *testing.T) {
	r, base, clock := gatedRouter(t, 2)
	u := r.ups[0]
	var errs []<-chan error
	errs = append(errs, goSend(r, context.Background(), ""))
	require.Eventually(t, func() bool { return base.calls.Load() == 1 }, 5*time.Second, time.Millisecond)
	for i := 1; i < 5; i++ {
		errs = append(errs, goSend(r, context.Background(), ""))
		require.Eventually(t, func() bool { return int(u.lim.slots.n.Load()) == i }, 5*time.Second, time.Millisecond)
	}
	close(base.gate)
	// Without the clock moving, one more call has its token: it goes; each
	// of the three others, given the slot in turn, finds no token, gives
	// the slot back and waits for a token (TestSlotNotHeldWhileWaitingForTokens).
	require.Eventually(t, func() bool { return base.calls.Load() >= 2 && u.lim.turns.n.Load() == 3 && u.lim.slots.n.Load() == 0 }, 5*time.Second, time.Millisecond)
	sent := base.calls.Load()
	// Drain: move the clock until everyone is done.
	for _, e := range errs {
		for done := false; !done; {
			select {
			case <-e:
				done = true
			case <-time.After(10 * time.Millisecond):
				clock.Advance(10 * time.Second)
			}
		}
	}
	assert.LessOrEqual(t, int(sent), 2, "RPM 2: at most 2 calls at one instant, got %d", sent)
}

// TestCancelBeforeSendRefundsFleet: with a shared State, a request
// admitted by the fleet's limits whose context ends before its call goes
// out gives its token back to the fleet's limits. (It refunded the
// in-process limiter, which it never charged, and the fleet's token was
// lost.)
func TestCancelBeforeSendRefundsFleet(t *testing.T) {
	st := newMemState()
	clock := newAutoClock()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody}, nil
	})
	r, err := New(Config{Base: base, Clock: clock, State: st, StateTimeout: time.Second, Strategy: StrategyPriority,
		Limits:    Limits{MaxWait: 5 * time.Minute},
		Hooks:     Hooks{OnWait: func(WaitEvent) { cancel() }}, // the caller gives up just as the wait ends
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1", RPM: 2}}})
	require.NoError(t, err)
	// Two requests spend the fleet's minute.
	for range 2 {
		req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
		resp, err := r.RoundTrip(req)
		require.NoError(t, err)
		resp.Body.Close()
	}
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
	_, err = r.RoundTrip(req)
	require.ErrorIs(t, err, context.Canceled)
	// 30 s passed for the wait: one token came back; the cancelled request
	// took it and must have given it back.
	v, err := st.Admit(context.Background(), r.ups[0].lim.fleet, store.Ask{}, clock.Now())
	require.NoError(t, err)
	assert.True(t, v.Taken, "the fleet's token taken for a call that never went out is lost: %+v", v)
}

// TestHugeResetIsCappedNotIgnored: a reset of more than an hour is
// capped to an hour, also a plain number of seconds too large for a
// Duration (it overflowed to a negative and was ignored).
func TestHugeResetIsCappedNotIgnored(t *testing.T) {
	for _, v := range []string{"86400", "1e10", "1e12"} {
		d, ok := parseReset(v)
		assert.True(t, ok, v)
		assert.Equal(t, time.Hour, d, v)
	}
	now := time.Unix(1000, 0)
	resp := &http.Response{StatusCode: 200, Header: http.Header{"X-Ratelimit-Remaining-Requests": {"0"}, "X-Ratelimit-Reset-Requests": {"1e10"}}}
	assert.Equal(t, now.Add(time.Hour), holdOf(resp, now), "held for the capped hour")
}

// TestRefundDoesNotWakeRateQueue: a waiter served by the rate queue
// that then gives its tokens back (its slot wait is cancelled) hands them
// to the next waiter at once. (The next waited for its old timer, with the
// token in the bucket.)
func TestRefundDoesNotWakeRateQueue(t *testing.T) {
	r, base, clock := gatedRouter(t, 1)
	u := r.ups[0]
	x := goSend(r, context.Background(), "") // takes the token and the slot
	require.Eventually(t, func() bool { return base.calls.Load() == 1 }, 5*time.Second, time.Millisecond)
	ctxA, cancelA := context.WithCancel(context.Background())
	a := goSend(r, ctxA, "")
	require.Eventually(t, func() bool { return u.lim.turns.n.Load() == 1 }, 5*time.Second, time.Millisecond)
	b := goSend(r, context.Background(), "")
	require.Eventually(t, func() bool { return u.lim.turns.n.Load() == 2 }, 5*time.Second, time.Millisecond)
	clock.Advance(time.Minute) // A gets the token, then waits for the slot
	require.Eventually(t, func() bool { return u.lim.turns.n.Load() == 1 && u.lim.slots.n.Load() == 1 }, 5*time.Second, time.Millisecond)
	cancelA()
	require.ErrorIs(t, <-a, context.Canceled)
	// A's token went back, and B, at the head of the rate queue, has it.
	assert.Eventually(t, func() bool { return u.lim.turns.n.Load() == 0 }, time.Second, time.Millisecond,
		"B still waits for its timer (due in %v) with the token in the bucket", time.Minute)
	close(base.gate)
	require.NoError(t, <-x)
	clock.Advance(time.Minute)
	require.NoError(t, <-b)
}

// TestSlotWaiterMovesOnWhenFleetOpens: with a shared State, a request that
// waited for a MaxInFlight slot and then finds the upstream's circuit open
// for the fleet (opened by another replica during its wait) moves on to
// another upstream, as a request that waited for tokens does.
func TestSlotWaiterMovesOnWhenFleetOpens(t *testing.T) {
	st := newMemState()
	clock := newFakeClock()
	base := &gatedBase{clock: clock, gate: make(chan struct{})}
	r, err := New(Config{Base: roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if req.URL.Host == "b.test" {
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody}, nil
		}
		return base.RoundTrip(req)
	}), Clock: clock, State: st, StateTimeout: time.Second, Strategy: StrategyPriority,
		Limits: Limits{MaxWait: time.Minute},
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1", MaxInFlight: 1},
			{Name: "b", BaseURL: "http://b.test/v1", MaxInFlight: 1}}})
	require.NoError(t, err)
	t.Cleanup(r.CloseIdleConnections)
	x := goSend(r, context.Background(), "") // holds a's slot
	require.Eventually(t, func() bool { return base.calls.Load() == 1 }, 5*time.Second, time.Millisecond)
	// b's slot is taken too, so the next request waits for a's.
	bs := r.byName["b"]
	require.True(t, bs.lim.trySlot(PriorityDefault))
	bs.inflight.Add(1)
	y := goSend(r, context.Background(), "")
	require.Eventually(t, func() bool { return r.byName["a"].lim.slots.n.Load() == 1 }, 5*time.Second, time.Millisecond)
	require.NoError(t, st.Open(context.Background(), "a", clock.Now().Add(time.Hour), clock.Now())) // another replica opens a
	bs.unclaim()                                                                                    // b frees its slot
	close(base.gate)                                                                                // a's call ends: y gets a's slot
	require.NoError(t, <-x)
	require.NoError(t, <-y, "y moves on to b instead of failing")
}

// maxTokensUsage answers with the usage its request asked for at most:
// completion_tokens is the body's max_tokens, so the router's TPM charge
// is nearly all used and little goes back. Calls to it wait for gate.
type maxTokensUsage struct {
	gate  chan struct{}
	mu    sync.Mutex
	order []int // max_tokens of each call, in the order they came
}

func (b *maxTokensUsage) RoundTrip(r *http.Request) (*http.Response, error) {
	body, _ := io.ReadAll(r.Body)
	var q struct {
		MaxTokens int `json:"max_tokens"`
	}
	json.Unmarshal(body, &q)
	b.mu.Lock()
	b.order = append(b.order, q.MaxTokens)
	b.mu.Unlock()
	select {
	case <-b.gate:
	case <-r.Context().Done():
		return nil, r.Context().Err()
	}
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(strings.NewReader(fmt.Sprintf(`{"usage":{"prompt_tokens":1,"completion_tokens":%d}}`, q.MaxTokens)))}, nil
}

func (b *maxTokensUsage) calls() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.order)
}

// TestSlotNotHeldWhileWaitingForTokens: a batch request that waited for
// the only in-flight slot, and then finds a request of higher priority
// queued before it for the tokens, gives the slot back while it waits for
// them. (It held the slot: the interactive request got its tokens, then
// waited for the slot, which the batch request kept until its own tokens
// came, ~10 s later: a priority inversion under MaxInFlight and TPM.)
func TestSlotNotHeldWhileWaitingForTokens(t *testing.T) {
	clock := newFakeClock()
	base := &maxTokensUsage{gate: make(chan struct{})}
	r, _ := newTestRouter(t, Config{Base: base, Clock: clock, Limits: Limits{MaxWait: time.Minute},
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1", TPM: 6000, MaxInFlight: 1}}})
	u := r.ups[0]
	send := func(maxTokens int, prio string) <-chan error {
		errc := make(chan error, 1)
		go func() {
			req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(maxTokensBody("gpt-4.1", maxTokens)))
			if prio != "" {
				req.Header.Set(HeaderPriority, prio)
			}
			resp, err := r.RoundTrip(req)
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			errc <- err
		}()
		return errc
	}
	a := send(3000, "") // takes the slot and half the tokens
	require.Eventually(t, func() bool { return len(base.calls()) == 1 }, 5*time.Second, time.Millisecond)
	low := send(1000, "batch") // its tokens are there: it waits for the slot
	require.Eventually(t, func() bool { return u.lim.slots.n.Load() == 1 }, 5*time.Second, time.Millisecond)
	high := send(4000, "interactive") // ~1,000 tokens short: it waits for them
	require.Eventually(t, func() bool { return u.lim.turns.n.Load() == 1 }, 5*time.Second, time.Millisecond)

	close(base.gate) // a answers; its slot goes to the batch request, which now queues behind high for tokens
	require.NoError(t, <-a)
	require.Eventually(t, func() bool { return u.lim.turns.n.Load() == 2 }, 5*time.Second, time.Millisecond)
	clock.Advance(11 * time.Second) // enough tokens for high, not for both
	require.Eventually(t, func() bool { return len(base.calls()) >= 2 }, 5*time.Second, time.Millisecond,
		"the interactive request has its tokens but no slot: the batch request holds it while it waits for tokens")
	assert.Equal(t, []int{3000, 4000}, base.calls())
	clock.Advance(time.Minute)
	require.NoError(t, <-high)
	require.NoError(t, <-low)
	assert.Equal(t, []int{3000, 4000, 1000}, base.calls())
}
