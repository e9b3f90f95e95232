package relay

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Response headers the router adds so SDK users can read the route without
// the OnReport hook.
const (
	HeaderModel        = "X-Relay-Model"
	HeaderUpstream     = "X-Relay-Upstream"
	HeaderPromptTokens = "X-Relay-Prompt-Tokens"
)

// RoundTrip implements http.RoundTripper. It never modifies req, always
// closes req.Body, and returns err == nil whenever an upstream response was
// obtained, whatever its status: after the last retry the caller gets the
// last upstream response, body intact, so SDKs can parse the error. An error
// is returned only when no response came (*Error wrapping ErrBodyTooLarge,
// ErrNoUpstream, ErrRateLimited, ErrCircuitOpen, the context's error or the
// transport's). It is safe for concurrent use.
func (r *Router) RoundTrip(req *http.Request) (*http.Response, error) {
	t := newTrip(r.current(), req) // the request's configuration, to its end
	resp, err := t.roundTrip(req)
	if p := t.hookPanic.Swap(&tripReturned); p != nil {
		// A hook panicked during the request: it unwound as a cancelled
		// one (giving back its slot, tokens and holds), and the panic goes
		// on from here.
		if resp != nil {
			resp.Body.Close()
		}
		panic(p.v)
	}
	return resp, err
}

// hookPanic is a panic a hook raised during a request.
type hookPanic struct{ v any }

// tripReturned marks a trip whose RoundTrip returned: a hook that panics
// after it (a hedge loser's done function, on a goroutine of its own)
// panics there, as it would without the router.
var tripReturned hookPanic

// errHookPanicked is the error of an attempt not sent, or not retried,
// because a hook panicked: the request unwinds as a cancelled one.
var errHookPanicked = fmt.Errorf("relay: a hook panicked: %w", context.Canceled)

// catch, deferred around a hook's call, keeps the hook's panic for
// RoundTrip to raise once the request has given back what it held (the
// first one, if several hooks panic).
func (t *trip) catch() {
	if p := recover(); p != nil {
		if !t.hookPanic.CompareAndSwap(nil, &hookPanic{v: p}) && t.hookPanic.Load() == &tripReturned {
			panic(p) // RoundTrip has returned: nothing would raise it
		}
	}
}

// stopped is the error that keeps an attempt from going out: the context's,
// or errHookPanicked once a hook panicked.
func (t *trip) stopped(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if p := t.hookPanic.Load(); p != nil && p != &tripReturned {
		return errHookPanicked
	}
	return nil
}

// onAttempt calls Hooks.OnAttempt; a panic is kept (see catch).
func (t *trip) onAttempt(h func(context.Context, AttemptInfo, *http.Request) func(AttemptDone), ctx context.Context, info AttemptInfo, out *http.Request) func(AttemptDone) {
	defer t.catch()
	return h(ctx, info, out)
}

// attemptDone calls an attempt's done function; a panic is kept.
func (t *trip) attemptDone(done func(AttemptDone), d AttemptDone) {
	defer t.catch()
	done(d)
}

func (t *trip) roundTrip(req *http.Request) (*http.Response, error) {
	r := t.r
	if req.URL == nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, t.fail(&Error{Op: "read request", Err: errors.New("nil request URL")})
	}
	body, err := r.readBody(req)
	if err != nil {
		return nil, t.fail(&Error{Op: "read body", Err: err})
	}
	cands, err := t.decide(body, true)
	if err != nil {
		return nil, t.fail(err)
	}
	return t.run(cands)
}

func newTrip(r *Router, req *http.Request) *trip {
	t := &trip{r: r, req: req, ctx: req.Context(), start: r.s.clock.Now(), id: r.ids.of(req.Header)}
	t.votes.Store(1) // the body's end
	if h := r.s.hooks.OnRequest; h != nil {
		if ctx := h(t.ctx, req); ctx != nil {
			t.ctx = ctx
		}
	}
	return t
}

