package relay

import (
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay/relaytest"
)

// windowPrices gives "small" a 100-token window and "large" a 10,000-token
// one.
var windowPrices = map[string]Price{
	"small": {InputPerMTok: 1, OutputPerMTok: 1, MaxInputTokens: 100, MaxOutputTokens: 50},
	"large": {InputPerMTok: 2, OutputPerMTok: 2, MaxInputTokens: 10000, MaxOutputTokens: 1000},
}

func windowRequest(words int, maxTokens int) string {
	body := `{"model":"small","messages":[{"role":"user","content":"` + strings.Repeat("word ", words) + `"}]`
	if maxTokens > 0 {
		body += `,"max_tokens":` + itoa(maxTokens)
	}
	return body + "}"
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// TestContextWindowNeverSendsWhatMustFail: a prompt too long for the routed
// model goes to the first fallback whose window fits, never to the small
// model's upstream; one that fits nothing is ErrContextWindow with the
// counts, no call, one report.
func TestContextWindowNeverSendsWhatMustFail(t *testing.T) {
	small, large := newRecorder(t, 200, []byte(`{"usage":{"prompt_tokens":5,"completion_tokens":1}}`)), newRecorder(t, 200, []byte(`{}`))
	r, reps := newTestRouter(t, Config{Prices: windowPrices,
		Upstreams: []Upstream{{Name: "small", BaseURL: small.URL, Models: []string{"small"}}, {Name: "large", BaseURL: large.URL, Models: []string{"large"}}},
		Policy:    PolicyFunc(func(q Request) Route { return Route{Fallbacks: []string{"large"}} }),
	})
	// Fits: stays.
	resp, _, err := send(t, r, windowRequest(10, 0))
	require.NoError(t, err)
	assert.Equal(t, "small", resp.Header.Get(HeaderUpstream))
	// Too long for small: the fallback, at once.
	resp, _, err = send(t, r, windowRequest(200, 0))
	require.NoError(t, err)
	assert.Equal(t, "large", resp.Header.Get(HeaderUpstream))
	assert.Len(t, small.got(), 1, "the small model never saw the long prompt")
	rep := reps.all()[1]
	assert.Equal(t, ConstraintContextWindow, rep.Constraint)
	assert.Equal(t, 1, rep.Attempts)
	// Asks for more output than small allows: the fallback too.
	resp, _, err = send(t, r, windowRequest(10, 500))
	require.NoError(t, err)
	assert.Equal(t, "large", resp.Header.Get(HeaderUpstream))

	// Nothing fits.
	_, _, err = send(t, r, windowRequest(20000, 0))
	require.ErrorIs(t, err, ErrContextWindow)
	assert.Contains(t, err.Error(), "20008 prompt tokens")
	assert.Contains(t, err.Error(), "window: 100 input, 50 output tokens")
	assert.Len(t, large.got(), 2)
	reps4 := reps.all()
	require.Len(t, reps4, 4)
	assert.ErrorIs(t, reps4[3].Err, ErrContextWindow)
}

// TestContextWindowForPolicies: a policy sees the requested model's window,
// and Decide shows the choice and the constraint.
func TestContextWindowForPolicies(t *testing.T) {
	var seen Request
	r, _ := newTestRouter(t, Config{Prices: windowPrices, ContextFallbacks: []string{"large"},
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
		Policy:    PolicyFunc(func(q Request) Route { seen = q; return Route{} }),
	})
	req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(windowRequest(200, 0)))
	d, err := r.Decide(req)
	require.NoError(t, err)
	assert.Equal(t, 100, seen.MaxInputTokens)
	assert.Equal(t, 50, seen.MaxOutputTokens)
	assert.Equal(t, "large", d.Route.Model, "Config.ContextFallbacks")
	assert.Equal(t, ConstraintContextWindow, d.Constraint)
}

// TestUpstreamContextLengthExceededRetriedOnLargerWindow: an upstream's own
// 400 context_length_exceeded (its count differs from the router's) is
// retried once on a larger-window model.
func TestUpstreamContextLengthExceededRetriedOnLargerWindow(t *testing.T) {
	small := newRecorder(t, 400, fixture(t, "error_400_context_length_exceeded.json"))
	large := newRecorder(t, 200, []byte(`{"usage":{"prompt_tokens":5,"completion_tokens":1}}`))
	r, reps := newTestRouter(t, Config{Prices: windowPrices, ContextFallbacks: []string{"large"},
		Upstreams: []Upstream{{Name: "small", BaseURL: small.URL, Models: []string{"small"}}, {Name: "large", BaseURL: large.URL, Models: []string{"large"}}},
	})
	resp, _, err := send(t, r, windowRequest(10, 0))
	require.NoError(t, err)
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "large", resp.Header.Get(HeaderUpstream))
	rep := reps.all()[0]
	assert.Equal(t, 2, rep.Attempts)
	assert.Equal(t, ConstraintContextWindow, rep.Constraint)

	// No larger window: the 400 is the answer, body intact, tried once.
	r2, _ := newTestRouter(t, Config{Prices: windowPrices, Upstreams: []Upstream{{Name: "small", BaseURL: small.URL}}})
	resp, body, err := send(t, r2, windowRequest(10, 0))
	require.NoError(t, err)
	assert.Equal(t, 400, resp.StatusCode)
	assert.Contains(t, string(body), "context_length_exceeded")
	assert.Len(t, small.got(), 2)
}

