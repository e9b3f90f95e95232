package relay

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// gatedUpstream answers a request only when the test opens the gate named by
// its X-Req header, and records when a request's context ends early.
type gatedUpstream struct {
	mu        sync.Mutex
	gates     map[string]chan struct{}
	calls     int
	cancelled map[string]bool
	URL       string
}

func newGatedUpstream(t *testing.T) *gatedUpstream {
	g := &gatedUpstream{gates: map[string]chan struct{}{}, cancelled: map[string]bool{}}
	g.URL = newHandlerServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // the server notices a gone client only once the body is read
		id := r.Header.Get("X-Req")
		g.mu.Lock()
		g.calls++
		gate := g.gate(id)
		g.mu.Unlock()
		select {
		case <-gate:
			w.Header().Set("Content-Type", "application/json")
			w.Write(fixtureBytes)
		case <-r.Context().Done():
			g.mu.Lock()
			g.cancelled[id] = true
			g.mu.Unlock()
		}
	}))
	return g
}

var fixtureBytes = []byte(`{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":10,"completion_tokens":2}}`)

func (g *gatedUpstream) gate(id string) chan struct{} {
	c, ok := g.gates[id]
	if !ok {
		c = make(chan struct{})
		g.gates[id] = c
	}
	return c
}

func (g *gatedUpstream) open(id string) {
	g.mu.Lock()
	close(g.gate(id))
	g.mu.Unlock()
}

func (g *gatedUpstream) Calls() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls
}

func (g *gatedUpstream) wasCancelled(id string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.cancelled[id]
}

func hedgeRouter(t *testing.T, hedge HedgeConfig, a, b string) (*Router, *reports, *fakeClock) {
	clock := newFakeClock()
	r, reps := newTestRouter(t, Config{
		Clock:     clock,
		Hedge:     hedge,
		Upstreams: []Upstream{{Name: "a", BaseURL: a}, {Name: "b", BaseURL: b}},
	})
	return r, reps, clock
}

func sendWithID(t *testing.T, r http.RoundTripper, id string) <-chan *http.Response {
	out := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
		req.Header.Set("X-Req", id)
		resp, err := r.RoundTrip(req)
		if !assert.NoError(t, err) {
			out <- nil
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		out <- resp
	}()
	return out
}

func TestHedgeFiresAfterDelayAndCancelsLoser(t *testing.T) {
	a, b := newGatedUpstream(t), newGatedUpstream(t)
	r, reps, clock := hedgeRouter(t, HedgeConfig{Delay: 300 * time.Millisecond, Budget: 1}, a.URL, b.URL)
	r.hedges.bal.Store(hedgeBudgetCap)
	b.open("1")
	done := sendWithID(t, r, "1")
	require.Equal(t, 300*time.Millisecond, <-clock.armed)
	require.Eventually(t, func() bool { return a.Calls() == 1 }, 5*time.Second, time.Millisecond)
	clock.Advance(299 * time.Millisecond)
	assert.Zero(t, b.Calls(), "no hedge before the delay")
	clock.Advance(time.Millisecond)
	resp := <-done
	require.NotNil(t, resp)
	assert.Equal(t, "b", resp.Header.Get(HeaderUpstream))
	require.Eventually(t, func() bool { return a.wasCancelled("1") }, 5*time.Second, time.Millisecond, "the loser is cancelled")
	rep := reps.all()[0]
	assert.True(t, rep.Hedged)
	assert.Equal(t, 2, rep.Attempts)
	assert.Equal(t, "b", rep.Upstream)
}

func TestHedgeNotNeededWhenFast(t *testing.T) {
	a, b := newGatedUpstream(t), newGatedUpstream(t)
	r, reps, clock := hedgeRouter(t, HedgeConfig{Delay: time.Second}, a.URL, b.URL)
	r.hedges.bal.Store(hedgeBudgetCap)
	a.open("1")
	resp := <-sendWithID(t, r, "1")
	require.NotNil(t, resp)
	<-clock.armed
	assert.Equal(t, "a", resp.Header.Get(HeaderUpstream))
	assert.Zero(t, b.Calls())
	rep := reps.all()[0]
	assert.False(t, rep.Hedged)
	assert.Equal(t, 1, rep.Attempts)
}