// readBody reads and closes the request body, bounded by MaxBodyBytes.
func (r *Router) readBody(req *http.Request) ([]byte, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	defer req.Body.Close()
	if req.ContentLength > r.s.maxBody {
		return nil, ErrBodyTooLarge
	}
	if n := req.ContentLength; n > 0 {
		// The declared length, read into a buffer of that size. A body
		// shorter than it declared is what it is; one longer is read on,
		// as a body of unknown length.
		// One byte more of room, for the read that finds the end (a local
		// byte would escape to the heap through the Reader).
		buf := make([]byte, n, n+1)
		m, err := io.ReadFull(req.Body, buf)
		switch {
		case err == io.ErrUnexpectedEOF:
			return buf[:m], nil
		case err != nil:
			return nil, err
		}
		m, err = req.Body.Read(buf[n : n+1])
		switch {
		case m == 0 && err == io.EOF:
			return buf, nil // the common case: the read after the end is an EOF
		case m == 0 && err != nil:
			return nil, err
		}
		return readRest(buf[:n+int64(m)], req.Body, r.s.maxBody)
	}
	return readRest(nil, req.Body, r.s.maxBody)
}

// readRest reads src to its end after buf, failing with ErrBodyTooLarge
// past max bytes.
func readRest(buf []byte, src io.Reader, max int64) ([]byte, error) {
	b := bytes.NewBuffer(buf)
	if _, err := b.ReadFrom(io.LimitReader(src, max+1-int64(len(buf)))); err != nil {
		return nil, err
	}
	if int64(b.Len()) > max {
		return nil, ErrBodyTooLarge
	}
	return b.Bytes(), nil
}

// trip is the state of one RoundTrip. What the request is (body, class,
// route, key) is set before the first attempt and read-only after; what
// the attempt loop learns (the answering attempt, counts) is set by the
// loop alone, before the response reaches the caller; the Report is made
// from both, once, by finish.
type trip struct {
	r      *Router
	req    *http.Request
	id     string          // the request's ID (Report.RequestID)
	ctx    context.Context // the request's (as Hooks.OnRequest left it)
	start  time.Time
	body   []byte
	c      classified
	route  Route
	key    uint64       // affinity key
	tokens int          // prompt plus output tokens: the TPM charge before clamping
	cbuf   [8]candidate // backing array of the candidate list

	require    []string      // tags every candidate must carry
	constraint string        // the constraint that changed the route, if one did
	why        string        // why the last attempt did not answer, for Hooks.OnAttempt
	backoff    time.Duration // the wait before the next attempt

	att      attempt       // the answering attempt, once there is one
	attempts int           // upstream calls made, hedges included
	outside  time.Duration // time spent in upstream calls and waits
	overhead time.Duration // the router's own time, set when RoundTrip returns
	// Usage of the hedges' losing attempts that completed too (one a
	// hedge; a retry after a first-token timeout may hedge again), added
	// by their readers under loserMu, read once every vote is in.
	losers  []loserUsage
	loserMu sync.Mutex
	res     reservations // what it holds in budgets
	clamp   *clamping    // the clamp of its output-token limit, if one was made
	view    budgetView   // Request.Budget
	done    atomic.Bool  // the body is done (finish ran)
	// (the bools sit beside done, in its padding: the trip stays in its size class)
	widened bool         // retried on a larger window once
	hedged  bool         // a hedge was sent
	bad     badReason    // why the first bad answer set aside was bad (Report.BadAnswer)
	end     bodyEnd      // how it ended, for the report
	votes   atomic.Int32 // parties the report still waits for (see vote)

	stateFallback atomic.Bool // a call to the shared State failed: in-process state decided
	// hookPanic is the first panic of a hook the request called
	// (Hooks.OnAttempt, its done function, OnWait, OnStateFallback), kept
	// to be raised again once RoundTrip gave back what the request held;
	// &tripReturned once RoundTrip returned.
	hookPanic atomic.Pointer[hookPanic]
}

// attempt is one upstream call and what it learned.
type attempt struct {
	cand     candidate
	resp     *http.Response
	err      error
	cancel   context.CancelFunc
	sent     time.Time // when it was sent
	done     time.Time // when its response (or error) came
	latency  time.Duration
	hookDone func(AttemptDone) // Hooks.OnAttempt's, run by observe
	stream   *streamBody       // set when the stream was read ahead (first-token failover)
	held     bool              // holds an in-flight count and slot until released
	injected bool              // its body asked for the stream's usage chunk
	hedge    int               // 0 for the first attempt of a hedge, 1 for the hedge
	out      *http.Request     // the request sent: what an upstream may echo (see sentSecrets)
}

