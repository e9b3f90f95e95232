package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay/relaytest"
)

func TestDefaultShouldRetry(t *testing.T) {
	resp := func(status int, h ...string) *http.Response {
		r := &http.Response{StatusCode: status, Header: http.Header{}}
		for i := 0; i+1 < len(h); i += 2 {
			r.Header.Set(h[i], h[i+1])
		}
		return r
	}
	cases := []struct {
		name string
		resp *http.Response
		err  error
		want bool
	}{
		{"refused", nil, &netErr{syscall.ECONNREFUSED}, true},
		{"reset", nil, syscall.ECONNRESET, true},
		{"eof before headers", nil, io.EOF, true},
		{"attempt timeout", nil, ErrAttemptTimeout, true},
		{"cancelled", nil, context.Canceled, false},
		{"cancelled wrapped", nil, fmt.Errorf("x: %w", context.Canceled), false},
		{"200", resp(200), nil, false},
		{"400", resp(400), nil, false},
		{"401", resp(401), nil, false},
		{"403", resp(403), nil, false},
		{"404", resp(404), nil, false},
		{"422", resp(422), nil, false},
		{"408", resp(408), nil, true},
		{"409", resp(409), nil, true},
		{"429", resp(429), nil, true},
		{"500", resp(500), nil, true},
		{"502", resp(502), nil, true},
		{"503", resp(503), nil, true},
		{"504", resp(504), nil, true},
		{"501", resp(501), nil, false},
		{"x-should-retry true on 400", resp(400, "x-should-retry", "true"), nil, true},
		{"x-should-retry false on 503", resp(503, "x-should-retry", "false"), nil, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, DefaultShouldRetry(c.resp, c.err))
		})
	}
}

type netErr struct{ error }

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	cases := []struct {
		name   string
		header map[string]string
		want   time.Duration
		ok     bool
	}{
		{"ms", map[string]string{"retry-after-ms": "250"}, 250 * time.Millisecond, true},
		{"ms fractional", map[string]string{"retry-after-ms": "1.5"}, 1500 * time.Microsecond, true},
		{"ms wins over seconds", map[string]string{"retry-after-ms": "20", "Retry-After": "3"}, 20 * time.Millisecond, true},
		{"seconds", map[string]string{"Retry-After": "2"}, 2 * time.Second, true},
		{"seconds fractional", map[string]string{"Retry-After": "0.5"}, 500 * time.Millisecond, true},
		{"http date", map[string]string{"Retry-After": now.Add(7 * time.Second).Format(http.TimeFormat)}, 7 * time.Second, true},
		{"http date past", map[string]string{"Retry-After": now.Add(-time.Hour).Format(http.TimeFormat)}, 0, true},
		{"absurd: longer than any cap", map[string]string{"Retry-After": "99999999999"}, math.MaxInt64, true},
		{"absurd ms", map[string]string{"retry-after-ms": "1e13"}, math.MaxInt64, true},
		{"infinite", map[string]string{"Retry-After": "+Inf"}, math.MaxInt64, true},
		{"not a number", map[string]string{"Retry-After": "NaN"}, 0, false},
		{"negative", map[string]string{"Retry-After": "-3"}, 0, false},
		{"negative ms falls to seconds", map[string]string{"retry-after-ms": "-1", "Retry-After": "1"}, time.Second, true},
		{"garbage", map[string]string{"Retry-After": "soon"}, 0, false},
		{"none", nil, 0, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range c.header {
				h.Set(k, v)
			}
			d, ok := RetryAfter(h, now)
			assert.Equal(t, c.ok, ok)
			assert.Equal(t, c.want, d)
		})
	}
}

// defaultBackoff returns the backoff a router built from c uses when
// RetryConfig.Backoff is nil.
func defaultBackoff(t *testing.T, c RetryConfig) backoff.BackOff {
	r, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://127.0.0.1:1"}}, Retry: c})
	require.NoError(t, err)
	return exponential(&r.s.retry)
}

