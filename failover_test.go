package relay

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/tokenrelay/relay/relaytest"
)

const completionsStreamReq = `{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},"prompt":"Hi"}`

// teeBase sends requests over its own transport and keeps a copy of every
// response body, as the router read it: what each attempt's upstream sent.
type teeBase struct {
	tr     *http.Transport
	mu     sync.Mutex
	bodies []*bytes.Buffer
}

func newTeeBase(t *testing.T) *teeBase {
	b := &teeBase{tr: &http.Transport{}}
	t.Cleanup(b.tr.CloseIdleConnections)
	return b
}

type teeBody struct {
	io.Reader
	io.Closer
}

func (b *teeBase) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := b.tr.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	buf := &lockedBuffer{}
	b.mu.Lock()
	b.bodies = append(b.bodies, &buf.b)
	b.mu.Unlock()
	resp.Body = teeBody{io.TeeReader(resp.Body, buf), resp.Body}
	return resp, nil
}

func (b *teeBase) CloseIdleConnections() { b.tr.CloseIdleConnections() }

// body returns what the i-th attempt's upstream sent, as read ("" when
// there was no such attempt).
func (b *teeBase) body(i int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if i >= len(b.bodies) {
		return ""
	}
	return b.bodies[i].String()
}

type lockedBuffer struct{ b bytes.Buffer }

func (l *lockedBuffer) Write(p []byte) (int, error) { return l.b.Write(p) }

// attemptLog records the hooks' view of each attempt.
type attemptLog struct {
	mu    sync.Mutex
	infos []AttemptInfo
	dones []AttemptDone
}

func (l *attemptLog) hooks() Hooks {
	return Hooks{OnAttempt: func(_ context.Context, a AttemptInfo, _ *http.Request) func(AttemptDone) {
		l.mu.Lock()
		l.infos = append(l.infos, a)
		l.mu.Unlock()
		return func(d AttemptDone) {
			l.mu.Lock()
			l.dones = append(l.dones, d)
			l.mu.Unlock()
		}
	}}
}

func (l *attemptLog) all() ([]AttemptInfo, []AttemptDone) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]AttemptInfo(nil), l.infos...), append([]AttemptDone(nil), l.dones...)
}

// failoverRouter is a router over the fleet's upstreams "a" then "b",
// through tee, retrying at once, with log recording its attempts.
func failoverRouter(t *testing.T, fleet *relaytest.Fleet, tee *teeBase, log *attemptLog, cfg Config) (*Router, *reports) {
	cfg.Upstreams = []Upstream{{Name: "a", BaseURL: fleet.Get("a").URL}, {Name: "b", BaseURL: fleet.Get("b").URL}}
	cfg.Base = tee
	cfg.Hooks = log.hooks()
	if cfg.Retry.Backoff == nil {
		cfg.Retry.Backoff = func(int) time.Duration { return 0 }
	}
	return newTestRouter(t, cfg)
}