// run is the attempt loop: admit a candidate, send (hedged, with
// first-token failover), observe, and either answer or back off and go on
// to the next candidate.
func (t *trip) run(cands []candidate) (*http.Response, error) {
	r := t.r
	ctx := t.ctx
	if r.s.hedge.on {
		r.hedges.add()
	}
	adm := r.admissionOf(&t.c)
	adm.prio, adm.trip = t.route.Priority, t
	t.tokens = adm.tokens
	var (
		rt     = retrier{s: &r.s.retry}
		bodies bodyCache
		next   int
		prev   previous
	)
	defer prev.close(t)
	for i := 0; i < r.s.retry.maxAttempts; i++ {
		idx, queued, err := r.acquire(ctx, cands, next, adm)
		t.outside += queued
		if err == ErrBudgetExceeded && (t.clampBudget(ctx, cands) || t.downgrade(&cands)) {
			adm.tokens = r.admissionOf(&t.c).tokens // (a clamp lowers it)
			t.tokens, bodies = adm.tokens, bodyCache{}
			i-- // a smaller limit or a cheaper route, not an attempt
			continue
		}
		if err != nil {
			return t.giveUp(err, &prev)
		}
		cand := cands[idx]
		next = idx + 1
		if cands[idx].forced {
			adm.tried |= 1 << (idx % 64)
		}
		out := bodies.get(t, cand)
		at := r.s.clock.Now()
		t.attempts++
		a, hedgeNext := t.sendHedged(ctx, cands, idx, adm, out, at)
		adm.retry = true
		waited := false // for a stream's first token
		if hedgeNext >= 0 {
			next = hedgeNext
		}
		if i < r.s.retry.maxAttempts-1 {
			waited = t.awaitFirstToken(&a)
		}
		now := a.done // no clock read when nothing happened since
		if hedgeNext >= 0 || waited || now.IsZero() {
			now = r.s.clock.Now()
		}
		t.outside += now.Sub(at)
		t.observe(&a, now)
		wait, final := t.retryWait(&a, cands[next%len(cands)], i, &rt)
		t.why = retryReason(&a)
		bad := false
		if final && i < r.s.retry.maxAttempts-1 {
			if n, ok := t.widen(&cands, &a); ok {
				next, wait, final = n, 0, false // a larger window, at once
			} else if t.fallBack(&cands, &a) {
				next, wait, final, bad = 0, 0, false, true // another model, at once
				adm.tried = 0                              // (indexes of the candidates before)
			}
		}
		t.backoff = wait
		if final {
			return t.conclude(&a, &prev)
		}
		if bad {
			prev.setBad(t, &a)
		} else {
			prev.add(t, &a)
		}
		at = r.s.clock.Now()
		err = sleep(ctx, r.s.clock, wait)
		t.outside += r.s.clock.Now().Sub(at)
		if err != nil {
			prev.settle(t, nil)
			return nil, t.fail(&Error{Op: "backoff", Upstream: a.cand.up.cfg.Name, Model: a.cand.model, Err: err})
		}
	}
	panic("relay: unreachable")
}

// previous are the attempts the loop went past, in case one of them is
// returned in the end: the last one with a response (kept: its body read in
// the background; for a stream that failed before its first content, the
// bytes held, its upstream let go), the last one without, and the last bad
// answer set aside for a fallback model (kept as it is, held).
type previous struct{ kept, lost, bad *attempt }

// add keeps a, an attempt not returned now, as the last of its kind.
func (p *previous) add(t *trip, a *attempt) {
	if a.failure() != nil {
		a.stream.abandon() // its bytes stay, to be read if it is returned
		if a.held {
			a.held = false
			a.cand.up.unclaim()
		}
	} else {
		a.discard()
	}
	if a.resp == nil {
		if a.err != nil { // an abandoned stream has neither: nothing to give back
			p.lost = a
		}
		return
	}
	p.drop(t, p.kept)
	p.kept = a
}

// setBad keeps a, a bad answer set aside for a fallback model, in case no
// fallback answers better; the bad answer kept before it is let go.
func (p *previous) setBad(t *trip, a *attempt) {
	p.drop(t, p.bad)
	if a.held {
		a.held = false
		a.cand.up.unclaim() // (its context lives on with its body)
	}
	p.bad = a
}

// drop lets go of a kept attempt that is not returned: a bad answer and a
// stream are closed and billed as a hedge's losing attempt is (see
// setAside); a response's background read is stopped.
func (p *previous) drop(t *trip, k *attempt) {
	switch {
	case k == nil:
	case k == p.bad:
		t.setAside(k, true) // an answer, billed even without a usage
	case k.stream != nil:
		t.setAside(k, false)
	default:
		k.closeKept()
	}
}

