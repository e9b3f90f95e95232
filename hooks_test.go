package relay

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay/relaytest"
)

type ctxKey struct{}

// hookLog records what hooks saw, in order.
type hookLog struct {
	mu  sync.Mutex
	log []string
}

func (l *hookLog) add(format string, args ...any) {
	l.mu.Lock()
	l.log = append(l.log, fmt.Sprintf(format, args...))
	l.mu.Unlock()
}

func (l *hookLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.log...)
}

func loggingHooks(l *hookLog, name string) Hooks {
	return Hooks{
		OnRequest: func(ctx context.Context, r *http.Request) context.Context {
			l.add("%s request %s (ctx %v)", name, r.URL.Path, ctx.Value(ctxKey{}))
			return context.WithValue(ctx, ctxKey{}, name)
		},
		OnAttempt: func(ctx context.Context, a AttemptInfo, out *http.Request) func(AttemptDone) {
			l.add("%s attempt %d %s %s hedge=%v retry=%q ctx=%v", name, a.N, a.Upstream, a.Model, a.Hedge, a.Retry, ctx.Value(ctxKey{}))
			out.Header.Set("Traceparent", "00-"+name)
			return func(d AttemptDone) {
				l.add("%s done %d %s status=%d err=%v", name, a.N, a.Upstream, d.StatusCode, d.Err != nil)
			}
		},
		OnWait:    func(w WaitEvent) { l.add("%s wait %s %s %s err=%v", name, w.Upstream, w.Reason, w.Wait, w.Err) },
		OnBreaker: func(e BreakerEvent) { l.add("%s breaker %s %s->%s", name, e.Upstream, e.From, e.To) },
		OnReport: func(r Report) {
			l.add("%s report %s attempts=%d status=%d ctx=%v", name, r.Upstream, r.Attempts, r.StatusCode, r.Context.Value(ctxKey{}))
		},
	}
}

// TestHooksSeeEveryStep: the hooks see the request, each attempt with its
// outcome, and the report, in order; the context OnRequest returns reaches
// the attempts and the report; OnAttempt's headers reach the upstream;
// joined hooks run in order and chain their contexts.
func TestHooksSeeEveryStep(t *testing.T) {
	bad, good := relaytest.NewServer(), relaytest.NewServer()
	t.Cleanup(bad.Close)
	t.Cleanup(good.Close)
	bad.Script(relaytest.Fault{Status: 503})
	var l hookLog
	var got []string
	r, err := New(Config{
		Clock:     newAutoClock(),
		Strategy:  StrategyPriority,
		Upstreams: []Upstream{{Name: "bad", BaseURL: bad.URL}, {Name: "good", BaseURL: good.URL}},
		OnReport:  func(r Report) { got = append(got, "config report") },
		Hooks:     JoinHooks(loggingHooks(&l, "one"), loggingHooks(&l, "two")),
	})
	require.NoError(t, err)
	resp, _, err := send(t, r, chatBody("gpt-4.1", "x"))
	require.NoError(t, err)
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, []string{
		"one request /v1/chat/completions (ctx <nil>)",
		"two request /v1/chat/completions (ctx one)",
		`one attempt 1 bad gpt-4.1 hedge=false retry="" ctx=two`,
		`two attempt 1 bad gpt-4.1 hedge=false retry="" ctx=two`,
		"one done 1 bad status=503 err=false",
		"two done 1 bad status=503 err=false",
		`one attempt 2 good gpt-4.1 hedge=false retry="503" ctx=two`,
		`two attempt 2 good gpt-4.1 hedge=false retry="503" ctx=two`,
		"one done 2 good status=200 err=false",
		"two done 2 good status=200 err=false",
		"one report good attempts=2 status=200 ctx=two",
		"two report good attempts=2 status=200 ctx=two",
	}, l.all())
	assert.Equal(t, []string{"config report"}, got, "Config.OnReport runs too")
	assert.Equal(t, "00-two", good.Requests()[0].Header.Get("Traceparent"))
}

// TestHooksWaitAndBreaker: OnWait sees a limiter wait, OnBreaker the
// transitions BreakerConfig.OnChange sees.
func TestHooksWaitAndBreaker(t *testing.T) {
	srv := relaytest.NewServer()
	t.Cleanup(srv.Close)
	var l hookLog
	var changes []string
	clock := newAutoClock()
	r, err := New(Config{
		Clock:     clock,
		Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL, RPM: 1}},
		Limits:    Limits{MaxWait: 2 * time.Minute},
		Breaker:   BreakerConfig{Failures: 1, OnChange: func(e BreakerEvent) { changes = append(changes, e.To.String()) }},
		Retry:     RetryConfig{MaxAttempts: 1},
		Hooks:     loggingHooks(&l, "h"),
	})
	require.NoError(t, err)
	for range 2 {
		_, _, err := send(t, r, chatBody("gpt-4.1", "x"))
		require.NoError(t, err)
	}
	assert.Contains(t, l.all(), "h wait a rate 1m0s err=<nil>")
	srv.Script(relaytest.Fault{Status: 500}, relaytest.Fault{Status: 500})
	for range 2 {
		send(t, r, chatBody("gpt-4.1", "x"))
	}
	assert.Equal(t, []string{"open"}, changes)
	assert.Contains(t, l.all(), "h breaker a closed->open")
}