// readWhenDone waits for the response done delivers, failing with
// timeout's message after 10 s (a watchdog: the test's own steps make it
// come), and reads its body whole.
func readWhenDone(t *testing.T, done <-chan *http.Response, timeout string) string {
	t.Helper()
	var resp *http.Response
	select {
	case resp = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal(timeout)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	return string(got)
}

// fleetRun is what runFleet saw.
type fleetRun struct {
	header    http.Header
	got, want string // what the caller read; what the second attempt's upstream sent, less the usage chunk the router asked for
	reps      *reports
	log       *attemptLog
	fleet     *relaytest.Fleet
}

// runFleet scripts fault on upstream "a" of a fleet of "a" and "b", sends
// req to path through the router newRouter makes over them, and reads the
// answer whole.
func runFleet(t *testing.T, fault relaytest.Fault, path, req string,
	newRouter func(*testing.T, *relaytest.Fleet, *teeBase, *attemptLog, Config) (*Router, *reports)) fleetRun {
	t.Helper()
	fleet := relaytest.NewFleet([]string{"a", "b"})
	t.Cleanup(fleet.Close)
	fleet.Get("a").Script(fault)
	tee, log := newTeeBase(t), &attemptLog{}
	r, reps := newRouter(t, fleet, tee, log, Config{})
	resp := post(t, r, path, req)
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	want := tee.body(1)
	if req == chatStreamReq {
		want = string(withoutUsageChunk(t, []byte(want)))
	}
	return fleetRun{header: resp.Header, got: string(got), want: want, reps: reps, log: log, fleet: fleet}
}

// TestStreamFailoverBeforeContent: a 200 stream that fails before its first
// content (an error event of a retryable kind, a cut, malformed data) is
// retried on the next upstream; the caller reads exactly what the winning
// upstream sent (without the usage chunk the router asked for), and the
// report has its usage only. (Before, the failed stream reached the
// caller.)
func TestStreamFailoverBeforeContent(t *testing.T) {
	for _, c := range []struct {
		name, path, req string
		fault           relaytest.Fault
		why             string
		err             error // the failed attempt's, as hooks see it
	}{
		{"chat error event", "chat/completions", chatStreamUsageReq, relaytest.Fault{EarlyError: 500}, "stream-error", ErrStreamError},
		{"chat rate limit event", "chat/completions", chatStreamUsageReq, relaytest.Fault{EarlyError: 429}, "stream-error", ErrStreamError},
		{"chat overloaded event, event lines", "chat/completions", chatStreamUsageReq, relaytest.Fault{EarlyError: 503, EventLines: true}, "stream-error", ErrStreamError},
		{"chat error event, usage injected", "chat/completions", chatStreamReq, relaytest.Fault{EarlyError: 500}, "stream-error", ErrStreamError},
		{"chat cut after the role chunk", "chat/completions", chatStreamUsageReq, relaytest.Fault{CutAfter: 1}, "stream-cut", io.ErrUnexpectedEOF},
		{"chat cut, usage injected", "chat/completions", chatStreamReq, relaytest.Fault{CutAfter: 1}, "stream-cut", io.ErrUnexpectedEOF},
		{"chat malformed", "chat/completions", chatStreamUsageReq, relaytest.Fault{Malformed: true}, "stream-malformed", ErrStreamMalformed},
		{"completions error event", "completions", completionsStreamReq, relaytest.Fault{EarlyError: 502}, "stream-error", ErrStreamError},
		{"responses error event", "responses", responsesStreamReq, relaytest.Fault{EarlyError: 500}, "stream-error", ErrStreamError},
		{"responses response.failed", "responses", responsesStreamReq, relaytest.Fault{EarlyError: 500, FailedEvent: true}, "stream-error", ErrStreamError},
		{"responses rate limit", "responses", responsesStreamReq, relaytest.Fault{EarlyError: 429}, "stream-error", ErrStreamError},
		{"responses cut after response.created", "responses", responsesStreamReq, relaytest.Fault{CutAfter: 1}, "stream-cut", io.ErrUnexpectedEOF},
		{"responses malformed", "responses", responsesStreamReq, relaytest.Fault{Malformed: true}, "stream-malformed", ErrStreamMalformed},
	} {
		t.Run(c.name, func(t *testing.T) {
			run := runFleet(t, c.fault, c.path, c.req, failoverRouter)
			got, reps, log, fleet := run.got, run.reps, run.log, run.fleet
			assert.Equal(t, "b", run.header.Get(HeaderUpstream))
			assert.Equal(t, run.want, got, "the caller reads the winning stream as it was sent")
			assert.NotContains(t, got, "relaytest-malformed")
			assert.NotContains(t, got, `"error":{`)

			rep := reps.all()[0]
			assert.NoError(t, rep.Err)
			assert.Equal(t, "b", rep.Upstream)
			assert.Equal(t, 2, rep.Attempts)
			assert.Equal(t, relaytest.DefaultCompletionTokens, rep.Usage.CompletionTokens)
			assert.False(t, rep.Usage.Estimated)
			if c.fault.EarlyError != 0 || c.fault.CutAfter != 0 {
				assert.Zero(t, rep.HedgeUsage, "the failed stream reported no usage")
			}
			infos, dones := log.all()
			require.Len(t, infos, 2)
			assert.Equal(t, c.why, infos[1].Retry)
			require.Len(t, dones, 2)
			assert.ErrorIs(t, dones[0].Err, c.err)
			assert.Equal(t, 200, dones[0].StatusCode)
			assert.NoError(t, dones[1].Err)
			assert.Equal(t, map[string]int{"a": 1, "b": 1}, fleet.Calls())
		})
	}
}

// TestStreamNotFailedOverOnInvalidRequest: an error event of an invalid
// request (a 400's kind) is not retried, as a 400 is not: the caller reads
// the stream as it is, and the report has the error.
func TestStreamNotFailedOverOnInvalidRequest(t *testing.T) {
	for _, f := range []relaytest.Fault{{EarlyError: 400}, {EarlyError: 401}, {EarlyError: 404}} {
		fleet := relaytest.NewFleet([]string{"a", "b"})
		fleet.Get("a").Script(f)
		tee, log := newTeeBase(t), &attemptLog{}
		r, reps := failoverRouter(t, fleet, tee, log, Config{})
		got, err := stream(t, r, "chat/completions", chatStreamUsageReq)
		assert.ErrorIs(t, err, io.ErrUnexpectedEOF, "an error event ends it without [DONE]")
		assert.Equal(t, tee.body(0), string(got), "%d", f.EarlyError)
		assert.Contains(t, string(got), `"error":{`)
		rep := reps.all()[0]
		assert.Equal(t, 1, rep.Attempts, "%d", f.EarlyError)
		assert.ErrorIs(t, rep.Err, ErrStreamError)
		assert.Equal(t, 0, fleet.Get("b").Calls())
		fleet.Close()
	}
}

// TestStreamFailoverOff: with FailoverWindow negative, a stream is handed
// over at its headers, and one that fails before its first content is the
// caller's.
func TestStreamFailoverOff(t *testing.T) {
	fleet := relaytest.NewFleet([]string{"a", "b"})
	defer fleet.Close()
	fleet.Get("a").Script(relaytest.Fault{EarlyError: 500})
	tee, log := newTeeBase(t), &attemptLog{}
	r, reps := failoverRouter(t, fleet, tee, log, Config{Stream: StreamConfig{FailoverWindow: -1}})
	got, err := stream(t, r, "chat/completions", chatStreamUsageReq)
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
	assert.Equal(t, tee.body(0), string(got))
	assert.Equal(t, 1, reps.all()[0].Attempts)
	assert.ErrorIs(t, reps.all()[0].Err, ErrStreamError)
	assert.Equal(t, 0, fleet.Get("b").Calls())
}

// TestStreamLastAttemptNotHeld: the last attempt is not held: when every
// upstream fails before its content, the caller reads the last stream as
// it came.
func TestStreamLastAttemptNotHeld(t *testing.T) {
	fleet := relaytest.NewFleet([]string{"a", "b"})
	defer fleet.Close()
	fleet.Get("a").Script(relaytest.Fault{EarlyError: 500})
	fleet.Get("b").Script(relaytest.Fault{EarlyError: 503})
	tee, log := newTeeBase(t), &attemptLog{}
	r, reps := failoverRouter(t, fleet, tee, log, Config{Retry: RetryConfig{MaxAttempts: 2}})
	got, err := stream(t, r, "chat/completions", chatStreamUsageReq)
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
	assert.Equal(t, tee.body(1), string(got))
	rep := reps.all()[0]
	assert.Equal(t, 2, rep.Attempts)
	assert.Equal(t, "b", rep.Upstream)
	assert.ErrorIs(t, rep.Err, ErrStreamError)
}

// TestStreamFailoverHonoursHint: a rate-limit error event asks for a wait
// ("Please try again in 1s"); a retry that goes back to the same upstream
// waits that long, as after a 429 with that Retry-After. A hint over
// MaxRetryAfter hands the stream to the caller at once. (Before, the
// stream reached the caller.)
func TestStreamFailoverHonoursHint(t *testing.T) {
	srv := relaytest.NewServer(relaytest.WithName("a"))
	defer srv.Close()
	srv.Script(relaytest.Fault{EarlyError: 429})
	clk := newFakeClock()
	log := &attemptLog{}
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL}}, Clock: clk, Hooks: log.hooks(),
		Stream: StreamConfig{IdleTimeout: -1}, Retry: RetryConfig{Backoff: func(int) time.Duration { return 5 * time.Second }}})
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest("POST", "http://relay.invalid/v1/chat/completions", strings.NewReader(chatStreamUsageReq))
		resp, err := r.RoundTrip(req)
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	var waits []time.Duration
wait:
	for {
		select {
		case err := <-done:
			require.NoError(t, err)
			break wait
		case d := <-clk.armed: // the backoff, the limiter's hold, the end's grace
			waits = append(waits, d)
			clk.Advance(d)
		case <-time.After(10 * time.Second):
			t.Fatal("the request did not end")
		}
	}
	rep := reps.all()[0]
	assert.NoError(t, rep.Err)
	assert.Equal(t, 2, rep.Attempts)
	infos, _ := log.all()
	require.Len(t, infos, 2)
	assert.Equal(t, "stream-error", infos[1].Retry)
	assert.Equal(t, time.Second, infos[1].Backoff, "the event's hint, not the 5 s backoff")
	assert.Contains(t, waits, time.Second)
	assert.NotContains(t, waits, 5*time.Second)

	// The hint longer than MaxRetryAfter: the stream is the caller's at once.
	srv.Script(relaytest.Fault{EarlyError: 429})
	r2, reps2 := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL}}, Clock: newFakeClock(),
		Stream: StreamConfig{IdleTimeout: -1}, Retry: RetryConfig{MaxRetryAfter: 500 * time.Millisecond}})
	got, err := stream(t, r2, "chat/completions", chatStreamUsageReq)
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
	assert.Contains(t, string(got), "rate_limit_exceeded")
	assert.Equal(t, 1, reps2.all()[0].Attempts)
	assert.ErrorIs(t, reps2.all()[0].Err, ErrStreamError)
}

