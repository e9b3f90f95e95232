package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/tokenrelay/relay/relaytest"
	"github.com/tokenrelay/relay/store"
)

// generations is the configuration of each generation of a router that
// Update replaces under traffic, and what its requests did: generation g
// has an upstream "a" whose key, header X-Gen and body tag x_gen name g,
// and "b" (g even) or "c" (g odd) likewise, so "b" is removed by every
// odd generation and added again by every even one. Each generation has
// its own OnReport, which records the request's ID under g.
type generations struct {
	a, b, c *relaytest.Server
	clock   *fakeClock

	mu      sync.Mutex
	reports map[string][]int // request ID -> generation of each report
}

func (gs *generations) config(g int) Config {
	tag := strconv.Itoa(g)
	up := func(name, url string) Upstream {
		return Upstream{Name: name, BaseURL: url, APIKey: fmt.Sprintf("sk-%s-gen-%04d", name, g),
			Header: http.Header{"X-Gen": {tag}}, BodyTags: map[string]any{"x_gen": g}}
	}
	ups := []Upstream{up("a", gs.a.URL), up("b", gs.b.URL)}
	if g%2 == 1 {
		ups[1] = up("c", gs.c.URL)
	}
	return Config{
		Upstreams: ups,
		Clock:     gs.clock,
		Jitter:    0.5, // both upstreams of a generation see traffic
		OnReport: func(rep Report) {
			gs.mu.Lock()
			gs.reports[rep.RequestID] = append(gs.reports[rep.RequestID], g)
			gs.mu.Unlock()
		},
	}
}

// TestUpdateUnderTraffic replaces the configuration 50 times while 8
// goroutines send requests, and checks each request against the
// generations: it is answered once, with one report from the OnReport of
// one generation g, no older than the last Update that had returned when
// it started, no newer than the last that had begun when it ended; and
// every call it made carried g's key, header and body tag, to an upstream
// of g (a removed upstream gets no request that started after the
// Update that removed it).
func TestUpdateUnderTraffic(t *testing.T) {
	gs := &generations{a: relaytest.NewServer(), b: relaytest.NewServer(), c: relaytest.NewServer(),
		clock: newFakeClock(), reports: map[string][]int{}}
	for _, s := range []*relaytest.Server{gs.a, gs.b, gs.c} {
		defer s.Close()
	}
	r, err := New(gs.config(0))
	require.NoError(t, err)
	defer r.CloseIdleConnections()

	const workers, each, updates = 8, 40, 50
	var begun, done atomic.Int64 // the last Update begun, and returned
	type span struct{ lo, hi int }
	spans := make([]map[string]span, workers)
	progress := make(chan struct{}, workers*each)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		spans[w] = map[string]span{}
		wg.Go(func() {
			for i := range each {
				id := fmt.Sprintf("req-%d-%d", w, i)
				req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions",
					strings.NewReader(chatBody("gpt-4.1", fmt.Sprintf("question %d of worker %d", i, w))))
				req.Header.Set(HeaderRequestID, id)
				lo := int(done.Load())
				resp, err := r.RoundTrip(req)
				if err != nil {
					errs <- fmt.Errorf("%s: %w", id, err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				spans[w][id] = span{lo, int(begun.Load())}
				if resp.StatusCode != 200 {
					errs <- fmt.Errorf("%s: status %d", id, resp.StatusCode)
					return
				}
				progress <- struct{}{}
			}
		})
	}
	// An Update after every 5 answers (without waiting for them
	// otherwise): the Updates are spread over the traffic.
	for g := 1; g <= updates; g++ {
		for range 5 {
			select {
			case <-progress:
			case err := <-errs:
				t.Fatal(err)
			}
		}
		begun.Store(int64(g))
		require.NoError(t, r.Update(gs.config(g)))
		done.Store(int64(g))
		assert.Len(t, r.Stats(), 2)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	gs.mu.Lock()
	defer gs.mu.Unlock()
	gen := map[string]int{}
	n := 0
	for w := range workers {
		for id, sp := range spans[w] {
			n++
			reps := gs.reports[id]
			require.Len(t, reps, 1, "%s: one report", id)
			g := reps[0]
			assert.True(t, sp.lo <= g && g <= sp.hi, "%s: generation %d, started after %d and ended before %d", id, g, sp.lo, sp.hi)
			gen[id] = g
		}
	}
	require.Equal(t, workers*each, n)
	crossed := 0
	for w := range workers {
		for _, sp := range spans[w] {
			if sp.lo < sp.hi {
				crossed++
			}
		}
	}
	t.Logf("%d of %d requests were in flight during an Update", crossed, n)
	assert.Len(t, gs.reports, n, "no report of a request that was not sent")
	for name, s := range map[string]*relaytest.Server{"a": gs.a, "b": gs.b, "c": gs.c} {
		for _, rec := range s.Requests() {
			id := rec.Header.Get(HeaderRequestID)
			if id == "" {
				id = rec.Header.Get("X-Request-Id")
			}
			g, ok := gen[id]
			require.True(t, ok, "a call to %s of an unknown request %q", name, id)
			assert.Equal(t, strconv.Itoa(g), rec.Header.Get("X-Gen"), "%s on %s: the header of its generation", id, name)
			assert.Equal(t, fmt.Sprintf("Bearer sk-%s-gen-%04d", name, g), rec.Header.Get("Authorization"), "%s on %s: the key of its generation", id, name)
			assert.Equal(t, int64(g), gjson.GetBytes(rec.Body, "x_gen").Int(), "%s on %s: the body tag of its generation", id, name)
			switch name {
			case "b":
				assert.Zero(t, g%2, "%s: b is not in generation %d", id, g)
			case "c":
				assert.Equal(t, 1, g%2, "%s: c is not in generation %d", id, g)
			}
		}
	}
	assert.Positive(t, gs.b.Calls()+gs.c.Calls(), "the second upstream of each generation served")
}

// sendChat sends a chat request through rt and reads its answer: its
// status, or RoundTrip's error.
func sendChat(rt http.RoundTripper) (int, error) {
	req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "hi")))
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// gate is an upstream that records each call and answers it at once;
// one that holds its first call keeps it until open is closed, then
// answers it 500 (so its request retries).
type gate struct {
	*httptest.Server
	arrived chan struct{} // closed when the first call arrived
	open    chan struct{}
	mu      sync.Mutex
	calls   []http.Header
}

