package relay

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/tokenrelay/relay/relaytest"
)

// clampUpstream is a relaytest upstream on loopback, closed with the test.
func clampUpstream(t *testing.T) *relaytest.Server {
	srv := relaytest.NewServer()
	t.Cleanup(srv.Close)
	return srv
}

// clampSend sends body to the endpoint ("chat/completions", "responses")
// and reads the answer to its end.
func clampSend(t *testing.T, r http.RoundTripper, endpoint, body string) (*http.Response, []byte, error) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://relay/v1/"+endpoint, strings.NewReader(body))
	resp, err := r.RoundTrip(req)
	if err != nil {
		return nil, nil, err
	}
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return resp, b, nil
}

// clampBody is a request for model with a prompt of words words and, when
// field is set, that output-token limit.
func clampBody(endpoint, model string, words int, field string, limit int, stream bool) string {
	text := strings.Repeat("word ", words)
	b := `{"model":"` + model + `",`
	if endpoint == EndpointResponses {
		b += `"input":"` + text + `"`
	} else {
		b += `"messages":[{"role":"user","content":"` + text + `"}]`
	}
	if field != "" {
		b += `,"` + field + `":` + itoa(limit)
	}
	if stream {
		b += `,"stream":true`
	}
	return b + "}"
}

// TestClampWindowRewritesTheLimit: with the clamp on, a request asking for
// more output than its model's window stays on its model, and the body
// the upstream receives carries the window as its limit, in the field the
// caller used: each of the three, chat and Responses, plain and streamed.
// The report says what was clamped and why.
func TestClampWindowRewritesTheLimit(t *testing.T) {
	srv := clampUpstream(t)
	r, reps := newTestRouter(t, Config{Prices: windowPrices, Clamp: ClampConfig{MaxTokens: true},
		Upstreams: []Upstream{{Name: "u", BaseURL: srv.URL}}})
	cases := []struct {
		endpoint, field string
		stream          bool
	}{
		{EndpointChat, "max_tokens", false},
		{EndpointChat, "max_completion_tokens", false},
		{EndpointChat, "max_completion_tokens", true},
		{EndpointCompletions, "max_tokens", false},
		{EndpointResponses, "max_output_tokens", false},
		{EndpointResponses, "max_output_tokens", true},
	}
	for i, c := range cases {
		body := clampBody(c.endpoint, "small", 10, c.field, 500, c.stream)
		if c.endpoint == EndpointCompletions {
			body = `{"model":"small","prompt":"word word","max_tokens":500}`
		}
		resp, out, err := clampSend(t, r, c.endpoint, body)
		require.NoError(t, err, "%+v", c)
		assert.Equal(t, 200, resp.StatusCode, "%+v: %s", c, out)
		got := srv.Requests()
		require.Len(t, got, i+1)
		sent := got[i].Body
		assert.Equal(t, int64(50), gjson.GetBytes(sent, c.field).Int(), "%+v: %s", c, sent)
		assert.Equal(t, "small", got[i].Model, "it stays on its model")
		assert.Equal(t, c.stream, got[i].Stream)
		for _, f := range limitFields {
			if f != c.field {
				assert.False(t, gjson.GetBytes(sent, f).Exists(), "%+v: %s appeared", c, f)
			}
		}
		rep := reps.all()[i]
		assert.Equal(t, Clamp{From: 500, To: 50, Reason: ConstraintContextWindow}, rep.Clamp, "%+v", c)
		assert.Empty(t, rep.Constraint, "the route did not change")
		assert.NoError(t, rep.Err)
	}

	// Every limit field the body holds is rewritten; the rest of the body
	// is kept byte for byte.
	body := `{"model":"small","max_tokens":400,"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":500,"temperature":0.5}`
	_, _, err := clampSend(t, r, EndpointChat, body)
	require.NoError(t, err)
	got := srv.Requests()
	assert.Equal(t, `{"model":"small","max_tokens":50,"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":50,"temperature":0.5}`,
		string(got[len(got)-1].Body))

	// A request that fits is left alone.
	_, _, err = clampSend(t, r, EndpointChat, clampBody(EndpointChat, "small", 10, "max_tokens", 40, false))
	require.NoError(t, err)
	got = srv.Requests()
	assert.Equal(t, int64(40), gjson.GetBytes(got[len(got)-1].Body, "max_tokens").Int())
	assert.Zero(t, reps.all()[len(got)-1].Clamp)
}