func TestDefaultBackOff(t *testing.T) {
	b := defaultBackoff(t, RetryConfig{RandomizationFactor: -1})
	var got []time.Duration
	for range 6 {
		got = append(got, b.NextBackOff())
	}
	ms := time.Millisecond
	assert.Equal(t, []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, 1200 * ms, 1200 * ms}, got)
	b = defaultBackoff(t, RetryConfig{})
	for range 20 {
		d := b.NextBackOff()
		assert.True(t, d >= 50*ms && d <= 1800*ms, d)
	}
}

// retryRouter builds a router over relaytest servers with a jumping fake
// clock and no backoff randomisation.
func retryRouter(t *testing.T, cfg Config, srvs ...*relaytest.Server) (*Router, *reports, *fakeClock) {
	t.Helper()
	clock := newAutoClock()
	cfg.Clock = clock
	cfg.Retry.RandomizationFactor = -1
	for i, s := range srvs {
		cfg.Upstreams = append(cfg.Upstreams, Upstream{Name: fmt.Sprintf("u%d", i), BaseURL: s.URL})
	}
	r, reps := newTestRouter(t, cfg)
	return r, reps, clock
}

func newServers(t *testing.T, n int) []*relaytest.Server {
	srvs := make([]*relaytest.Server, n)
	for i := range srvs {
		srvs[i] = relaytest.NewServer(relaytest.WithName(fmt.Sprintf("u%d", i)))
		t.Cleanup(srvs[i].Close)
	}
	return srvs
}

func send(t *testing.T, r http.RoundTripper, body string) (*http.Response, []byte, error) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(body))
	resp, err := r.RoundTrip(req)
	if err != nil {
		return nil, nil, err
	}
	b, rerr := io.ReadAll(resp.Body)
	require.NoError(t, rerr)
	resp.Body.Close()
	return resp, b, nil
}

func TestRetryNextCandidateAndHints(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		name      string
		faults    [][]relaytest.Fault // per server
		wantUp    string
		wantCode  int
		attempts  int
		wantWaits []time.Duration
	}{
		{"503 then next upstream", [][]relaytest.Fault{{{Status: 503}}, nil}, "u1", 200, 2, []time.Duration{100 * ms}},
		{"retry-after-ms honoured", [][]relaytest.Fault{{{Status: 429, Header: http.Header{"Retry-After-Ms": {"350"}}}}}, "u0", 200, 2, []time.Duration{350 * ms}},
		{"retry-after seconds honoured", [][]relaytest.Fault{{{Status: 429, Header: http.Header{"Retry-After": {"2"}}}}}, "u0", 200, 2, []time.Duration{2 * time.Second}},
		{"hint does not leak into next wait", [][]relaytest.Fault{{{Status: 429, Header: http.Header{"Retry-After": {"3"}}}, {Status: 500}}}, "u0", 200, 3, []time.Duration{3 * time.Second, 100 * ms}},
		{"hint over cap returns now", [][]relaytest.Fault{{{Status: 429, Header: http.Header{"Retry-After": {"60"}}}}}, "u0", 429, 1, nil},
		{"another upstream is tried after the backoff, not the hint", [][]relaytest.Fault{{{Status: 429, Header: http.Header{"Retry-After": {"60"}}}}, nil}, "u1", 200, 2, []time.Duration{100 * ms}},
		{"garbage hint uses backoff", [][]relaytest.Fault{{{Status: 429, Header: http.Header{"Retry-After": {"later"}}}}, nil}, "u1", 200, 2, []time.Duration{100 * ms}},
		{"400 not retried", [][]relaytest.Fault{{{Status: 400}}, nil}, "u0", 400, 1, nil},
		{"x-should-retry false", [][]relaytest.Fault{{{Status: 503, Header: http.Header{"X-Should-Retry": {"false"}}}}, nil}, "u0", 503, 1, nil},
		{"x-should-retry true", [][]relaytest.Fault{{{Status: 400, Header: http.Header{"X-Should-Retry": {"true"}}}}, nil}, "u1", 200, 2, []time.Duration{100 * ms}},
		{"dropped connection", [][]relaytest.Fault{{{Drop: true}}, nil}, "u1", 200, 2, []time.Duration{100 * ms}},
		{"a response beats a later connection error", [][]relaytest.Fault{{{Status: 503}, {Drop: true}}, {{Drop: true}}}, "u0", 503, 3, []time.Duration{100 * ms, 200 * ms}},
		{"retry-after 0 retries at once", [][]relaytest.Fault{{{Status: 503, Header: http.Header{"Retry-After": {"0"}}}}}, "u0", 200, 2, nil},
		{"all fail: last response returned", [][]relaytest.Fault{{{Status: 500}, {Status: 502, Body: `{"error":{"message":"last"}}`}}, {{Status: 503}}}, "u0", 502, 3, []time.Duration{100 * ms, 200 * ms}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srvs := newServers(t, len(c.faults)) // one list of faults per upstream
			for i, f := range c.faults {
				srvs[i].Script(f...)
			}
			r, reps, clock := retryRouter(t, Config{}, srvs...)
			body := chatBody("gpt-4.1", "hello")
			resp, b, err := send(t, r, body)
			require.NoError(t, err)
			assert.Equal(t, c.wantCode, resp.StatusCode)
			if c.name == "all fail: last response returned" {
				assert.Equal(t, `{"error":{"message":"last"}}`, string(b), "body intact")
			}
			rep := reps.all()[0]
			assert.Equal(t, c.wantUp, rep.Upstream)
			assert.Equal(t, c.attempts, rep.Attempts)
			assert.Equal(t, c.wantCode, rep.StatusCode)
			assert.Equal(t, c.wantWaits, clock.Waits())
			// Every attempt replayed identical bytes.
			for _, s := range srvs {
				for _, q := range s.Requests() {
					assert.Equal(t, body, string(q.Body))
				}
			}
		})
	}
}