// settle lets go of the kept attempts but ret, the one returned (nil:
// none), before the request is reported.
func (p *previous) settle(t *trip, ret *attempt) {
	for _, k := range [...]*attempt{p.kept, p.bad} {
		if k != ret {
			p.drop(t, k)
		}
	}
	p.kept, p.bad = nil, nil
}

// close lets go of what is still kept and was not returned, once the loop
// is over.
func (p *previous) close(t *trip) {
	for _, k := range [...]*attempt{p.kept, p.bad} {
		if k != nil && k.resp != t.att.resp {
			p.drop(t, k)
		}
	}
}

// conclude ends the loop with a, the last attempt: its answer, or a bad
// answer set aside before it when a did not answer, or an earlier response
// when a got none.
func (t *trip) conclude(a *attempt, p *previous) (*http.Response, error) {
	ret := a
	switch {
	case t.ctx.Err() != nil:
	case p.bad != nil && (a.resp == nil || a.resp.StatusCode >= 300 || a.failure() != nil):
		ret = p.bad // a bad answer beats a failure
	case a.resp == nil && p.kept != nil:
		ret = p.kept // an earlier response beats no response
	}
	p.settle(t, ret)
	if ret != a {
		if a.resp != nil || a.stream != nil {
			t.setAside(a, false)
		}
		a.release()
	}
	return t.finalize(*ret)
}

// giveUp ends a trip whose next attempt could not be admitted: a bad
// answer set aside, else the last upstream response if there was one, else
// the last real failure, else the admission's error.
func (t *trip) giveUp(err error, p *previous) (*http.Response, error) {
	var ret *attempt
	if t.ctx.Err() == nil {
		switch {
		case p.bad != nil:
			ret = p.bad // a 2xx answer, if a bad one
		case p.kept != nil:
			ret = p.kept // the last upstream response, intact
		case p.lost != nil:
			ret = p.lost // the real failure, not the limiter's
		}
	}
	p.settle(t, ret)
	if ret != nil {
		return t.finalize(*ret)
	}
	if err == ErrBudgetExceeded {
		return nil, t.fail(t.budgetError(t.route.Model))
	}
	return nil, t.fail(&Error{Op: "acquire", Model: t.route.Model, Err: err})
}

// bodyCache keeps the body last built, since consecutive candidates often
// get the same bytes.
type bodyCache struct {
	ok    bool
	model string // as the upstream names it
	up    *upstream
	out   outBody
}

func (bc *bodyCache) get(t *trip, cand candidate) outBody {
	name := cand.up.sentName(cand.model)
	if !bc.ok || name != bc.model || (cand.up != bc.up && (len(cand.up.tags) > 0 || len(bc.up.tags) > 0)) {
		*bc = bodyCache{ok: true, model: name, up: cand.up, out: t.bodyFor(cand)}
	}
	return bc.out
}

// awaitFirstToken holds a 2xx stream until its first content chunk (see
// streamBody.hold), while nothing has reached the caller: a stream with no
// content within the first-token timeout becomes a failure to retry, and
// one that failed before its first content is judged (judgeHold), to be
// retried as its failure says. The loop skips it on the last attempt: a
// slow or failing stream is then the caller's, as it is.
func (t *trip) awaitFirstToken(a *attempt) (waited bool) {
	d, window := a.cand.timeouts().FirstToken, t.r.s.stream.window
	if a.err != nil || (d <= 0 && window <= 0) || a.resp.StatusCode >= 300 || !isEventStream(a.resp.Header) || t.r.s.retry.shouldRetry(a.resp, nil) {
		return false // (a stream the retry policy retries anyway is not held)
	}
	decompress(a.resp) // the first token is looked for in the decoded stream
	a.stream = newStreamBody(t, a)
	if err := a.stream.hold(d, window); err != nil {
		a.stream.abandon()
		a.resp, a.stream, a.err = nil, nil, err
		return true
	}
	a.stream.judgeHold()
	return true
}