// TestClampOffByDefault: without Config.Clamp, a request whose limit does
// not fit is refused as before (ErrContextWindow, no upstream call); one
// the budget cannot pay for too (ErrBudgetExceeded).
func TestClampOffByDefault(t *testing.T) {
	srv := clampUpstream(t)
	r, reps := newTestRouter(t, Config{Prices: windowPrices, Upstreams: []Upstream{{Name: "u", BaseURL: srv.URL}}})
	_, _, err := clampSend(t, r, EndpointChat, clampBody(EndpointChat, "small", 10, "max_tokens", 500, false))
	require.ErrorIs(t, err, ErrContextWindow)
	assert.Zero(t, srv.Calls())
	assert.Zero(t, reps.all()[0].Clamp)

	rb, _ := newTestRouter(t, Config{Prices: budgetPrices, Clock: newFakeClock(), Upstreams: []Upstream{{Name: "u", BaseURL: srv.URL}},
		Budgets: []Budget{{Name: "cap", Limit: 50, Window: Window{Every: time.Hour}}}})
	_, _, err = clampSend(t, rb, EndpointChat, clampBody(EndpointChat, "m", 1, "max_tokens", 100, false))
	require.ErrorIs(t, err, ErrBudgetExceeded)
	assert.Zero(t, srv.Calls())
}

// TestClampWindowMinimum: a clamp would leave less than MinTokens (16 by
// default): the request is refused with ErrContextWindow, as without the
// clamp; with a lower MinTokens it is clamped.
func TestClampWindowMinimum(t *testing.T) {
	srv := clampUpstream(t)
	prices := map[string]Price{"tiny": {InputPerMTok: 1, OutputPerMTok: 1, MaxInputTokens: 100, MaxOutputTokens: 10}}
	r, reps := newTestRouter(t, Config{Prices: prices, Clamp: ClampConfig{MaxTokens: true}, Upstreams: []Upstream{{Name: "u", BaseURL: srv.URL}}})
	_, _, err := clampSend(t, r, EndpointChat, clampBody(EndpointChat, "tiny", 10, "max_tokens", 500, false))
	require.ErrorIs(t, err, ErrContextWindow)
	assert.Contains(t, err.Error(), "500 output tokens")
	assert.Zero(t, srv.Calls())
	assert.Zero(t, reps.all()[0].Clamp)

	r2, reps2 := newTestRouter(t, Config{Prices: prices, Clamp: ClampConfig{MaxTokens: true, MinTokens: 10}, Upstreams: []Upstream{{Name: "u", BaseURL: srv.URL}}})
	_, _, err = clampSend(t, r2, EndpointChat, clampBody(EndpointChat, "tiny", 10, "max_tokens", 500, false))
	require.NoError(t, err)
	assert.Equal(t, int64(10), gjson.GetBytes(srv.Requests()[0].Body, "max_tokens").Int())
	assert.Equal(t, 10, reps2.all()[0].Clamp.To)

	// A prompt too long for every window is not helped by a clamp.
	_, _, err = clampSend(t, r2, EndpointChat, clampBody(EndpointChat, "tiny", 200, "max_tokens", 500, false))
	require.ErrorIs(t, err, ErrContextWindow)

	_, err = New(Config{Upstreams: []Upstream{{Name: "u", BaseURL: srv.URL}}, Clamp: ClampConfig{MaxTokens: true, MinTokens: -1}})
	require.ErrorContains(t, err, "Clamp.MinTokens -1 is negative")
}