func TestHedgeBothCompletedBilledTwice(t *testing.T) {
	a, b := newGatedUpstream(t), newGatedUpstream(t)
	r, reps, clock := hedgeRouter(t, HedgeConfig{Delay: 100 * time.Millisecond}, a.URL, b.URL)
	r.hedges.bal.Store(hedgeBudgetCap)
	r.s.prices = map[string]Price{"gpt-4.1": {InputPerMTok: 1e6, OutputPerMTok: 1e6}} // $1 per token
	done := sendWithID(t, r, "1")
	<-clock.armed
	require.Eventually(t, func() bool { return a.Calls() == 1 }, 5*time.Second, time.Millisecond)
	clock.Advance(100 * time.Millisecond)
	require.Eventually(t, func() bool { return b.Calls() == 1 }, 5*time.Second, time.Millisecond)
	// Both answer; whichever the router sees first wins, the other completed too.
	a.open("1")
	b.open("1")
	require.NotNil(t, <-done)
	// When the loser completed too, its usage is read on a goroutine of its
	// own and the Report waits for it, not the caller: it may come after the
	// caller has closed the winner's body.
	require.Eventually(t, func() bool { return len(reps.all()) == 1 }, 5*time.Second, time.Millisecond)
	rep := reps.all()[0]
	assert.True(t, rep.Hedged)
	// One answer costs 12 (10 prompt + 2 completion tokens at $1); both, 24,
	// when the loser had completed by the time the winner was seen.
	assert.Contains(t, []float64{12, 24}, rep.CostUSD)
}

func TestHedgeBudgetHoldsUnderOutage(t *testing.T) {
	a, b := newGatedUpstream(t), newGatedUpstream(t)
	r, reps, clock := hedgeRouter(t, HedgeConfig{Delay: 50 * time.Millisecond}, a.URL, b.URL)
	const n = 100
	for i := range n {
		id := fmt.Sprint(i)
		b.open(id)
		done := sendWithID(t, r, id)
		<-clock.armed
		require.Eventually(t, func() bool { return a.Calls() == i+1 }, 5*time.Second, time.Millisecond)
		clock.Advance(50 * time.Millisecond)
		a.open(id) // the slow primary answers eventually
		require.NotNil(t, <-done)
		for len(clock.armed) > 0 { // a later look's timer, stopped
			<-clock.armed
		}
	}
	// A hedged request whose loser completed too is reported once the
	// loser's usage is read, which may be after the caller has its answer.
	require.Eventually(t, func() bool { return len(reps.all()) == n }, 5*time.Second, time.Millisecond)
	hedged := 0
	for _, rep := range reps.all() {
		if rep.Hedged {
			hedged++
		}
	}
	assert.Positive(t, hedged)
	assert.LessOrEqual(t, hedged, n*5/100, "at most 5%% of requests hedged")
	assert.LessOrEqual(t, b.Calls(), hedged, "only hedges reach the second upstream")
}

// An attempt still waiting is looked at again at 2, 4… delays; the first
// look leaves the budget's reserve to the later ones.
func TestHedgeLaterLooksGetTheReserve(t *testing.T) {
	a, b := newGatedUpstream(t), newGatedUpstream(t)
	const d = 100 * time.Millisecond
	r, reps, clock := hedgeRouter(t, HedgeConfig{Delay: d, Budget: 0.01}, a.URL, b.URL)
	r.hedges.bal.Store(hedgeReserve) // one hedge and one less than the reserve: a first look finds none
	b.open("1")
	done := sendWithID(t, r, "1")
	require.Equal(t, d, <-clock.armed)
	require.Eventually(t, func() bool { return a.Calls() == 1 }, 5*time.Second, time.Millisecond)
	clock.Advance(d)
	require.Equal(t, d, <-clock.armed, "the second look, after as long again")
	assert.Zero(t, b.Calls(), "no hedge at the first look")
	clock.Advance(d)
	resp := <-done
	require.NotNil(t, resp)
	assert.Equal(t, "b", resp.Header.Get(HeaderUpstream), "hedged at the second look, from the reserve")
	assert.Equal(t, int64(hedgeReserve+hedgeUnit/100-hedgeUnit), r.hedges.bal.Load(), "the reserve and the request's deposit, less the hedge")
	rep := reps.all()[0]
	assert.True(t, rep.Hedged)
	assert.Equal(t, 2, rep.Attempts)
}

// A new router's balance starts at the reserve: with Budget 1, its first
// request can hedge at the first look.
func TestHedgeReserveFromTheStart(t *testing.T) {
	a, b := newGatedUpstream(t), newGatedUpstream(t)
	const d = 100 * time.Millisecond
	r, reps, clock := hedgeRouter(t, HedgeConfig{Delay: d, Budget: 1}, a.URL, b.URL)
	assert.Equal(t, int64(hedgeReserve), r.hedges.bal.Load())
	b.open("1")
	done := sendWithID(t, r, "1")
	require.Equal(t, d, <-clock.armed)
	require.Eventually(t, func() bool { return a.Calls() == 1 }, 5*time.Second, time.Millisecond)
	clock.Advance(d)
	resp := <-done
	require.NotNil(t, resp)
	assert.Equal(t, "b", resp.Header.Get(HeaderUpstream))
	assert.True(t, reps.all()[0].Hedged)
}