// TestStreamFailoverCleanState: the retry's stream is read afresh. The
// failed stream's usage, bytes, partial event and injected-usage state do
// not reach the caller or Report.Usage; its usage is billed as a losing
// attempt's (HedgeUsage, cost), and its connection is closed.
func TestStreamFailoverCleanState(t *testing.T) {
	gone := make(chan struct{})
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, `data: {"id":"x","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`+"\n\n")
		io.WriteString(w, `data: {"id":"x","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}`+"\n\n")
		io.WriteString(w, `data: {"error":{"message":"The server had an error.","type":"server_error"}}`+"\n\n")
		io.WriteString(w, `data: {"id":"x","choices":[{"index":0,"delta":{"content":"LEAK`)
		w.(http.Flusher).Flush()
		<-r.Context().Done() // held open: the router must close it
		close(gone)
	}))
	defer bad.Close()
	good := relaytest.NewServer(relaytest.WithName("b"))
	defer good.Close()
	tee := newTeeBase(t)
	r, reps := newTestRouter(t, Config{
		Upstreams: []Upstream{{Name: "a", BaseURL: bad.URL + "/v1"}, {Name: "b", BaseURL: good.URL}},
		Base:      tee, Retry: RetryConfig{Backoff: func(int) time.Duration { return 0 }},
		Prices: map[string]Price{"gpt-4o": {InputPerMTok: 1e6, OutputPerMTok: 1e6}},
	})
	got, err := stream(t, r, "chat/completions", chatStreamReq) // the router asks for usage
	require.NoError(t, err)
	select {
	case <-gone:
	case <-time.After(10 * time.Second):
		t.Fatal("the failed stream's connection was not closed")
	}
	assert.Equal(t, string(withoutUsageChunk(t, []byte(tee.body(1)))), string(got))
	assert.NotContains(t, string(got), "LEAK")
	rep := reps.all()[0]
	assert.NoError(t, rep.Err)
	assert.Equal(t, relaytest.DefaultCompletionTokens, rep.Usage.CompletionTokens, "the answer's usage alone")
	assert.False(t, rep.Usage.Estimated)
	assert.Equal(t, Usage{PromptTokens: 7, CompletionTokens: 3}, rep.HedgeUsage, "the failed stream's usage, billed")
	assert.InDelta(t, float64(rep.Usage.PromptTokens+relaytest.DefaultCompletionTokens+7+3), rep.CostUSD, 1e-9)
}