// TestClampBeforeContextFallbacks: with the clamp on, a request whose
// prompt fits its routed model but whose limit does not is clamped on that
// model rather than moved to a ContextFallbacks model; a prompt too long
// for it still moves, unclamped, to the fallback that fits it whole; and
// when no model fits the whole request, it is clamped on the first whose
// input window fits the prompt. With the clamp off, the fallback takes it.
func TestClampBeforeContextFallbacks(t *testing.T) {
	srv := clampUpstream(t)
	cfg := Config{Prices: windowPrices, ContextFallbacks: []string{"large"}, Clamp: ClampConfig{MaxTokens: true},
		Upstreams: []Upstream{{Name: "u", BaseURL: srv.URL}}}
	r, reps := newTestRouter(t, cfg)
	sent := func(i int) (string, int64) {
		rec := srv.Requests()[i]
		return rec.Model, gjson.GetBytes(rec.Body, "max_tokens").Int()
	}

	_, _, err := clampSend(t, r, EndpointChat, clampBody(EndpointChat, "small", 10, "max_tokens", 500, false))
	require.NoError(t, err)
	model, limit := sent(0)
	assert.Equal(t, "small", model)
	assert.EqualValues(t, 50, limit)
	assert.Equal(t, Clamp{From: 500, To: 50, Reason: ConstraintContextWindow}, reps.all()[0].Clamp)

	_, _, err = clampSend(t, r, EndpointChat, clampBody(EndpointChat, "small", 200, "max_tokens", 500, false))
	require.NoError(t, err)
	model, limit = sent(1)
	assert.Equal(t, "large", model)
	assert.EqualValues(t, 500, limit)
	assert.Zero(t, reps.all()[1].Clamp)
	assert.Equal(t, ConstraintContextWindow, reps.all()[1].Constraint)

	_, _, err = clampSend(t, r, EndpointChat, clampBody(EndpointChat, "small", 200, "max_tokens", 5000, false))
	require.NoError(t, err)
	model, limit = sent(2)
	assert.Equal(t, "large", model)
	assert.EqualValues(t, 1000, limit)
	assert.Equal(t, Clamp{From: 5000, To: 1000, Reason: ConstraintContextWindow}, reps.all()[2].Clamp)

	// Decide shows the clamp, and the limit the policy saw.
	req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(clampBody(EndpointChat, "small", 10, "max_tokens", 500, false)))
	d, err := r.Decide(req)
	require.NoError(t, err)
	assert.Equal(t, Clamp{From: 500, To: 50, Reason: ConstraintContextWindow}, d.Clamp)
	assert.Equal(t, 500, d.Request.MaxTokens)
	assert.Equal(t, "small", d.Candidates[0].Model)

	cfg.Clamp = ClampConfig{}
	off, _ := newTestRouter(t, cfg)
	_, _, err = clampSend(t, off, EndpointChat, clampBody(EndpointChat, "small", 10, "max_tokens", 500, false))
	require.NoError(t, err)
	model, limit = sent(3)
	assert.Equal(t, "large", model, "without the clamp the fallback takes it")
	assert.EqualValues(t, 500, limit)
}

// budgetClampRouter is a router over srv with one AllTraffic budget of
// limit dollars on budgetPrices ($1 a token of "m"), the clamp on.
func budgetClampRouter(t *testing.T, srv *relaytest.Server, limit float64, downgrade string, hooks Hooks) (*Router, *reports) {
	return newTestRouter(t, Config{Prices: budgetPrices, Clock: newFakeClock(), Clamp: ClampConfig{MaxTokens: true}, Hooks: hooks,
		Upstreams: []Upstream{{Name: "u", BaseURL: srv.URL}},
		Budgets:   []Budget{{Name: "cap", Limit: limit, Window: Window{Every: time.Hour}, Downgrade: downgrade}}})
}

// promptTokens is the router's count of body's prompt.
func promptTokens(t *testing.T, r *Router, endpoint, body string) int {
	req, _ := http.NewRequest("POST", "http://relay/v1/"+endpoint, strings.NewReader(body))
	d, err := r.Decide(req)
	require.NoError(t, err)
	require.Positive(t, d.Request.PromptTokens)
	return d.Request.PromptTokens
}