func newGate(t *testing.T, hold bool) *gate {
	g := &gate{arrived: make(chan struct{}), open: make(chan struct{})}
	g.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		h := r.Header.Clone()
		h.Set("X-Body-Gen", gjson.GetBytes(b, "x_gen").String())
		g.mu.Lock()
		g.calls = append(g.calls, h)
		first := hold && len(g.calls) == 1
		g.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if first {
			close(g.arrived)
			<-g.open
			w.WriteHeader(500)
			w.Write([]byte(`{"error":{"message":"overloaded"}}`))
			return
		}
		w.Write([]byte(`{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`))
	}))
	t.Cleanup(g.Close)
	return g
}

func (g *gate) seen() []http.Header {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]http.Header(nil), g.calls...)
}

// TestUpdateInFlightKeepsItsConfig holds a request in its first attempt
// across an Update that rotates a's key and removes b: the request
// retries on b, with the old configuration's key and tags, and reports
// to the old OnReport; a request sent after the Update uses the new key,
// reports to the new OnReport, and never reaches b.
func TestUpdateInFlightKeepsItsConfig(t *testing.T) {
	ga, gb, gc := newGate(t, true), newGate(t, false), newGate(t, false)
	var reps [3]reports
	cfg := func(g int, second *gate, name string) Config {
		up := func(name, url string) Upstream {
			return Upstream{Name: name, BaseURL: url, APIKey: fmt.Sprintf("sk-%s-gen-%d", name, g),
				BodyTags: map[string]any{"x_gen": g}}
		}
		return Config{
			Upstreams: []Upstream{up("a", ga.URL), up(name, second.URL)},
			Strategy:  StrategyPriority, Clock: newAutoClock(), OnReport: reps[g].add,
		}
	}
	c1 := cfg(1, gb, "b")
	r, err := New(c1)
	require.NoError(t, err)
	defer r.CloseIdleConnections()

	first := make(chan int, 1)
	go func() {
		resp, _ := do(t, r, "POST", "http://relay/v1/chat/completions", chatBody("gpt-4.1", "before"))
		first <- resp.StatusCode
	}()
	<-ga.arrived
	c2 := cfg(2, gc, "c")
	c2.Clock = c1.Clock
	require.NoError(t, r.Update(c2))

	resp, _ := do(t, r, "POST", "http://relay/v1/chat/completions", chatBody("gpt-4.1", "after"))
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "a", resp.Header.Get(HeaderUpstream))
	close(ga.open)
	assert.Equal(t, 200, <-first, "the request in flight retried on b")

	a := ga.seen()
	require.Len(t, a, 2)
	assert.Equal(t, "Bearer sk-a-gen-1", a[0].Get("Authorization"), "the request in flight was sent with the old key")
	assert.Equal(t, "Bearer sk-a-gen-2", a[1].Get("Authorization"), "the request after the Update, with the new one")
	assert.Equal(t, "2", a[1].Get("X-Body-Gen"))
	b := gb.seen()
	require.Len(t, b, 1, "b, removed, got the retry of the request in flight and nothing else")
	assert.Equal(t, "Bearer sk-b-gen-1", b[0].Get("Authorization"))
	assert.Equal(t, "1", b[0].Get("X-Body-Gen"))
	assert.Empty(t, gc.seen())
	require.Len(t, reps[1].all(), 1)
	require.Len(t, reps[2].all(), 1)
	assert.Equal(t, "b", reps[1].all()[0].Upstream)
	assert.Equal(t, 2, reps[1].all()[0].Attempts)
	assert.Equal(t, "a", reps[2].all()[0].Upstream)

	names := []string{}
	for _, s := range r.Stats() {
		names = append(names, s.Name)
	}
	assert.Equal(t, []string{"a", "c"}, names)
	st := r.Stats()[0]
	assert.Equal(t, uint64(2), st.Requests, "a's counters count the attempts of both configurations: one each")
	assert.Equal(t, uint64(1), st.Failures)
}