// TestStreamFailoverOnStall: a stream silent for IdleTimeout before its
// first content is retried elsewhere (the idle timeout counts during the
// hold); one that sends its first content is handed over.
func TestStreamFailoverOnStall(t *testing.T) {
	fleet := relaytest.NewFleet([]string{"a", "b"})
	defer fleet.Close()
	fleet.Get("a").Script(relaytest.Fault{FirstTokenDelay: time.Hour}) // headers, then nothing
	clk := newFakeClock()
	tee, log := newTeeBase(t), &attemptLog{}
	r, reps := failoverRouter(t, fleet, tee, log, Config{Clock: clk, Stream: StreamConfig{IdleTimeout: 10 * time.Second}})
	done := make(chan *http.Response, 1)
	go func() { done <- post(t, r, "chat/completions", chatStreamUsageReq) }()
	select {
	case d := <-clk.armed: // the hold's idle timer, on a's stream
		assert.Equal(t, 10*time.Second, d)
	case <-time.After(10 * time.Second):
		t.Fatal("no idle timer during the hold")
	}
	clk.Advance(10 * time.Second)
	got := readWhenDone(t, done, "a stall before the first content was not failed over")
	assert.Equal(t, tee.body(1), got)
	rep := reps.all()[0]
	assert.NoError(t, rep.Err)
	assert.Equal(t, "b", rep.Upstream)
	infos, dones := log.all()
	assert.Equal(t, "stalled", infos[1].Retry)
	assert.ErrorIs(t, dones[0].Err, ErrStreamStalled)
}