// observe feeds an attempt's outcome to its upstream's breaker, limiter and
// counters, at now.
func (t *trip) observe(a *attempt, now time.Time) {
	resp, err := a.judged()
	o := outcomeOf(resp, err)
	if resp == nil && (t.ctx.Err() != nil || errors.Is(err, errHookPanicked)) {
		o = outcomeNeutral // the caller gave up (cancel or its own deadline), not the upstream
	}
	if a.hookDone != nil {
		d := AttemptDone{Err: a.err, Latency: a.latency}
		if a.resp != nil {
			d.StatusCode = a.resp.StatusCode
		}
		if f := a.failure(); f != nil {
			d.Err = f
		}
		done := a.hookDone
		a.hookDone = nil
		t.attemptDone(done, d)
	}
	u := a.cand.up
	u.requests.Add(1)
	var hint time.Duration
	if o == outcomeFailure {
		u.failures.Add(1)
		if resp != nil {
			hint, _ = RetryAfter(resp.Header, now)
		}
	}
	t.r.record(t.ctx, t, &a.cand, resp, o, hint, now)
}

// send makes one upstream call. The attempt holds the in-flight count and
// slot acquire took until it is released.
func (t *trip) send(ctx context.Context, cand candidate, body outBody, n int, hedge bool, sent time.Time) attempt {
	r := t.r
	a := attempt{cand: cand, held: true, injected: body.injected}
	changes := cand.up.circ.changes.Load()
	// state settles the race between the attempt timer and the response:
	// 0 while waiting, 1 once the response is kept, 2 once the timer fired.
	var state atomic.Int32
	var stop func() bool
	parent := ctx
	if d := cand.timeouts().Attempt; d > 0 {
		ctx, a.cancel = context.WithCancel(ctx)
		cancel := a.cancel
		stop = r.s.clock.AfterFunc(d, func() {
			if state.CompareAndSwap(0, 2) {
				cancel()
			}
		})
	}
	a.sent = sent
	if sent.IsZero() {
		a.sent = r.s.clock.Now()
	}
	var out *http.Request
	if t.stopped(ctx) == nil {
		out = t.outgoing(ctx, cand, body)
		if h := r.s.hooks.OnAttempt; h != nil {
			info := AttemptInfo{Upstream: cand.up.cfg.Name, Model: cand.model, UpstreamModel: cand.up.sentName(cand.model), N: n, Hedge: hedge}
			if !hedge {
				info.Retry, info.Backoff = t.why, t.backoff
			}
			a.hookDone = t.onAttempt(h, ctx, info, out)
		}
	}
	if err := t.stopped(ctx); err != nil {
		// The call never goes out: its tokens go back, where they were taken.
		r.untake(ctx, t, &cand, t.tokens, a.sent)
		if stop != nil {
			stop()
			if !state.CompareAndSwap(0, 1) && parent.Err() == nil {
				err = ErrAttemptTimeout // the timer fired before the call went out
			}
		}
		a.err = err
		return a
	}
	a.out = out
	a.resp, a.err = r.s.base.RoundTrip(out)
	if a.err != nil {
		// (a *url.Error names the URL it was sent to, query key and all)
		a.err = r.s.secrets.redactErr(a.err, sentSecrets(out)...)
		a.err = unsendable(out.Header, a.err)
	}
	if a.err == nil && a.resp == nil {
		a.err = errors.New("relay: Base returned no response and no error")
	}
	if a.resp != nil && a.resp.Body == nil {
		a.resp.Body = http.NoBody
	}
	if a.resp != nil && a.err != nil { // a Base breaking the RoundTripper contract
		a.resp.Body.Close()
		a.resp = nil
	}
	if stop != nil {
		stop()
		if !state.CompareAndSwap(0, 1) { // the timer won: its cancel may reach the body
			if a.resp != nil {
				a.resp.Body.Close()
				a.resp = nil
			}
			a.err = ErrAttemptTimeout
		}
	}
	now := r.s.clock.Now()
	a.done, a.latency = now, now.Sub(a.sent)
	if (a.err == nil || a.err == ErrAttemptTimeout) && cand.up.circ.changes.Load() == changes {
		// (an attempt that lived through a change of its breaker's state,
		// sent before it opened, would bring a stale latency into the
		// window the opening emptied)
		cand.up.lat.add(a.latency, now)
	}
	if a.err != nil && a.err != ErrAttemptTimeout && ctx.Err() != nil {
		a.err = ctx.Err()
	}
	return a
}