// TestUpdateKeepsTheBreaker opens a's circuit, then rotates its key: a
// stays open (no request reaches it) until its cooldown ends, and its
// probe goes out with the new key.
func TestUpdateKeepsTheBreaker(t *testing.T) {
	sick, well := relaytest.NewServer(), relaytest.NewServer()
	defer sick.Close()
	defer well.Close()
	sick.SetDefault(relaytest.Fault{Status: 500})
	clock := newFakeClock()
	cfg := func(key string) Config {
		return Config{Clock: clock, Strategy: StrategyPriority, Retry: RetryConfig{MaxAttempts: 1},
			Breaker:   BreakerConfig{Failures: 2, Cooldown: 30 * time.Second},
			Upstreams: []Upstream{{Name: "a", BaseURL: sick.URL, APIKey: key}, {Name: "b", BaseURL: well.URL}}}
	}
	r, err := New(cfg("sk-old-0001"))
	require.NoError(t, err)
	defer r.CloseIdleConnections()
	send := func() *http.Response {
		resp, _ := do(t, r, "POST", "http://relay/v1/chat/completions", chatBody("gpt-4.1", "hi"))
		return resp
	}
	for range 3 {
		assert.Equal(t, 500, send().StatusCode)
	}
	assert.Equal(t, "b", send().Header.Get(HeaderUpstream))
	before := r.Stats()
	require.Equal(t, StateOpen, before[0].Breaker)

	require.NoError(t, r.Update(cfg("sk-new-0002")))
	after := r.Stats()
	assert.Equal(t, StateOpen, after[0].Breaker, "a's circuit is still open")
	assert.Equal(t, before[0].Requests, after[0].Requests)
	assert.Equal(t, before[1].Samples, after[1].Samples, "b's latency window is kept")
	calls := sick.Calls()
	assert.Equal(t, "b", send().Header.Get(HeaderUpstream))
	assert.Equal(t, calls, sick.Calls(), "no request reaches a while its circuit is open")

	clock.Advance(30 * time.Second)
	sick.SetDefault(relaytest.Fault{})
	assert.Equal(t, "a", send().Header.Get(HeaderUpstream), "the cooldown is over: a is probed")
	recs := sick.Requests()
	assert.Equal(t, "Bearer sk-new-0002", recs[len(recs)-1].Header.Get("Authorization"), "the probe carries the new key")
	assert.Equal(t, StateClosed, r.Stats()[0].Breaker)
}

// TestUpdateKeepsTheLimits: new rates apply to the buckets as they are.
// An empty bucket stays empty across the Update, and refills at the new
// rate.
func TestUpdateKeepsTheLimits(t *testing.T) {
	srv := relaytest.NewServer()
	defer srv.Close()
	clock := newFakeClock()
	cfg := func(rpm int) Config {
		return Config{Clock: clock, Limits: Limits{MaxWait: -1}, Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL, RPM: rpm}}}
	}
	r, err := New(cfg(2))
	require.NoError(t, err)
	defer r.CloseIdleConnections()
	send := func() error {
		_, err := sendChat(r)
		return err
	}
	require.NoError(t, send())
	require.NoError(t, send())
	require.ErrorIs(t, send(), ErrRateLimited)

	require.NoError(t, r.Update(cfg(4)))
	assert.ErrorIs(t, send(), ErrRateLimited, "the Update does not refill the bucket")
	clock.Advance(15 * time.Second)
	assert.NoError(t, send(), "15 s refill one request at 4 a minute")
	assert.ErrorIs(t, send(), ErrRateLimited)
	assert.Equal(t, 3, srv.Calls())
}