// TestStreamHoldWindow: a stream that sends no content, but other events,
// for longer than FailoverWindow is handed over as it is at the first read
// past the window, and the caller reads every byte in order.
func TestStreamHoldWindow(t *testing.T) {
	clk := newFakeClock()
	pr, pw := io.Pipe()
	defer pw.Close()
	r, reps := bodyRouter(t, Config{Clock: clk, Stream: StreamConfig{IdleTimeout: -1, FailoverWindow: 5 * time.Second}}, func() io.Reader { return pr })
	done := make(chan *http.Response, 1)
	go func() { done <- post(t, r, "chat/completions", chatStreamUsageReq) }()
	role := `data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}` + "\n\n"
	pw.Write([]byte(role))
	for range 4 {
		clk.Advance(time.Second)
		pw.Write([]byte(": keep-alive\n\n"))
	}
	select {
	case <-done:
		t.Fatal("handed over before the window passed")
	default:
	}
	clk.Advance(time.Second)
	rest := `data: {"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":"stop"}]}` + "\n\n" + "data: [DONE]\n\n"
	// (handed over as soon as a read returns past the window: the writes
	// that follow are read by the caller)
	go func() { pw.Write([]byte(": keep-alive\n\n")); pw.Write([]byte(rest)); pw.Close() }()
	got := readWhenDone(t, done, "not handed over once the window passed")
	assert.Equal(t, role+strings.Repeat(": keep-alive\n\n", 5)+rest, got)
	assert.Equal(t, 5*time.Second, reps.all()[0].TTFT)
}