func TestRetryFallbackModels(t *testing.T) {
	srvs := newServers(t, 3)
	srvs[0].SetDefault(relaytest.Fault{Status: 503})
	clock := newAutoClock()
	r, reps := newTestRouter(t, Config{
		Clock: clock,
		Upstreams: []Upstream{
			{Name: "flash", BaseURL: srvs[0].URL, Models: []string{"gemini-2.5-flash"}},
			{Name: "codex", BaseURL: srvs[1].URL, Models: []string{"gpt-5.5-codex"}},
			{Name: "cheap", BaseURL: srvs[2].URL, Models: []string{"deepseek-v3.2"}},
		},
		Policy: PolicyFunc(func(q Request) Route {
			return Route{Model: "gemini-2.5-flash", Fallbacks: []string{"gpt-5.5-codex", "deepseek-v3.2"}}
		}),
	})
	resp, _, err := send(t, r, chatBody("gpt-5.5-codex", "hi"))
	require.NoError(t, err)
	assert.Equal(t, 200, resp.StatusCode)
	rep := reps.all()[0]
	assert.Equal(t, "gpt-5.5-codex", rep.Model, "the model that answered")
	assert.Equal(t, "codex", rep.Upstream)
	assert.Equal(t, 2, rep.Attempts)
	assert.Equal(t, "gemini-2.5-flash", srvs[0].Requests()[0].Model)
	assert.Equal(t, "gpt-5.5-codex", srvs[1].Requests()[0].Model, "model rewritten for the fallback")
}

func TestRetryAttemptTimeout(t *testing.T) {
	srvs := newServers(t, 2)
	srvs[0].Script(relaytest.Fault{Hang: true})
	clock := newFakeClock()
	r, reps := newTestRouter(t, Config{
		Clock:     clock,
		Retry:     RetryConfig{AttemptTimeout: 5 * time.Second, InitialInterval: time.Millisecond, RandomizationFactor: -1},
		Upstreams: []Upstream{{Name: "hang", BaseURL: srvs[0].URL}, {Name: "ok", BaseURL: srvs[1].URL}},
	})
	done := make(chan *http.Response)
	go func() {
		resp, _, err := send(t, r, chatBody("gpt-4.1", "hi"))
		assert.NoError(t, err)
		done <- resp
	}()
	// The attempt timer is armed; once the hung call reached the server,
	// advance past the timeout, then past the backoff.
	require.Equal(t, 5*time.Second, <-clock.armed)
	require.Eventually(t, func() bool { return srvs[0].Calls() == 1 }, 5*time.Second, time.Millisecond)
	clock.Advance(5 * time.Second)
	require.Equal(t, time.Millisecond, <-clock.armed)
	clock.Advance(time.Millisecond)
	<-clock.armed // second attempt's timer
	resp := <-done
	assert.Equal(t, 200, resp.StatusCode)
	rep := reps.all()[0]
	assert.Equal(t, "ok", rep.Upstream)
	assert.Equal(t, 2, rep.Attempts)
}