// TestClampBudgetUsesWhatIsLeft: a request the budget cannot pay for at
// its limit is sent with the limit what is left of the budget pays for,
// after its prompt's input cost: the body carries it, the budget reserves
// it (seen from OnAttempt, while the request is in flight), and the report
// names the budget. Settled spend stays within the limit.
func TestClampBudgetUsesWhatIsLeft(t *testing.T) {
	srv := clampUpstream(t)
	var r *Router
	var reserved []float64
	hooks := Hooks{OnAttempt: func(context.Context, AttemptInfo, *http.Request) func(AttemptDone) {
		reserved = append(reserved, r.Spend()[0].Reserved)
		return nil
	}}
	r, reps := budgetClampRouter(t, srv, 200, "", hooks)

	// A first request spends part of the budget.
	first := clampBody(EndpointChat, "m", 1, "max_tokens", 20, false)
	_, _, err := clampSend(t, r, EndpointChat, first)
	require.NoError(t, err)
	assert.Zero(t, reps.all()[0].Clamp)
	left := 200 - r.Spend()[0].Spent
	require.Less(t, left, 200.0)

	body := clampBody(EndpointChat, "m", 3, "max_tokens", 1000, false)
	p := promptTokens(t, r, EndpointChat, body)
	want := int(left) - p // $1 a token: what is left pays for that many output tokens after the prompt
	_, _, err = clampSend(t, r, EndpointChat, body)
	require.NoError(t, err)
	got := srv.Requests()
	require.Len(t, got, 2)
	assert.EqualValues(t, want, gjson.GetBytes(got[1].Body, "max_tokens").Int(), "%s", got[1].Body)
	assert.Equal(t, Clamp{From: 1000, To: want, Reason: ConstraintBudget, Budget: "cap"}, reps.all()[1].Clamp)
	require.Len(t, reserved, 2)
	assert.InDelta(t, float64(p+want), reserved[1], 1e-6, "the reservation is the clamped limit's")
	spend := r.Spend()[0]
	assert.LessOrEqual(t, spend.Spent, 200.0)
	assert.Zero(t, spend.Reserved)
}

// TestClampBudgetStreamsAndUnsetLimits: a streamed request is clamped the
// same way; a request with no limit, reserved at DefaultMaxTokens, gets
// one written into its body (max_completion_tokens on chat,
// max_output_tokens on Responses), and its report's From is 0.
func TestClampBudgetStreamsAndUnsetLimits(t *testing.T) {
	srv := clampUpstream(t)
	cases := []struct {
		endpoint, field, sent string
		limit                 int
		stream                bool
	}{
		{EndpointChat, "max_completion_tokens", "max_completion_tokens", 500, true},
		{EndpointResponses, "max_output_tokens", "max_output_tokens", 500, true},
		{EndpointChat, "", "max_completion_tokens", 0, false},
		{EndpointResponses, "", "max_output_tokens", 0, true},
	}
	for i, c := range cases {
		r, reps := budgetClampRouter(t, srv, 100, "", Hooks{})
		body := clampBody(c.endpoint, "m", 2, c.field, c.limit, c.stream)
		want := 100 - promptTokens(t, r, c.endpoint, body)
		resp, _, err := clampSend(t, r, c.endpoint, body)
		require.NoError(t, err, "%+v", c)
		assert.Equal(t, 200, resp.StatusCode)
		rec := srv.Requests()[i]
		assert.Equal(t, c.stream, rec.Stream)
		assert.EqualValues(t, want, gjson.GetBytes(rec.Body, c.sent).Int(), "%+v: %s", c, rec.Body)
		assert.Equal(t, Clamp{From: c.limit, To: want, Reason: ConstraintBudget, Budget: "cap"}, reps.all()[0].Clamp, "%+v", c)
		assert.LessOrEqual(t, r.Spend()[0].Spent, 100.0)
	}
}