// TestReportOverhead: Overhead is the router's own time, without the
// upstream call.
func TestReportOverhead(t *testing.T) {
	clock := newFakeClock()
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		clock.Advance(time.Second) // the upstream takes a second
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody}, nil
	})
	r, reps := newTestRouter(t, Config{Clock: clock, Base: base, Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test"}}})
	_, _, err := send(t, r, chatBody("gpt-4.1", strings.Repeat("x ", 100)))
	require.NoError(t, err)
	rep := reps.all()[0]
	assert.Equal(t, time.Second, rep.Latency)
	assert.Zero(t, rep.Overhead, "the fake clock moved only in the upstream")
}

// TestHooksOnSpend: a settled request tells OnSpend what each budget that
// covers it was charged, in the billing currency, with the request's
// context; a failed request charges nothing and tells nothing.
func TestHooksOnSpend(t *testing.T) {
	status := http.StatusOK
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: status, Header: http.Header{},
			Body: io.NopCloser(strings.NewReader(`{"usage":{"prompt_tokens":8,"completion_tokens":2}}`))}, nil
	})
	var mu sync.Mutex
	var got []SpendEvent
	r, reps := newTestRouter(t, Config{Base: base, Prices: budgetPrices, Clock: newAutoClock(),
		Currency:  Currency{Code: "EUR", PerUSD: 2},
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
		Budgets: []Budget{
			{Name: "all", Limit: 1000, Window: Window{Every: time.Hour}},
			{Name: "per-model", Scope: PerModel(), Limit: 1000, Window: Window{Every: time.Hour}},
			{Name: "other-model", Scope: func(_ Request, model, _ string) (string, bool) { return model, model == "x" }, Limit: 1000, Window: Window{Every: time.Hour}},
		},
		Hooks: Hooks{OnSpend: func(e SpendEvent) {
			mu.Lock()
			got = append(got, e)
			mu.Unlock()
		}},
	})
	send := func() {
		ctx := context.WithValue(context.Background(), ctxKey{}, "caller")
		resp, err := r.RoundTrip(budgetRequest(ctx, "m", ""))
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	send()
	rep := reps.all()[0]
	require.Positive(t, rep.Cost)
	mu.Lock()
	require.Len(t, got, 2, "one event per budget that covers the request")
	for i, name := range []string{"all", "per-model"} {
		assert.Equal(t, name, got[i].Budget)
		assert.InDelta(t, rep.Cost, got[i].Amount, 1e-9)
		assert.Equal(t, "EUR", got[i].Currency)
		assert.Equal(t, "caller", got[i].Context.Value(ctxKey{}))
	}
	assert.Equal(t, "m", got[1].Key, "the ledger's key")
	mu.Unlock()

	status = http.StatusBadRequest
	send()
	mu.Lock()
	assert.Len(t, got, 2, "a failed request charges nothing")
	mu.Unlock()
}

// TestHooksOnStateFallback: each shared-state call that fails is told, with
// its operation, its error and the request's context.
func TestHooksOnStateFallback(t *testing.T) {
	st := newMemState()
	st.Down.Store(true)
	var mu sync.Mutex
	var got []StateFallbackEvent
	r, _ := newTestRouter(t, Config{State: st, Replicas: 2, Clock: newAutoClock(),
		Base: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
				Body: io.NopCloser(strings.NewReader(string(fixtureBytes)))}, nil
		}),
		Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1", RPM: 100}},
		Hooks: Hooks{OnStateFallback: func(e StateFallbackEvent) {
			mu.Lock()
			got = append(got, e)
			mu.Unlock()
		}},
	})
	ctx := context.WithValue(context.Background(), ctxKey{}, "caller")
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "hi")))
	resp, err := r.RoundTrip(req)
	require.NoError(t, err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, got)
	assert.Equal(t, "admit", got[0].Op)
	assert.ErrorIs(t, got[0].Err, errDown)
	assert.Equal(t, "caller", got[0].Context.Value(ctxKey{}))
	assert.EqualValues(t, len(got), r.StateFallbacks(), "every fallback counted is told")
}

// TestPanickingOnReportStillEndsObservers: a Config.OnReport that panics
// runs before the Hooks' OnReport (an observer ending its span there), and
// must not keep it from running; the panic itself goes on to the caller
// who finished the body.
func TestPanickingOnReportStillEndsObservers(t *testing.T) {
	srv := relaytest.NewServer()
	t.Cleanup(srv.Close)
	var observed []Report
	r, err := New(Config{
		Clock:     newAutoClock(),
		Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL}},
		OnReport:  func(Report) { panic("user hook") },
		Hooks:     Hooks{OnReport: func(rep Report) { observed = append(observed, rep) }},
	})
	require.NoError(t, err)
	req := httptest.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
	resp, err := r.RoundTrip(req)
	require.NoError(t, err)
	assert.PanicsWithValue(t, "user hook", func() {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	})
	require.Len(t, observed, 1, "the observer's OnReport ran despite the panic before it")
	assert.Equal(t, "a", observed[0].Upstream)

	// The same for every joined hook, in order.
	var order []string
	h := JoinHooks(
		Hooks{OnWait: func(WaitEvent) { order = append(order, "one"); panic("one") }},
		Hooks{OnWait: func(WaitEvent) { order = append(order, "two") }},
	)
	assert.PanicsWithValue(t, "one", func() { h.OnWait(WaitEvent{}) })
	assert.Equal(t, []string{"one", "two"}, order)
}

// TestStateFallbackOpsComplete: every operation the router reports to
// OnStateFallback (each stateFailed or shared call in its source) is in
// StateFallbackOps, which the observers label by.
func TestStateFallbackOpsComplete(t *testing.T) {
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	call := regexp.MustCompile(`(?:stateFailed|r\.shared)\([^"\n]*"([a-z]+)"`)
	found := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range call.FindAllStringSubmatch(string(src), -1) {
			found++
			assert.Contains(t, StateFallbackOps(), m[1], "%s reports op %q", f, m[1])
		}
	}
	assert.GreaterOrEqual(t, found, 7, "the stateFailed calls were found")
}