func TestRetryCancelDuringBackoff(t *testing.T) {
	srvs := newServers(t, 1)
	srvs[0].SetDefault(relaytest.Fault{Status: 503})
	clock := newFakeClock()
	r, reps := newTestRouter(t, Config{Clock: clock, Upstreams: []Upstream{{Name: "a", BaseURL: srvs[0].URL}}})
	ctx, cancel := context.WithCancel(context.Background())
	errc := roundTripAsync(r, ctx)
	<-clock.armed // in backoff now
	cancel()
	err := <-errc
	assert.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, 1, srvs[0].Calls())
	require.Len(t, reps.all(), 1)
	assert.ErrorIs(t, reps.all()[0].Err, context.Canceled)
	assert.Equal(t, "a", reps.all()[0].Upstream, "the report names the upstream last tried")
}

func TestRetryCancelDuringRequest(t *testing.T) {
	srvs := newServers(t, 2)
	srvs[0].Script(relaytest.Fault{Hang: true})
	r, reps, _ := retryRouter(t, Config{}, srvs...)
	ctx, cancel := context.WithCancel(context.Background())
	errc := roundTripAsync(r, ctx)
	require.Eventually(t, func() bool { return srvs[0].Calls() == 1 }, 5*time.Second, time.Millisecond)
	cancel()
	assert.ErrorIs(t, <-errc, context.Canceled)
	assert.Zero(t, srvs[1].Calls(), "a cancelled request is not retried")
	assert.Len(t, reps.all(), 1)
}

func TestRetryErrorWhenNoResponseEver(t *testing.T) {
	srvs := newServers(t, 2)
	for _, s := range srvs {
		s.SetDefault(relaytest.Fault{Drop: true})
	}
	r, reps, _ := retryRouter(t, Config{}, srvs...)
	_, _, err := send(t, r, chatBody("gpt-4.1", "x"))
	require.Error(t, err)
	var rerr *Error
	require.True(t, errors.As(err, &rerr))
	assert.Equal(t, 3, reps.all()[0].Attempts)
	assert.Zero(t, reps.all()[0].StatusCode)
}

// TestHugeRetryAfterReturnsAtOnce: a hint too long for any wait (beyond a
// Duration, or infinite) returns the response at once, as every hint over
// MaxRetryAfter does.
func TestHugeRetryAfterReturnsAtOnce(t *testing.T) {
	for _, h := range []map[string]string{
		{"Retry-After": "99999999999"},
		{"Retry-After-Ms": "1000000000000"},
		{"Retry-After": "+Inf"},
	} {
		srv := relaytest.NewServer()
		t.Cleanup(srv.Close)
		hdr := http.Header{}
		for k, v := range h {
			hdr.Set(k, v)
		}
		srv.Script(relaytest.Fault{Status: 429, Header: hdr}, relaytest.Fault{Status: 429, Header: hdr}, relaytest.Fault{Status: 429, Header: hdr})
		r, reps, _ := retryRouter(t, Config{}, srv)
		resp, _, err := send(t, r, chatBody("gpt-4.1", "x"))
		require.NoError(t, err)
		assert.Equal(t, 429, resp.StatusCode, "%v", h)
		assert.Len(t, srv.Requests(), 1, "%v: no retry", h)
		assert.Equal(t, 1, reps.all()[0].Attempts)
	}
}