// TestClampBudgetMinimumAndDowngrade: a budget clamp that would leave
// less than MinTokens is not made: the budget's Downgrade model is tried
// (at the caller's limit), and without one the request is refused with
// ErrBudgetExceeded, no upstream called. A clamp that fits comes before
// the Downgrade.
func TestClampBudgetMinimumAndDowngrade(t *testing.T) {
	srv := clampUpstream(t)
	body := clampBody(EndpointChat, "m", 2, "max_tokens", 100, false)

	r, reps := budgetClampRouter(t, srv, 100, "cheap", Hooks{})
	p := promptTokens(t, r, EndpointChat, body)
	_, _, err := clampSend(t, r, EndpointChat, body)
	require.NoError(t, err)
	rec := srv.Requests()[0]
	assert.Equal(t, "m", rec.Model, "clamped on its model rather than downgraded")
	assert.EqualValues(t, 100-p, gjson.GetBytes(rec.Body, "max_tokens").Int())
	assert.Empty(t, reps.all()[0].Constraint)

	// Room for fewer than 16 output tokens: the downgrade, unclamped.
	tight := float64(p + 10)
	r, reps = budgetClampRouter(t, srv, tight, "cheap", Hooks{})
	_, _, err = clampSend(t, r, EndpointChat, body)
	require.NoError(t, err)
	rec = srv.Requests()[1]
	assert.Equal(t, "cheap", rec.Model)
	assert.EqualValues(t, 100, gjson.GetBytes(rec.Body, "max_tokens").Int())
	assert.Equal(t, ConstraintBudget, reps.all()[0].Constraint)
	assert.Zero(t, reps.all()[0].Clamp)

	// No downgrade: refused, as without the clamp.
	r, reps = budgetClampRouter(t, srv, tight, "", Hooks{})
	_, _, err = clampSend(t, r, EndpointChat, body)
	require.ErrorIs(t, err, ErrBudgetExceeded)
	assert.Equal(t, 2, srv.Calls(), "no upstream called")
	assert.Equal(t, "cap", reps.all()[0].Budget)
	assert.Zero(t, reps.all()[0].Clamp)

	// A body the router cannot edit (not a JSON object) is not clamped:
	// its limit could not be written.
	r, reps = newTestRouter(t, Config{Prices: budgetPrices, Clock: newFakeClock(), Clamp: ClampConfig{MaxTokens: true},
		Policy:    PolicyFunc(func(Request) Route { return Route{Model: "m"} }), // (priced: the budget counts it)
		Upstreams: []Upstream{{Name: "u", BaseURL: srv.URL}},
		Budgets:   []Budget{{Name: "cap", Limit: 100, Window: Window{Every: time.Hour}}}})
	_, _, err = clampSend(t, r, EndpointChat, `not json`)
	require.ErrorIs(t, err, ErrBudgetExceeded, "reserved at DefaultMaxTokens, 1024")
	assert.Zero(t, reps.all()[0].Clamp)
	assert.Equal(t, 2, srv.Calls())
}

// TestClampWindowThenBudget: a request clamped to its model's window is
// reserved at the window; when the budget cannot pay even for that, it is
// clamped again, to what the budget pays for, and the report keeps the
// caller's limit as From.
func TestClampWindowThenBudget(t *testing.T) {
	srv := clampUpstream(t)
	prices := map[string]Price{"w": {InputPerMTok: 1e6, OutputPerMTok: 1e6, MaxInputTokens: 1000, MaxOutputTokens: 60}}
	body := clampBody(EndpointChat, "w", 2, "max_tokens", 500, false)
	for i, limit := range []float64{100, 50} {
		r, reps := newTestRouter(t, Config{Prices: prices, Clock: newFakeClock(), Clamp: ClampConfig{MaxTokens: true},
			Upstreams: []Upstream{{Name: "u", BaseURL: srv.URL}},
			Budgets:   []Budget{{Name: "cap", Limit: limit, Window: Window{Every: time.Hour}}}})
		p := promptTokens(t, r, EndpointChat, body)
		want := Clamp{From: 500, To: 60, Reason: ConstraintContextWindow}
		if limit < float64(p+60) {
			want = Clamp{From: 500, To: int(limit) - p, Reason: ConstraintBudget, Budget: "cap"}
		}
		require.Equal(t, []string{ConstraintContextWindow, ConstraintBudget}[i], want.Reason, "%d prompt tokens", p)
		_, _, err := clampSend(t, r, EndpointChat, body)
		require.NoError(t, err)
		assert.Equal(t, want, reps.all()[0].Clamp)
		assert.EqualValues(t, want.To, gjson.GetBytes(srv.Requests()[i].Body, "max_tokens").Int())
	}
	assert.Equal(t, 2, srv.Calls())
}

// TestClampDowngradeToItsWindow: a budget's Downgrade model whose output
// window is below the request's limit is refused without the clamp (the
// downgrade would fail with context_length_exceeded); with it, the request
// is downgraded with its limit clamped to that window.
func TestClampDowngradeToItsWindow(t *testing.T) {
	srv := clampUpstream(t)
	prices := map[string]Price{
		"m":     {InputPerMTok: 1e6, OutputPerMTok: 1e6, MaxInputTokens: 1000, MaxOutputTokens: 1000},
		"cheap": {InputPerMTok: 1e5, OutputPerMTok: 1e5, MaxInputTokens: 1000, MaxOutputTokens: 100},
	}
	body := clampBody(EndpointChat, "m", 2, "max_tokens", 500, false)
	for _, on := range []bool{false, true} {
		r, reps := newTestRouter(t, Config{Prices: prices, Clock: newFakeClock(), Clamp: ClampConfig{MaxTokens: on},
			Upstreams: []Upstream{{Name: "u", BaseURL: srv.URL}},
			Budgets:   []Budget{{Name: "cap", Limit: 20, Window: Window{Every: time.Hour}, Downgrade: "cheap"}}})
		p := promptTokens(t, r, EndpointChat, body)
		require.Less(t, 20, p+16, "m cannot pay for the minimum")
		_, _, err := clampSend(t, r, EndpointChat, body)
		rep := reps.all()[0]
		if !on {
			require.ErrorIs(t, err, ErrBudgetExceeded)
			assert.Zero(t, srv.Calls())
			continue
		}
		require.NoError(t, err)
		rec := srv.Requests()[0]
		assert.Equal(t, "cheap", rec.Model)
		assert.EqualValues(t, 100, gjson.GetBytes(rec.Body, "max_tokens").Int(), "%s", rec.Body)
		assert.Equal(t, ConstraintBudget, rep.Constraint)
		assert.Equal(t, Clamp{From: 500, To: 100, Reason: ConstraintContextWindow}, rep.Clamp)
	}
}