// TestStreamHoldFirstTokenTimeout: FirstTokenTimeout bounds the hold
// instead of the window, and a stream that fails before its first content
// is still retried.
func TestStreamHoldFirstTokenTimeout(t *testing.T) {
	fleet := relaytest.NewFleet([]string{"a", "b"})
	defer fleet.Close()
	fleet.Get("a").Script(relaytest.Fault{EarlyError: 500})
	tee, log := newTeeBase(t), &attemptLog{}
	r, reps := failoverRouter(t, fleet, tee, log, Config{Stream: StreamConfig{FirstTokenTimeout: time.Minute, FailoverWindow: -1}})
	got, err := stream(t, r, "chat/completions", chatStreamUsageReq)
	require.NoError(t, err)
	assert.Equal(t, tee.body(1), string(got))
	assert.Equal(t, 2, reps.all()[0].Attempts)
}

// TestStreamHeldClosedUnread: a held stream closed unread after its
// request was cancelled is reported cancelled, though the router read it
// whole.
func TestStreamHeldClosedUnread(t *testing.T) {
	up := newSSEUpstream(t, fixture(t, "chat_stream_recorded_gpt4o_text_usage.sse"))
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL + "/v1"}}})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://relay.invalid/v1/chat/completions", strings.NewReader(chatStreamUsageReq))
	resp, err := r.RoundTrip(req)
	require.NoError(t, err)
	cancel()
	resp.Body.Close()
	assert.ErrorIs(t, reps.all()[0].Err, context.Canceled)
	assert.Positive(t, reps.all()[0].TTFT, "the router read the first content during the hold")
}

// TestErrorKindOf: an error event counts as the status its kind has, with
// the wait it asks for.
func TestErrorKindOf(t *testing.T) {
	for _, c := range []struct {
		name, obj string
		want      errorKind
	}{
		{"openai rate limit", `{"message":"Rate limit reached for gpt-4o-mini ... Please try again in 1.2s. Visit ...","type":"tokens","code":"rate_limit_exceeded"}`, errorKind{429, 1200 * time.Millisecond, true}},
		{"openai ms", `{"message":"Please try again in 20ms.","type":"requests","code":"rate_limit_exceeded"}`, errorKind{429, 20 * time.Millisecond, true}},
		{"openai minutes", `{"message":"Please try again in 6m0s.","code":"rate_limit_exceeded"}`, errorKind{429, 6 * time.Minute, true}},
		{"insufficient quota", `{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}`, errorKind{status: 429}},
		{"anthropic overloaded", `{"type":"overloaded_error","message":"Overloaded"}`, errorKind{status: 429}},
		{"server error", `{"message":"The server had an error","type":"server_error","param":null,"code":null}`, errorKind{status: 500}},
		{"the fixture's type", `{"message":"The server had an error","type":"server_ error","code":null}`, errorKind{status: 500}},
		{"numeric code", `{"code":502,"message":"upstream down"}`, errorKind{status: 502}},
		{"numeric status", `{"status":503,"message":"busy","retry_after":2}`, errorKind{503, 2 * time.Second, true}},
		{"retry_after_ms", `{"code":"rate_limit_exceeded","retry_after_ms":150}`, errorKind{429, 150 * time.Millisecond, true}},
		{"google status", `{"code":429,"status":"RESOURCE_EXHAUSTED","message":"quota"}`, errorKind{status: 429}},
		{"invalid request", `{"message":"bad","type":"invalid_request_error","code":null}`, errorKind{status: 400}},
		{"context length", `{"message":"too long","type":"invalid_request_error","code":"context_length_exceeded"}`, errorKind{status: 400}},
		{"invalid key", `{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}`, errorKind{status: 401}},
		{"unknown", `{"message":"something"}`, errorKind{status: 500}},
	} {
		assert.Equal(t, c.want, errorKindOf(gjson.Parse(c.obj)), c.name)
	}
}