// With no budget at all, the looks go on at doubling delays, and the first
// look after the budget has a hedge again sends it.
func TestHedgeLooksUntilTheBudgetPays(t *testing.T) {
	a, b := newGatedUpstream(t), newGatedUpstream(t)
	const d = 100 * time.Millisecond
	r, reps, clock := hedgeRouter(t, HedgeConfig{Delay: d, Budget: 0.01}, a.URL, b.URL)
	r.hedges.bal.Store(0) // spent by others
	b.open("1")
	done := sendWithID(t, r, "1")
	require.Equal(t, d, <-clock.armed)
	require.Eventually(t, func() bool { return a.Calls() == 1 }, 5*time.Second, time.Millisecond)
	armed := d
	for _, next := range []time.Duration{d, 2 * d, 4 * d} { // looks at 2, 4 and 8 delays
		clock.Advance(armed)
		armed = <-clock.armed
		require.Equal(t, next, armed)
	}
	assert.Zero(t, b.Calls(), "no hedge without budget")
	r.hedges.bal.Store(hedgeUnit) // other requests paid in one hedge
	clock.Advance(4 * d)
	resp := <-done
	require.NotNil(t, resp)
	assert.Equal(t, "b", resp.Header.Get(HeaderUpstream))
	assert.Zero(t, r.hedges.bal.Load())
	assert.True(t, reps.all()[0].Hedged)
}

func TestHedgeLoserUsageAddsToCost(t *testing.T) {
	var got Report
	r, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://127.0.0.1:1", PriceFactor: 0.5}},
		Prices:   map[string]Price{"m": {InputPerMTok: 1e6, OutputPerMTok: 1e6}},
		OnReport: func(rep Report) { got = rep }})
	require.NoError(t, err)
	tr := newTrip(r, httptest.NewRequest("POST", "/v1/chat/completions", nil))
	tr.route.Model = "m"
	tr.att.cand = candidate{up: r.ups[0], model: "m"}
	loser := attempt{cand: candidate{up: r.ups[0], model: "m"}, resp: &http.Response{StatusCode: 200, Header: http.Header{},
		Body: io.NopCloser(strings.NewReader(`{"usage":{"prompt_tokens":3,"completion_tokens":1}}`))}}
	tr.readLoser(&loser)
	tr.finish(bodyEnd{usage: Usage{PromptTokens: 10, CompletionTokens: 2}, haveUsage: true})
	assert.Equal(t, 12.0+4.0, got.ListCostUSD)
	assert.Equal(t, (12.0+4.0)*0.5, got.CostUSD)
}

func TestHedgeWithOneUpstreamTakesNoTokens(t *testing.T) {
	a := newGatedUpstream(t)
	clock := newFakeClock()
	r, reps := newTestRouter(t, Config{
		Clock: clock, Hedge: HedgeConfig{Delay: 100 * time.Millisecond},
		Upstreams: []Upstream{{Name: "a", BaseURL: a.URL, RPM: 2}},
	})
	r.hedges.bal.Store(hedgeBudgetCap)
	done := sendWithID(t, r, "1")
	<-clock.armed
	require.Eventually(t, func() bool { return a.Calls() == 1 }, 5*time.Second, time.Millisecond)
	clock.Advance(100 * time.Millisecond) // the hedge finds no other upstream
	a.open("1")
	require.NotNil(t, <-done)
	assert.False(t, reps.all()[0].Hedged)
	assert.Equal(t, int64(hedgeBudgetCap), r.hedges.bal.Load(), "the budget was not spent")
	// The second of the two requests a minute allows goes without waiting.
	a.open("2")
	done = sendWithID(t, r, "2")
	<-clock.armed // its hedge timer, not a limiter wait
	require.NotNil(t, <-done)
	assert.Equal(t, 2, a.Calls())
}