// release gives back what an attempt holds: its in-flight count and slot,
// and its context.
func (a *attempt) release() {
	if a.held {
		a.held = false
		a.cand.up.unclaim()
	}
	if a.cancel != nil {
		a.cancel()
	}
}

// close closes an attempt that will never be returned and releases it.
func (a *attempt) close() {
	if a.stream != nil {
		a.stream.abandon()
	} else if a.resp != nil {
		a.resp.Body.Close()
	}
	a.release()
}

// discard releases an attempt that is not returned to the caller now. Its
// response body is read ahead on a goroutine of its own (see aheadBody), so
// that the response can still be returned, intact, if no later attempt
// gets one, and nothing waits for it meanwhile; its context ends when the
// body's end was read, or the body is closed.
func (a *attempt) discard() {
	if a.held {
		a.held = false
		a.cand.up.unclaim()
	}
	switch {
	case a.stream != nil:
		a.stream.abandon()
		a.resp, a.stream = nil, nil
	case a.resp != nil:
		a.resp.Body = readAhead(a.resp.Body, maxKeptBody, a.cancel)
		return // the read ahead ends the context
	}
	if a.cancel != nil {
		a.cancel()
	}
}

// closeKept stops the read ahead of a discarded response that will not
// be returned.
func (a *attempt) closeKept() {
	if a.resp != nil {
		a.resp.Body.Close()
	}
}

// Bounds of the reads of bodies nobody waits for: a discarded response,
// read ahead in case it is returned after all; a hedge's losing answer,
// read for its usage.
const (
	maxKeptBody   = 1 << 20         // bytes read ahead of a kept body, or of a loser's
	loserBodyWait = 5 * time.Second // a loser's body is cut after this, as by a read deadline
)

// readBounded reads src to its end, at most max bytes and at most
// loserBodyWait (a real-time bound, like a read deadline), and closes it.
// cut reports that the body did not end cleanly within the bounds. It is
// for bodies no caller reads.
func readBounded(src io.ReadCloser, max int64) (buf []byte, cut bool) {
	timer := time.AfterFunc(loserBodyWait, func() { src.Close() })
	buf, err := io.ReadAll(io.LimitReader(src, max))
	if err == nil && int64(len(buf)) == max {
		var one [1]byte
		if n, _ := src.Read(one[:]); n > 0 {
			err = io.ErrUnexpectedEOF // more than max
		}
	}
	timer.Stop()
	src.Close()
	return buf, err != nil
}

// aheadBody is a response body read ahead of its reader on a goroutine of
// its own, up to max bytes, so that the router can look at its start
// without waiting for it (await), or keep it in case it is returned while
// nothing waits for it. The reader gets every byte: those read ahead as
// they arrive, then the rest straight from the upstream body. The read
// ahead ends at max bytes, at the body's end or first error, or when Close
// closes the upstream body; onDone, if not nil, runs once, when the read
// ahead met the body's end (or an error) or at Close.
type aheadBody struct {
	src    io.ReadCloser
	onDone func()
	once   sync.Once

	mu      sync.Mutex
	buf     []byte // read ahead; buf[off:] not yet handed out
	off     int
	err     error         // the read ahead's error (io.EOF at the body's end)
	stopped bool          // the read ahead ended
	closed  bool          // Close was called
	wake    chan struct{} // closed (and replaced) when the read ahead adds bytes or ends
}

// readAhead starts reading src ahead, at most max bytes.
func readAhead(src io.ReadCloser, max int, onDone func()) *aheadBody {
	b := &aheadBody{src: src, onDone: onDone, wake: make(chan struct{})}
	go b.run(max)
	return b
}

func (b *aheadBody) run(max int) {
	chunk := make([]byte, min(max, 32<<10))
	for n := 0; ; {
		m, err := b.src.Read(chunk[:min(len(chunk), max-n)])
		n += m
		b.mu.Lock()
		b.buf = append(b.buf, chunk[:m]...)
		b.err = err
		b.stopped = err != nil || n >= max
		stopped := b.stopped
		close(b.wake)
		b.wake = make(chan struct{})
		b.mu.Unlock()
		if err != nil {
			b.done()
		}
		if stopped {
			return
		}
	}
}