// TestUpdateResizesSlots: a request waiting for a's only in-flight slot is
// served as soon as an Update raises MaxInFlight to 2.
func TestUpdateResizesSlots(t *testing.T) {
	g := newGate(t, true)
	clock := newFakeClock()
	cfg := func(n int) Config {
		return Config{Clock: clock, Retry: RetryConfig{MaxAttempts: 1},
			Upstreams: []Upstream{{Name: "a", BaseURL: g.URL, MaxInFlight: n}}}
	}
	r, err := New(cfg(1))
	require.NoError(t, err)
	defer r.CloseIdleConnections()
	status := make(chan int, 2)
	send := func() {
		code, _ := sendChat(r)
		status <- code
	}
	go send()
	<-g.arrived // it holds the slot
	go send()
	for d := range clock.armed {
		if d == 2*time.Second { // the second waits for the slot (Limits.MaxWait)
			break
		}
	}
	require.NoError(t, r.Update(cfg(2)))
	s := r.current().ups[0].lim.slots
	if !assert.Equal(t, 2, s.inUse(), "the waiter was given the new slot") || !assert.Zero(t, s.n.Load()) {
		clock.Advance(2 * time.Second) // (let it go)
	}
	assert.Equal(t, 200, <-status, "the second request was served")
	close(g.open)
	assert.Equal(t, 500, <-status)
	assert.Zero(t, s.inUse())
}

// TestSlotsResize: a lower cap holds the released slots back until the
// slots in use are under it; a higher one serves the waiters at once.
func TestSlotsResize(t *testing.T) {
	clock := newFakeClock()
	s := &slots{cap: 2}
	require.True(t, s.try(0))
	require.True(t, s.try(0))
	served := make(chan error, 1)
	go func() { served <- s.wait(context.Background(), clock, 0, time.Minute, ErrRateLimited) }()
	<-clock.armed
	s.resize(1)
	s.release()
	assert.Equal(t, 1, s.inUse(), "2 slots taken over a cap of 1: the released one is not passed on")
	assert.EqualValues(t, 1, s.n.Load())
	s.release()
	require.NoError(t, <-served)
	assert.Equal(t, 1, s.inUse())

	go func() { served <- s.wait(context.Background(), clock, 0, time.Minute, ErrRateLimited) }()
	<-clock.armed
	s.resize(2)
	require.NoError(t, <-served, "the cap grew: the waiter is served")
	assert.Equal(t, 2, s.inUse())
}

// TestUpdateRefused: an invalid configuration is refused with New's
// errors, and one that changes Clock, State or Ledger with
// ErrNotUpdatable naming the field; either way nothing changes.
func TestUpdateRefused(t *testing.T) {
	srv := relaytest.NewServer()
	defer srv.Close()
	clock := newFakeClock()
	good := Config{Clock: clock, Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL, APIKey: "sk-good-0001"}}}
	r, err := New(good)
	require.NoError(t, err)
	defer r.CloseIdleConnections()
	gen := r.current()

	for _, bad := range []Config{
		{Clock: clock},
		{Clock: clock, Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL, RPM: -1, APIKey: "sk-secret-9999"}, {Name: "a", BaseURL: "ftp://x"}}},
		{Clock: clock, Upstreams: good.Upstreams, Retry: RetryConfig{RandomizationFactor: 2}},
	} {
		_, want := New(bad)
		require.Error(t, want)
		err := r.Update(bad)
		require.Error(t, err)
		assert.Equal(t, want.Error(), err.Error(), "New's errors")
		assert.NotContains(t, err.Error(), "sk-secret-9999")
		assert.Same(t, gen, r.current(), "nothing changed")
	}
	for field, c := range map[string]Config{
		"Clock":  {Clock: newFakeClock()},
		"State":  {Clock: clock, State: store.NewLocal()},
		"Ledger": {Clock: clock, Ledger: store.NewLocal()},
	} {
		c.Upstreams = good.Upstreams
		err := r.Update(c)
		require.ErrorIs(t, err, ErrNotUpdatable, field)
		assert.Contains(t, err.Error(), "relay: Update cannot change Config."+field)
		assert.Same(t, gen, r.current(), "nothing changed")
	}
	noClock := good
	noClock.Clock = nil
	assert.ErrorIs(t, r.Update(noClock), ErrNotUpdatable, "the real clock is another clock")

	do(t, r, "POST", "http://relay/v1/chat/completions", chatBody("gpt-4.1", "hi"))
	assert.Equal(t, "Bearer sk-good-0001", srv.Requests()[0].Header.Get("Authorization"))
	good.Upstreams = []Upstream{{Name: "a", BaseURL: srv.URL, APIKey: "sk-next-0002"}}
	require.NoError(t, r.Update(good), "a valid Update after refused ones")
	do(t, r, "POST", "http://relay/v1/chat/completions", chatBody("gpt-4.1", "hi"))
	assert.Equal(t, "Bearer sk-next-0002", srv.Requests()[1].Header.Get("Authorization"))
}