func TestHedgeKeepsResponseOverLaterError(t *testing.T) {
	a, b := newGatedUpstream(t), newGatedUpstream(t)
	// a answers 503 once its gate opens; b fails at the connection level.
	dead := newHandlerServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		b.mu.Lock()
		b.calls++
		gate := b.gate("1")
		b.mu.Unlock()
		<-gate
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
	}))
	failing := newHandlerServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		a.mu.Lock()
		a.calls++
		gate := a.gate("1")
		a.mu.Unlock()
		<-gate
		w.WriteHeader(503)
		w.Write([]byte(`{"error":{"message":"busy"}}`))
	}))
	clock := newFakeClock()
	r, reps := newTestRouter(t, Config{
		Clock: clock, Hedge: HedgeConfig{Delay: 100 * time.Millisecond}, Retry: RetryConfig{MaxAttempts: 1},
		Upstreams: []Upstream{{Name: "a", BaseURL: failing}, {Name: "b", BaseURL: dead}},
	})
	r.hedges.bal.Store(hedgeBudgetCap)
	done := sendWithID(t, r, "1")
	<-clock.armed
	require.Eventually(t, func() bool { return a.Calls() == 1 }, 5*time.Second, time.Millisecond)
	clock.Advance(100 * time.Millisecond)
	require.Eventually(t, func() bool { return b.Calls() == 1 }, 5*time.Second, time.Millisecond)
	// Whichever of a's 503 and b's dropped connection the router sees
	// first, the 503 is what the caller gets.
	a.open("1")
	b.open("1")
	resp := <-done
	require.NotNil(t, resp, "a response was obtained: err must be nil")
	assert.Equal(t, 503, resp.StatusCode)
	assert.True(t, reps.all()[0].Hedged)
	// Each attempt was observed exactly once by its own upstream.
	st := r.Stats()
	assert.Equal(t, uint64(1), st[0].Requests)
	assert.Equal(t, uint64(1), st[0].Failures)
	assert.Equal(t, uint64(1), st[1].Requests)
	assert.Equal(t, uint64(1), st[1].Failures)
}

// TestHedgeLoserNeverDelaysTheCaller: when both attempts of a hedge
// answered, the loser's body (here stalled) is read for its usage in the
// background: the winner is returned at once, and the report, which waits
// for the loser, comes when the loser's body is done, with both costs.
func TestHedgeLoserNeverDelaysTheCaller(t *testing.T) {
	h := newRaceHarness(t)
	r, tr := h.r, h.tr
	lr, lw := io.Pipe()
	ok := func(up *upstream, body io.ReadCloser, n int) attempt {
		return answered(up, 200, http.Header{"Content-Type": {"application/json"}}, body, n)
	}
	results := make(chan attempt, 2)
	results <- ok(r.ups[0], io.NopCloser(strings.NewReader(`{"usage":{"prompt_tokens":10,"completion_tokens":2}}`)), 0)
	results <- ok(r.ups[1], lr, 1) // answered, then its body stalls
	returned := make(chan attempt, 1)
	go func() { returned <- tr.raceHedge(results, [2]context.CancelFunc{func() {}, func() {}}) }()
	var win attempt
	select {
	case win = <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("the caller waited for the hedge's loser")
	}
	tr.finalize(win)
	tr.finish(bodyEnd{usage: Usage{PromptTokens: 10, CompletionTokens: 2}, haveUsage: true})
	assert.Empty(t, h.reports(), "the report waits for the loser's usage")
	lw.Write([]byte(`{"usage":{"prompt_tokens":3,"completion_tokens":1}}`))
	lw.Close()
	assert.Equal(t, 12.0+4.0, h.report(t).ListCostUSD)
}

// raceHarness drives raceHedge and finalize by hand on a trip of a router
// with two upstreams and model "m" at $1 a token, collecting its reports.
type raceHarness struct {
	r   *Router
	tr  *trip
	mu  sync.Mutex
	got []Report
}

func newRaceHarness(t *testing.T) *raceHarness {
	h := &raceHarness{}
	r, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://127.0.0.1:1"}, {Name: "b", BaseURL: "http://127.0.0.1:1"}},
		Hedge:  HedgeConfig{Delay: time.Second},
		Prices: map[string]Price{"m": {InputPerMTok: 1e6, OutputPerMTok: 1e6}},
		OnReport: func(rep Report) {
			h.mu.Lock()
			h.got = append(h.got, rep)
			h.mu.Unlock()
		}})
	require.NoError(t, err)
	h.r, h.tr = r, newTrip(r, httptest.NewRequest("POST", "/v1/chat/completions", nil))
	return h
}

func (h *raceHarness) reports() []Report {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.got)
}

// report waits for the trip's one report.
func (h *raceHarness) report(t *testing.T) Report {
	require.Eventually(t, func() bool { return len(h.reports()) == 1 }, 10*time.Second, time.Millisecond)
	return h.reports()[0]
}

// race races a first attempt and a hedge that have both answered, returns
// the winner to the caller, and reads its body to the end.
func (h *raceHarness) race(t *testing.T, first, hedge attempt) {
	results := make(chan attempt, 2)
	results <- first
	results <- hedge
	resp, err := h.tr.finalize(h.tr.raceHedge(results, [2]context.CancelFunc{func() {}, func() {}}))
	require.NoError(t, err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// answered is an attempt of model m on up that answered status with body.
func answered(up *upstream, status int, header http.Header, body io.ReadCloser, hedge int) attempt {
	return attempt{cand: candidate{up: up, model: "m"}, hedge: hedge,
		resp: &http.Response{StatusCode: status, Header: header, Body: body}}
}