// TestRequiredTagsNeverLeaveTheBoundary: with the EU upstreams dark, an
// EU-only request fails, and no upstream outside the EU receives a byte,
// while unconstrained traffic fails over as before.
func TestRequiredTagsNeverLeaveTheBoundary(t *testing.T) {
	us := relaytest.NewServer()
	t.Cleanup(us.Close)
	var dark []string
	for range 2 {
		s := relaytest.NewServer()
		t.Cleanup(s.Close)
		s.SetDefault(relaytest.Fault{Drop: true})
		dark = append(dark, s.URL)
	}
	r, reps := newTestRouter(t, Config{Clock: newAutoClock(), Hedge: HedgeConfig{Delay: time.Millisecond},
		Upstreams: []Upstream{
			{Name: "eu-1", BaseURL: dark[0], Tags: []string{"region=eu", "zdr"}},
			{Name: "eu-2", BaseURL: dark[1], Tags: []string{"region=eu"}},
			{Name: "us", BaseURL: us.URL, Tags: []string{"region=us"}},
		}})
	r.hedges.bal.Store(hedgeBudgetCap)
	for range 10 { // enough to open the EU circuits: the forced tries stay in the EU too
		req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
		req.Header.Set(HeaderRequire, "region=eu")
		_, err := r.RoundTrip(req)
		require.Error(t, err)
	}
	assert.Zero(t, us.Calls(), "no byte left the EU")
	for _, rep := range reps.all() {
		assert.True(t, strings.HasPrefix(rep.Upstream, "eu-") || rep.Upstream == "", rep.Upstream)
	}
	// Unconstrained traffic fails over.
	resp, _, err := send(t, r, chatBody("gpt-4.1", "x"))
	require.NoError(t, err)
	assert.Equal(t, "us", resp.Header.Get(HeaderUpstream))

	// No upstream with the tags at all: a clear error, no call.
	req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
	req.Header.Set(HeaderRequire, "region=ap, zdr")
	_, err = r.RoundTrip(req)
	require.ErrorIs(t, err, ErrNoTaggedUpstream)
	assert.Contains(t, err.Error(), "region=ap, zdr")
	// Two tags, one upstream has both; the route's Require adds to the header's.
	rr, _ := newTestRouter(t, Config{Upstreams: []Upstream{
		{Name: "eu-2", BaseURL: "http://eu2.test", Tags: []string{"region=eu"}},
		{Name: "eu-1", BaseURL: "http://eu1.test", Tags: []string{"region=eu", "zdr"}},
	}, Policy: PolicyFunc(func(q Request) Route { return Route{Require: []string{"zdr"}} })})
	req, _ = http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
	req.Header.Set(HeaderRequire, "region=eu")
	d, err := rr.Decide(req)
	require.NoError(t, err)
	assert.Equal(t, []string{"eu-1"}, d.Upstreams)
}

// TestPriorityUnderBackpressure: a batch flood and a trickle of
// interactive requests wait for one RPM limit: interactive requests are
// admitted first (their p99 wait is a small fraction of batch's), nothing is
// lost; without priorities both wait alike.
func TestPriorityUnderBackpressure(t *testing.T) {
	for _, prioritized := range []bool{true, false} {
		batch, interactive := priorityRun(t, prioritized, nil)
		require.Len(t, batch, 40, "nothing lost")
		require.Len(t, interactive, 5, "nothing lost")
		ratio := float64(p99(interactive)) / float64(p99(batch))
		t.Logf("prioritized=%v: interactive p99 wait %s, batch p99 wait %s (%.2f)", prioritized, p99(interactive), p99(batch), ratio)
		if prioritized {
			assert.Less(t, ratio, 0.10)
		} else {
			assert.Greater(t, ratio, 0.5, "FIFO: interactive requests wait behind the flood")
		}
	}
}

// TestPriorityUnderSharedLimits: the same with the limit kept by a shared
// State (the fleet's RPM): a replica's waiting requests go by priority too,
// and only the head of its queue asks the State, so a flood of waiting
// requests costs a round trip per verdict, not one per request.
func TestPriorityUnderSharedLimits(t *testing.T) {
	for _, prioritized := range []bool{true, false} {
		st := newMemState()
		batch, interactive := priorityRun(t, prioritized, st)
		require.Len(t, batch, 40, "nothing lost")
		require.Len(t, interactive, 5, "nothing lost")
		ratio := float64(p99(interactive)) / float64(p99(batch))
		t.Logf("prioritized=%v: interactive p99 wait %s, batch p99 wait %s (%.2f); %d admissions asked of the State",
			prioritized, p99(interactive), p99(batch), ratio, st.Admits.Load())
		if prioritized {
			assert.Less(t, ratio, 0.10)
		} else {
			assert.Greater(t, ratio, 0.5, "FIFO: interactive requests wait behind the flood")
		}
		// 45 requests served one a second: each is admitted once, and each
		// head asks once more to learn when its turn's token is due.
		assert.LessOrEqual(t, st.Admits.Load(), int64(3*45), "the State is asked per verdict, not per waiting request")
	}
}