// TestUpdateKeepsTheRouterState: the hedge budget's balance, the memo of
// counts and the request IDs carry over; the hedge deposit is the new
// configuration's, and the memo is renewed when its size or the image
// estimate changes. Decide, Format and Stats follow the new configuration.
func TestUpdateKeepsTheRouterState(t *testing.T) {
	cfg := Config{
		Hedge:     HedgeConfig{Delay: time.Second, Budget: 0.1},
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://127.0.0.1:1/v1"}},
	}
	r, err := New(cfg)
	require.NoError(t, err)
	r.hedges.bal.Store(7 * hedgeUnit)
	counter, ids := r.counter, r.ids

	cfg.Hedge.Budget = 0.2
	cfg.Upstreams = append(cfg.Upstreams, Upstream{Name: "b", BaseURL: "http://127.0.0.1:2/v1"})
	require.NoError(t, r.Update(cfg))
	g := r.current()
	assert.Same(t, r.hedges, g.hedges)
	assert.Equal(t, int64(7*hedgeUnit), g.hedges.bal.Load(), "the hedge balance is kept")
	assert.Equal(t, int64(0.2*hedgeUnit), g.hedges.deposit.Load(), "the deposit is the new Budget's")
	assert.Same(t, counter, g.counter, "the memo is kept")
	assert.Same(t, ids, g.ids)
	assert.Same(t, r.stores, g.stores)
	assert.Same(t, r.ups[0].learned, g.ups[0].learned, "a keeps what was learned of it")

	req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "hi")))
	d, err := r.Decide(req)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"a", "b"}, d.Upstreams)
	assert.Equal(t, `relay.Router{Upstreams: ["a" "b"]}`, fmt.Sprint(r))
	assert.Len(t, r.Stats(), 2)

	cfg.MemoEntries = 64
	require.NoError(t, r.Update(cfg))
	assert.NotSame(t, counter, r.current().counter, "a memo of another size")
	counter = r.current().counter
	cfg.ImageTokens = 100
	require.NoError(t, r.Update(cfg))
	assert.NotSame(t, counter, r.current().counter, "counts made with another image estimate")
}

// TestUpdateRemovedUpstreamDrains: an upstream removed while a request is
// in flight on it gets no new request, and the one in flight finishes
// with its report.
func TestUpdateRemovedUpstreamDrains(t *testing.T) {
	g, next := newGate(t, true), newGate(t, false)
	var reps reports
	cfg := Config{Clock: newAutoClock(), Retry: RetryConfig{MaxAttempts: 1}, OnReport: reps.add,
		Upstreams: []Upstream{{Name: "old", BaseURL: g.URL}}}
	r, err := New(cfg)
	require.NoError(t, err)
	defer r.CloseIdleConnections()
	errc := roundTripAsync(r, context.Background())
	<-g.arrived
	cfg.Upstreams = []Upstream{{Name: "new", BaseURL: next.URL}}
	require.NoError(t, r.Update(cfg))
	for range 3 {
		resp, _ := do(t, r, "POST", "http://relay/v1/chat/completions", chatBody("gpt-4.1", "hi"))
		assert.Equal(t, "new", resp.Header.Get(HeaderUpstream))
	}
	assert.Len(t, g.seen(), 1, "the removed upstream got no new request")
	close(g.open)
	require.NoError(t, <-errc)
	got := reps.all()
	require.Len(t, got, 4)
	assert.Equal(t, "old", got[3].Upstream, "the request in flight finished on it, with its report")
	assert.Equal(t, 500, got[3].StatusCode)
	assert.True(t, errors.Is(got[3].Err, ErrUpstreamStatus))
}