// await waits until the read ahead ended, d passed (real time) or ctx
// ended, whichever is first, and returns what f says of the bytes read
// ahead by then. It must be called before the first Read.
func (b *aheadBody) await(ctx context.Context, d time.Duration, f func(head []byte) bool) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	b.mu.Lock()
	defer b.mu.Unlock()
	for over := false; !b.stopped && !over; {
		wake := b.wake
		b.mu.Unlock()
		select {
		case <-wake:
		case <-timer.C:
			over = true
		case <-ctx.Done():
			over = true
		}
		b.mu.Lock()
	}
	return f(b.buf)
}

func (b *aheadBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	for {
		switch {
		case b.closed:
			b.mu.Unlock()
			return 0, errBodyClosed
		case b.off < len(b.buf):
			n := copy(p, b.buf[b.off:])
			if b.off += n; b.off == len(b.buf) {
				b.buf, b.off = b.buf[:0], 0
			}
			b.mu.Unlock()
			return n, nil
		case b.err != nil:
			err := b.err
			b.mu.Unlock()
			return 0, err
		case b.stopped:
			// The read ahead stopped at its bound: the rest comes from
			// the upstream as the reader asks for it.
			b.mu.Unlock()
			return b.src.Read(p)
		}
		wake := b.wake
		b.mu.Unlock()
		<-wake // (Close ends the read ahead, and so this wait)
		b.mu.Lock()
	}
}

func (b *aheadBody) Close() error {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	err := b.src.Close()
	b.done()
	return err
}

func (b *aheadBody) done() {
	if b.onDone != nil {
		b.once.Do(b.onDone)
	}
}

// factor is the price factor of the attempt's upstream (1 with none).
func (a *attempt) factor() float64 {
	if a.cand.up == nil {
		return 1
	}
	return a.cand.up.factor
}

// decompress undoes a gzip content coding the Base left in place (a Base
// other than http.Transport), so that usage can be read and a stream
// parsed; the caller gets the decoded body, as http.Transport gives it.
// Other codings pass through untouched, unparsed.
func decompress(resp *http.Response) {
	if resp.Body == http.NoBody || !strings.EqualFold(strings.TrimSpace(headerValue(resp.Header, "Content-Encoding")), "gzip") {
		return
	}
	resp.Body = &gzipBody{src: resp.Body}
	resp.Header.Del("Content-Encoding")
	resp.Header.Del("Content-Length")
	resp.ContentLength = -1
	resp.Uncompressed = true
}

// gzipBody decodes a gzip body, reading its header on the first Read.
type gzipBody struct {
	src io.ReadCloser
	zr  *gzip.Reader
	err error
}

func (b *gzipBody) Read(p []byte) (int, error) {
	if b.zr == nil && b.err == nil {
		b.zr, b.err = gzip.NewReader(b.src)
	}
	if b.err != nil {
		return 0, b.err
	}
	return b.zr.Read(p)
}

func (b *gzipBody) Close() error { return b.src.Close() }

// finalize hands the answering attempt's outcome to the caller: the
// response, its body wrapped to find usage and make the report, or the
// attempt's error.
func (t *trip) finalize(a attempt) (*http.Response, error) {
	t.att = a
	ttft := t.returning()
	if a.err != nil {
		return nil, t.fail(t.errorf("send", a.err))
	}
	resp := a.resp
	// The request that was sent carries the upstream's key, headers and
	// URL: the caller gets its own request back, as a rewriting
	// RoundTripper must.
	resp.Request = t.req
	if resp.Header == nil {
		resp.Header = make(http.Header)
	}
	decompress(resp)
	// The header names are canonical: set them without Set's
	// canonicalization, and in one allocation.
	vs := []string{t.model(), t.upstreamName(), strconv.Itoa(t.c.req.PromptTokens), t.id}
	resp.Header[HeaderModel] = vs[0:1:1]
	resp.Header[HeaderUpstream] = vs[1:2:2]
	resp.Header[HeaderPromptTokens] = vs[2:3:3]
	resp.Header[HeaderRequestID] = vs[3:4:4]
	switch {
	case a.stream != nil:
		resp.Body = a.stream
	case resp.StatusCode < 300 && isEventStream(resp.Header):
		resp.Body = newStreamBody(t, &t.att)
	default:
		resp.Body = &reportBody{rc: resp.Body, t: t, ttft: ttft}
		return resp, nil
	}
	if a.injected && resp.ContentLength >= 0 {
		// The injected usage chunk is taken out of the stream: its length
		// is no longer the upstream's.
		resp.ContentLength = -1
		delete(resp.Header, "Content-Length")
	}
	return resp, nil
}