// priorityRun queues a flood of 40 batch requests for one upstream with RPM
// 60 whose bucket is empty, then sends a trickle of interactive ones, one
// every 5 s, and returns each class's waits, measured on the fake clock
// (moved a second at a time, each second once its request reached the
// upstream). With st, the limit is the fleet's, kept by st.
func priorityRun(t *testing.T, prioritized bool, st *memState) (batch, interactive []time.Duration) {
	clock := newFakeClock()
	var mu sync.Mutex
	start := map[string]time.Time{}
	waits := map[string]time.Duration{}
	var calls int
	base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		mu.Lock()
		id := req.Header.Get("X-Id")
		waits[id] = clock.Now().Sub(start[id])
		calls++
		mu.Unlock()
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody}, nil
	})
	cfg := Config{Clock: clock, Base: base, Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1", RPM: 60}},
		Limits: Limits{MaxWait: time.Hour}}
	if st != nil {
		cfg.State, cfg.StateTimeout = st, time.Hour
	}
	r, _ := newTestRouter(t, cfg)
	spend(t, r, r.ups[0], 60, clock.Now()) // the minute's quota is spent
	if st != nil {
		st.Admits.Store(0)
	}
	q := &r.ups[0].lim.turns.n
	var wg sync.WaitGroup
	send := func(id, prio string) {
		defer wg.Done()
		req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
		req.Header.Set("X-Id", id)
		if prioritized {
			req.Header.Set(HeaderPriority, prio)
		}
		mu.Lock()
		start[id] = clock.Now()
		mu.Unlock()
		resp, err := r.RoundTrip(req)
		if assert.NoError(t, err) {
			resp.Body.Close()
		}
	}
	for i := range 40 { // the flood
		wg.Add(1)
		go send("b"+itoa(i+1), "batch")
		require.Eventually(t, func() bool { return int(q.Load()) == i+1 }, 5*time.Second, time.Millisecond)
	}
	sent := 0
	for k := 1; q.Load() > 0 || sent < 5; k++ {
		if k%5 == 0 && sent < 5 { // the trickle: one interactive request every 5 s
			sent++
			n := q.Load()
			wg.Add(1)
			go send("i"+itoa(sent), "interactive")
			require.Eventually(t, func() bool { return q.Load() == n+1 }, 5*time.Second, time.Millisecond)
		}
		// A second of fake time per call. A waiter that read the clock
		// just before it moved arms its timer a second late (a Clock timer
		// runs for a duration from when it is armed): then one more second.
		for tries := 0; ; tries++ {
			clock.Advance(time.Second)
			if within(time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return calls >= k }) {
				break
			}
			require.Less(t, tries, 3, "call %d did not come", k)
		}
	}
	wg.Wait()
	for id, w := range waits {
		if strings.HasPrefix(id, "i") {
			interactive = append(interactive, w)
		} else {
			batch = append(batch, w)
		}
	}
	return batch, interactive
}

// within reports whether cond holds within d of real time.
func within(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); ; time.Sleep(time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

func p99(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*99/100)]
}

// TestPriorityShedsLowestFirst: when waiting requests cannot all be served
// within the wait bound, the lowest priority is refused at once.
func TestPriorityShedsLowestFirst(t *testing.T) {
	clock := newFakeClock()
	base := &usageBase{prompt: 1, completion: 1}
	r, _ := newTestRouter(t, Config{Clock: clock, Base: base, Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1", RPM: 60}},
		Limits: Limits{MaxWait: 3 * time.Second}})
	spend(t, r, r.ups[0], 60, clock.Now())
	errs := make(chan error, 10)
	sendPrio := func(prio string) {
		req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
		req.Header.Set(HeaderPriority, prio)
		resp, err := r.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
		errs <- err
	}
	q := &r.ups[0].lim.turns
	for i := range 3 {
		go sendPrio("batch")
		require.Eventually(t, func() bool { return int(q.n.Load()) == i+1 }, 5*time.Second, time.Millisecond)
	}
	go sendPrio("interactive") // pushes the last batch request past its 3 s
	err := <-errs
	require.ErrorIs(t, err, ErrRateLimited, "the lowest priority is shed, at once")
	for q.n.Load() > 0 {
		clock.Advance(time.Second)
	}
	for range 3 {
		require.NoError(t, <-errs)
	}
}