// TestShouldRetrySeesTheEventsStatus: a wrapped ShouldRetry is asked about
// a failed stream as about a response of its error's status, whose body is
// the error.
func TestShouldRetrySeesTheEventsStatus(t *testing.T) {
	fleet := relaytest.NewFleet([]string{"a", "b"})
	defer fleet.Close()
	fleet.Get("a").Script(relaytest.Fault{EarlyError: 429})
	var seen []string
	var mu sync.Mutex
	tee, log := newTeeBase(t), &attemptLog{}
	r, reps := failoverRouter(t, fleet, tee, log, Config{Retry: RetryConfig{ShouldRetry: func(resp *http.Response, err error) bool {
		if resp != nil && resp.StatusCode == 429 {
			b, _ := io.ReadAll(resp.Body)
			mu.Lock()
			seen = append(seen, resp.Header.Get("Retry-After-Ms")+" "+gjson.GetBytes(b, "error.code").Str)
			mu.Unlock()
			return false // not retried: the caller gets the stream
		}
		return DefaultShouldRetry(resp, err)
	}}})
	got, err := stream(t, r, "chat/completions", chatStreamUsageReq)
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
	assert.Equal(t, tee.body(0), string(got))
	assert.Equal(t, 1, reps.all()[0].Attempts)
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, seen)
	assert.Equal(t, "1000 rate_limit_exceeded", seen[0])
}

// TestStreamFailedKeptWhenNothingBetter: when no later attempt gets a
// response, the stream that failed before its first content is returned
// (a response beats none): the caller reads its error event, its SDK
// reports it, and RoundTrip returns no error. Its upstream was let go at
// the failover.
func TestStreamFailedKeptWhenNothingBetter(t *testing.T) {
	fleet := relaytest.NewFleet([]string{"a", "b"})
	defer fleet.Close()
	fleet.Get("a").Script(relaytest.Fault{EarlyError: 500})
	fleet.Get("b").SetDefault(relaytest.Fault{Drop: true})
	tee, log := newTeeBase(t), &attemptLog{}
	r, reps := failoverRouter(t, fleet, tee, log, Config{Retry: RetryConfig{MaxAttempts: 2}})
	resp := post(t, r, "chat/completions", chatStreamUsageReq)
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "a", resp.Header.Get(HeaderUpstream))
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Error(t, err, "the stream failed")
	assert.Contains(t, string(got), `{"error":{`)
	assert.True(t, strings.HasPrefix(tee.body(0), string(got)), "the bytes held, as they came")
	rep := reps.all()[0]
	assert.Equal(t, "a", rep.Upstream)
	assert.Equal(t, 2, rep.Attempts)
	assert.ErrorIs(t, rep.Err, ErrStreamError)
}

// FuzzErrorKind: any error object classifies as a status of 400 to 599,
// with a hint that is not negative.
func FuzzErrorKind(f *testing.F) {
	f.Add(`{"message":"Please try again in 1.2s.","type":"tokens","code":"rate_limit_exceeded"}`)
	f.Add(`{"code":502,"retry_after":"3"}`)
	f.Add(`{"status":"RESOURCE_EXHAUSTED","message":"try again in 9999999999999h"}`)
	f.Add(`{"retry_after_ms":1e300,"type":"overloaded_error"}`)
	f.Fuzz(func(t *testing.T, obj string) {
		k := errorKindOf(gjson.Parse(obj))
		if k.status < 400 || k.status > 599 {
			t.Fatalf("status %d for %q", k.status, obj)
		}
		if k.hint < 0 || (!k.hinted && k.hint != 0) {
			t.Fatalf("hint %v (%v) for %q", k.hint, k.hinted, obj)
		}
	})
}