// TestClampBudgetWithinTheWindow: a request that set no limit, reserved at
// DefaultMaxTokens (1024), that its budget cannot pay for, gets the limit
// the budget pays for, but never one over its model's output window.
func TestClampBudgetWithinTheWindow(t *testing.T) {
	srv := clampUpstream(t)
	prices := map[string]Price{"w": {InputPerMTok: 1e6, OutputPerMTok: 1e6, MaxInputTokens: 1000, MaxOutputTokens: 200}}
	r, reps := newTestRouter(t, Config{Prices: prices, Clock: newFakeClock(), Clamp: ClampConfig{MaxTokens: true},
		Upstreams: []Upstream{{Name: "u", BaseURL: srv.URL}},
		Budgets:   []Budget{{Name: "cap", Limit: 500, Window: Window{Every: time.Hour}}}})
	_, _, err := clampSend(t, r, EndpointChat, clampBody(EndpointChat, "w", 2, "", 0, false))
	require.NoError(t, err)
	assert.EqualValues(t, 200, gjson.GetBytes(srv.Requests()[0].Body, "max_completion_tokens").Int())
	assert.Equal(t, Clamp{From: 0, To: 200, Reason: ConstraintBudget, Budget: "cap"}, reps.all()[0].Clamp)
}

// TestClampHedgeAndRetry: every attempt carries the clamped limit: a
// hedge (its first attempt never answers) and a retry after a 503.
func TestClampHedgeAndRetry(t *testing.T) {
	first, second := clampUpstream(t), clampUpstream(t)
	first.SetDefault(relaytest.Fault{Hang: true})
	r, reps := newTestRouter(t, Config{Prices: windowPrices, Clamp: ClampConfig{MaxTokens: true}, Clock: newAutoClock(),
		Hedge:     HedgeConfig{Delay: time.Millisecond},
		Upstreams: []Upstream{{Name: "first", BaseURL: first.URL}, {Name: "second", BaseURL: second.URL}}})
	r.hedges.bal.Store(hedgeBudgetCap)
	body := clampBody(EndpointChat, "small", 10, "max_tokens", 500, false)
	resp, _, err := clampSend(t, r, EndpointChat, body)
	require.NoError(t, err)
	assert.Equal(t, "second", resp.Header.Get(HeaderUpstream))
	assert.True(t, reps.all()[0].Hedged)

	first.SetDefault(relaytest.Fault{Status: 503})
	r2, _ := newTestRouter(t, Config{Prices: windowPrices, Clamp: ClampConfig{MaxTokens: true}, Clock: newAutoClock(),
		Upstreams: []Upstream{{Name: "first", BaseURL: first.URL}, {Name: "second", BaseURL: second.URL}}})
	resp, _, err = clampSend(t, r2, EndpointChat, body)
	require.NoError(t, err)
	assert.Equal(t, "second", resp.Header.Get(HeaderUpstream))

	for _, rec := range append(first.Requests(), second.Requests()...) {
		assert.EqualValues(t, 50, gjson.GetBytes(rec.Body, "max_tokens").Int(), "%s", rec.Body)
	}
	// The hedged request's first attempt may be cancelled for the hedge's
	// answer before its upstream has read it; the 503 is always read.
	assert.Contains(t, []int{1, 2}, first.Calls())
	assert.Equal(t, 2, second.Calls(), "the hedge and the retry")
}
