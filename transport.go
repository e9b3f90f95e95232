package relay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/tidwall/gjson"
)

// ErrAttemptTimeout: an attempt got no response headers within
// RetryConfig.AttemptTimeout. It is retried like a connection error.
var ErrAttemptTimeout = errors.New("relay: no response headers within the attempt timeout")

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
// ErrNoUpstream, ErrRateLimited, the context's error or the transport's).
func (r *Router) RoundTrip(req *http.Request) (*http.Response, error) {
	t := &trip{r: r, req: req, start: r.clock.Now()}
	t.rep.Context = req.Context()
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
	t.body = body
	t.c = r.classify(req.Method, req.URL.Path, req.Header, body)
	t.route = r.route(t.c.req)
	t.key = r.keyOf(&t.c)
	t.rep = Report{
		RequestedModel: t.c.req.Model,
		Model:          t.route.Model,
		Bucket:         t.route.Bucket,
		Endpoint:       t.c.req.Endpoint,
		PromptTokens:   t.c.req.PromptTokens,
		Stream:         t.c.req.Stream,
		Context:        req.Context(),
	}
	cands := r.candidates(t.cbuf[:0], &t.c, t.route, t.key, true)
	if len(cands) == 0 {
		return nil, t.fail(&Error{Op: "route", Model: t.route.Model, Err: ErrNoUpstream})
	}
	return t.run(cands)
}

// candidates lists where a request may go: for the known endpoints the
// route's plan; other paths (/models, /files...) go to the first upstream.
func (r *Router) candidates(buf []candidate, c *classified, route Route, key uint64, random bool) []candidate {
	if c.req.Endpoint == "" {
		return append(buf, candidate{up: r.ups[0]})
	}
	return r.plan(buf, route.Model, route.Fallbacks, key, random)
}

// Decide returns the routing decision for req without sending it: no
// network, no limiter tokens taken, and req.Body left readable (read through
// req.GetBody when set, else read and replaced by an equal reader). The
// upstream order is the strategy's deterministic ranking; at run time
// Jitter (and the random parts of the other strategies) may move a request.
func (r *Router) Decide(req *http.Request) (Decision, error) {
	if req.URL == nil {
		return Decision{}, &Error{Op: "read request", Err: errors.New("nil request URL")}
	}
	var body []byte
	if req.Body != nil && req.Body != http.NoBody {
		rc := req.Body
		if req.GetBody != nil {
			var err error
			if rc, err = req.GetBody(); err != nil {
				return Decision{}, &Error{Op: "read body", Err: err}
			}
		}
		b, err := io.ReadAll(io.LimitReader(rc, r.maxBody+1))
		if req.GetBody != nil {
			rc.Close()
		} else {
			// What was read, then the rest; closing it closes the original.
			req.Body = struct {
				io.Reader
				io.Closer
			}{io.MultiReader(bytes.NewReader(b), rc), rc}
		}
		if err != nil {
			return Decision{}, &Error{Op: "read body", Err: err}
		}
		if int64(len(b)) > r.maxBody {
			return Decision{}, &Error{Op: "read body", Err: ErrBodyTooLarge}
		}
		body = b
	}
	c := r.classify(req.Method, req.URL.Path, req.Header, body)
	d := Decision{Request: c.req, Route: r.route(c.req)}
	cands := r.candidates(nil, &c, d.Route, r.keyOf(&c), false)
	if len(cands) == 0 {
		return d, &Error{Op: "route", Model: d.Route.Model, Err: ErrNoUpstream}
	}
	for _, cand := range cands {
		d.Upstreams = append(d.Upstreams, cand.up.cfg.Name)
	}
	return d, nil
}

func (r *Router) route(q Request) Route {
	var rt Route
	if r.cfg.Policy != nil {
		rt = r.cfg.Policy.Route(q)
	}
	if rt.Model == "" {
		rt.Model = q.Model
	}
	if rt.Bucket == "" {
		rt.Bucket = q.Bucket
	}
	return rt
}

// readBody reads and closes the request body, bounded by MaxBodyBytes.
func (r *Router) readBody(req *http.Request) ([]byte, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	defer req.Body.Close()
	if req.ContentLength > r.maxBody {
		return nil, ErrBodyTooLarge
	}
	var buf bytes.Buffer
	if req.ContentLength > 0 {
		buf.Grow(int(req.ContentLength) + 1)
	}
	if _, err := buf.ReadFrom(io.LimitReader(req.Body, r.maxBody+1)); err != nil {
		return nil, err
	}
	if int64(buf.Len()) > r.maxBody {
		return nil, ErrBodyTooLarge
	}
	return buf.Bytes(), nil
}

// trip is the state of one RoundTrip.
type trip struct {
	r     *Router
	req   *http.Request
	start time.Time
	body  []byte
	c     classified
	route Route
	key   uint64 // affinity key
	rep   Report

	att     attempt   // the answering attempt, once there is one
	exclude *upstream // acquire skips it (a hedge's first upstream)
	done    atomic.Bool
	cbuf    [8]candidate // backing array of the candidate list

	injectedUsage bool        // the router added stream_options.include_usage
	loser         *loserUsage // usage of a hedge's losing attempt, when it completed too
}

// attempt is one upstream call.
type attempt struct {
	cand   candidate
	tk     ticket // the breaker's permission
	resp   *http.Response
	err    error
	cancel context.CancelFunc
	sent   time.Time
	stream *streamBody // set when the stream was read ahead (first-token failover)
	held   bool        // holds an in-flight count and slot until released
	hedge  int         // 0 for the first attempt of a hedge, 1 for the hedge
}

// maxKeptBody bounds the body of a response kept in memory while the
// router retries elsewhere, in case it ends up being the one returned.
const maxKeptBody = 1 << 20

func (t *trip) run(cands []candidate) (*http.Response, error) {
	r := t.r
	ctx := t.req.Context()
	if r.hedging {
		r.hedges.add()
	}
	var (
		bo        backoff.BackOff
		last      *attempt
		next      int
		tried     uint64 // forced candidates already tried, by index
		lastModel string
		lastUp    *upstream
		lastFail  *attempt // the last attempt that got no response
		body      []byte
	)
	for i := 0; i < r.retry.MaxAttempts; i++ {
		idx, tk, err := t.acquire(ctx, cands, next, tried, true)
		if err != nil {
			switch {
			case last != nil && ctx.Err() == nil:
				return t.finalize(*last) // the last upstream response, intact
			case lastFail != nil && ctx.Err() == nil:
				return t.finalize(*lastFail) // the real failure, not the limiter's
			}
			return nil, t.fail(&Error{Op: "acquire", Model: t.route.Model, Err: err})
		}
		cand := cands[idx]
		next = idx + 1
		if cand.forced {
			tried |= 1 << (idx % 64)
		}
		if body == nil || cand.model != lastModel || (cand.up != lastUp && (len(cand.up.tags) > 0 || len(lastUp.tags) > 0)) {
			lastModel, lastUp, body = cand.model, cand.up, t.bodyFor(cand)
		}
		a, hedgeNext := t.sendHedged(ctx, cands, idx, tk, tried, body)
		if hedgeNext >= 0 {
			next = hedgeNext
		}
		t.rep.Attempts++
		if a.err == nil && r.cfg.Stream.FirstTokenTimeout > 0 && i < r.retry.MaxAttempts-1 &&
			a.resp.StatusCode < 300 && isEventStream(a.resp.Header) {
			// First-token failover: nothing has reached the caller yet, and
			// another attempt may follow (on the last one, a slow stream
			// beats none).
			a.stream = newStreamBody(t, &a)
			if err := a.stream.awaitFirstToken(r.cfg.Stream.FirstTokenTimeout); err != nil {
				a.stream.abandon()
				a.resp, a.stream, a.err = nil, nil, err
			}
		}
		t.observe(&a)
		final := i == r.retry.MaxAttempts-1 || ctx.Err() != nil || !r.retry.ShouldRetry(a.resp, a.err)
		var wait time.Duration
		if !final {
			hinted := false
			// A server's hint is about itself: it sets the wait when the
			// retry goes back to it. Another upstream is tried after the
			// backoff (the limiter holds this one for its hint).
			if a.resp != nil && cands[next%len(cands)].up == a.cand.up {
				if wait, hinted = RetryAfter(a.resp.Header, r.clock.Now()); hinted && wait > r.retry.MaxRetryAfter {
					final = true // the server asks for longer than we wait: answer now
				}
			}
			if !hinted {
				if bo == nil {
					bo = r.retry.newBackOff()
				}
				if wait = bo.NextBackOff(); wait == backoff.Stop {
					final = true
				}
			}
		}
		if final {
			if a.resp == nil && last != nil && ctx.Err() == nil {
				a.release()
				return t.finalize(*last) // an earlier response beats no response
			}
			return t.finalize(a)
		}
		a.discard()
		if a.resp != nil {
			last = &a
		} else {
			lastFail = &a
		}
		if err := sleep(ctx, r.clock, wait); err != nil {
			t.rep.Upstream = a.cand.up.cfg.Name // the last one tried
			return nil, t.fail(&Error{Op: "backoff", Upstream: a.cand.up.cfg.Name, Model: a.cand.model, Err: err})
		}
	}
	panic("relay: unreachable")
}

// observe feeds an attempt's outcome to its upstream's breaker and limiter.
func (t *trip) observe(a *attempt) {
	now := t.r.clock.Now()
	var hint time.Duration
	o := outcomeOf(a.resp, a.err)
	if a.resp == nil && t.req.Context().Err() != nil {
		o = outcomeNeutral // the caller gave up (cancel or its own deadline), not the upstream
	}
	a.cand.up.requests.Add(1)
	if o == outcomeFailure {
		a.cand.up.failures.Add(1)
	}
	if a.resp != nil {
		if o == outcomeFailure {
			hint, _ = RetryAfter(a.resp.Header, now)
		}
		a.cand.up.lim.observe(a.resp, now)
	}
	a.cand.up.br.done(a.tk, o, hint, now)
}

// bodyFor returns the body to send to cand: the caller's bytes, with, when
// the body is a JSON object, the model, the upstream's body tags, the prompt
// cache key and the stream usage option set in place, in one copy (none when
// nothing changes).
func (t *trip) bodyFor(cand candidate) []byte {
	if !t.c.json {
		return t.body
	}
	var buf [8]topSet
	sets := buf[:0]
	if cand.model != "" && cand.model != t.c.req.Model {
		sets = append(sets, topSet{key: "model", raw: gjson.AppendJSONString(nil, cand.model)})
	}
	for _, tag := range cand.up.tags {
		sets = append(sets, topSet{key: tag.key, raw: tag.raw})
	}
	if t.r.cfg.PromptCacheKey && t.key != 0 {
		sets = append(sets, topSet{key: "prompt_cache_key", raw: gjson.AppendJSONString(nil, cacheKeyString(t.key)), ifAbsent: true})
	}
	usage := -1
	if t.c.req.Stream && !t.r.cfg.Stream.KeepUsageOption && wantsStreamUsage(t.c.req.Endpoint) {
		usage = len(sets)
		sets = append(sets, topSet{key: "stream_options", raw: []byte(`{"include_usage":true}`), ifAbsent: true})
	}
	if len(sets) == 0 || len(sets) > 64 {
		return t.body
	}
	b, found := editTop(t.body, sets)
	t.injectedUsage = false
	if usage >= 0 {
		if found&(1<<usage) == 0 {
			t.injectedUsage = true
		} else {
			b, t.injectedUsage = t.injectStreamUsage(b) // stream_options exists: set the one field in it
		}
	}
	return b
}

// send makes one upstream call. The attempt holds the in-flight count and
// slot acquire took until it is released.
func (t *trip) send(ctx context.Context, cand candidate, body []byte) attempt {
	r := t.r
	a := attempt{cand: cand, held: true}
	// state settles the race between the attempt timer and the response:
	// 0 while waiting, 1 once the response is kept, 2 once the timer fired.
	var state atomic.Int32
	var stop func() bool
	if r.retry.AttemptTimeout > 0 {
		ctx, a.cancel = context.WithCancel(ctx)
		cancel := a.cancel
		stop = r.clock.AfterFunc(r.retry.AttemptTimeout, func() {
			if state.CompareAndSwap(0, 2) {
				cancel()
			}
		})
	}
	out := t.outgoing(ctx, cand, body)
	up := cand.up
	a.sent = r.clock.Now()
	a.resp, a.err = r.base.RoundTrip(out)
	if a.err == nil && a.resp == nil {
		a.err = errors.New("relay: Base returned no response and no error")
	}
	if a.resp != nil && a.resp.Body == nil {
		a.resp.Body = http.NoBody
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
	if a.err == nil || a.err == ErrAttemptTimeout {
		now := r.clock.Now()
		up.lat.add(now.Sub(a.sent), now)
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
		a.cand.up.inflight.Add(-1)
		a.cand.up.lim.release()
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
// response body is kept in memory (up to maxKeptBody) so the response can
// still be returned, intact, if no later attempt gets one.
func (a *attempt) discard() {
	if a.stream != nil {
		a.stream.abandon()
		a.resp, a.stream = nil, nil
	} else if a.resp != nil {
		b, _ := io.ReadAll(io.LimitReader(a.resp.Body, maxKeptBody))
		a.resp.Body.Close()
		a.resp.Body = io.NopCloser(bytes.NewReader(b))
		a.resp.ContentLength = int64(len(b))
	}
	a.release()
}

// outgoing builds the request for one attempt on a copy of the caller's.
func (t *trip) outgoing(ctx context.Context, cand candidate, body []byte) *http.Request {
	req := t.req
	out := req.Clone(ctx)
	u := *cand.up.base
	u.Path = u.Path + "/" + t.pathFor()
	u.RawPath = ""
	switch {
	case u.RawQuery == "":
		u.RawQuery = req.URL.RawQuery
	case req.URL.RawQuery != "":
		u.RawQuery += "&" + req.URL.RawQuery // the BaseURL's own query (e.g. api-version) first
	}
	out.URL = &u
	out.Host = ""
	if cand.up.auth != nil {
		out.Header.Set("Authorization", cand.up.auth())
	}
	for k, vs := range cand.up.header {
		out.Header[k] = slices.Clone(vs) // a Base may add to them
	}
	if body == nil {
		out.Body, out.GetBody, out.ContentLength = nil, nil, 0
		return out
	}
	out.ContentLength = int64(len(body))
	out.Body = io.NopCloser(bytes.NewReader(body))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return out
}

// pathFor is the path appended to an upstream's BaseURL: the endpoint for
// the known ones; for other paths, what follows the caller's "/v1/" (or the
// whole path when it has none).
func (t *trip) pathFor() string {
	if t.c.req.Endpoint != "" {
		return t.c.req.Endpoint
	}
	p := t.req.URL.Path
	if i := strings.Index(p, "/v1/"); i >= 0 {
		return p[i+len("/v1/"):]
	}
	return strings.TrimPrefix(p, "/")
}

// finalize hands the answering attempt's outcome to the caller.
func (t *trip) finalize(a attempt) (*http.Response, error) {
	t.att = a
	t.rep.Upstream = a.cand.up.cfg.Name
	if a.cand.model != "" {
		t.rep.Model = a.cand.model
	}
	if a.err != nil {
		return nil, t.fail(&Error{Op: "send", Upstream: t.rep.Upstream, Model: t.rep.Model, Err: a.err})
	}
	resp := a.resp
	now := t.r.clock.Now()
	t.rep.TTFT = now.Sub(t.start)
	t.rep.StatusCode = resp.StatusCode
	if resp.StatusCode >= 400 {
		t.rep.Err = &Error{Op: "send", Upstream: t.rep.Upstream, Model: t.rep.Model, StatusCode: resp.StatusCode, Err: ErrUpstreamStatus}
	}
	if resp.Header == nil {
		resp.Header = make(http.Header)
	}
	resp.Header.Set(HeaderModel, t.rep.Model)
	resp.Header.Set(HeaderUpstream, t.rep.Upstream)
	resp.Header.Set(HeaderPromptTokens, strconv.Itoa(t.rep.PromptTokens))
	if resp.Body == nil {
		resp.Body = http.NoBody
	}
	switch {
	case a.stream != nil:
		resp.Body = a.stream
	case resp.StatusCode < 300 && isEventStream(resp.Header):
		resp.Body = newStreamBody(t, &a)
	default:
		resp.Body = &reportBody{rc: resp.Body, t: t, max: usageTeeMax}
	}
	return resp, nil
}

// fail finishes a trip that produced no response and returns err.
func (t *trip) fail(err error) error {
	t.rep.Err = err
	t.finish(Usage{}, false)
	return err
}

// finish completes the report exactly once: usage and cost, latency, the
// upstream's bookkeeping, then OnReport.
func (t *trip) finish(u Usage, haveUsage bool) {
	if !t.done.CompareAndSwap(false, true) {
		return
	}
	r := t.r
	rep := &t.rep
	rep.Latency = r.clock.Now().Sub(t.start)
	t.att.release()
	if haveUsage {
		rep.Usage = u
		if p, ok := lookupPrice(r.prices, rep.Model); ok {
			rep.Priced = true
			rep.ListCostUSD = p.Cost(u)
			factor := 1.0
			if t.att.cand.up != nil {
				factor = t.att.cand.up.factor
			}
			rep.CostUSD = rep.ListCostUSD * factor
		}
		if l := t.loser; l != nil && rep.Priced {
			if p, ok := lookupPrice(r.prices, l.model); ok {
				c := p.Cost(l.u)
				rep.ListCostUSD += c
				rep.CostUSD += c * l.factor
			}
		}
	}
	if r.cfg.OnReport != nil {
		r.cfg.OnReport(*rep)
	}
}

// usageTeeMax bounds the response bytes kept to find the usage of a
// non-streaming answer. Past it, only the tail is kept and usage is looked
// for there.
const usageTeeMax = 4 << 20

// reportBody passes a response body through unchanged, keeps a bounded copy
// to read usage from, and finishes the trip's report at EOF, on a read error
// or on Close, whichever comes first. Close may run concurrently with Read
// (net/http allows it to cancel a read); mu orders them.
type reportBody struct {
	rc  io.ReadCloser
	t   *trip
	mu  sync.Mutex
	buf []byte
	max int
	cut bool // buf overflowed: it holds only a tail
	err error
}

func (b *reportBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.t.done.Load() {
		return n, err // closed meanwhile: the report is made
	}
	if n > 0 {
		b.keep(p[:n])
	}
	if err != nil {
		if err != io.EOF {
			b.err = err
		}
		b.done()
	}
	return n, err
}

func (b *reportBody) keep(p []byte) {
	if len(b.buf)+len(p) <= b.max {
		b.buf = append(b.buf, p...)
		return
	}
	// Keep the last tailKeep bytes only.
	const tailKeep = 64 << 10
	b.cut = true
	b.buf = append(b.buf, p...)
	if len(b.buf) > tailKeep {
		b.buf = append(b.buf[:0], b.buf[len(b.buf)-tailKeep:]...)
	}
}

func (b *reportBody) Close() error {
	err := b.rc.Close()
	b.mu.Lock()
	b.done()
	b.mu.Unlock()
	return err
}

// done finishes the report from what was read; b.mu is held.
func (b *reportBody) done() {
	t := b.t
	if t.done.Load() {
		return
	}
	if b.err != nil && t.rep.Err == nil {
		t.rep.Err = &Error{Op: "read response", Upstream: t.rep.Upstream, Model: t.rep.Model, StatusCode: t.rep.StatusCode, Err: b.err}
	}
	if t.rep.StatusCode >= 400 {
		t.finish(Usage{}, false)
		return
	}
	var u Usage
	var ok bool
	if b.cut {
		u, ok = usageFromTail(b.buf)
	} else {
		u, ok = parseUsage(b.buf)
	}
	if !ok && t.rep.StatusCode < 300 {
		u, ok = t.estimateUsage(b.buf)
	}
	t.finish(u, ok)
}

// usageFromTail finds the last "usage" object in the tail of a large body.
func usageFromTail(tail []byte) (Usage, bool) {
	i := bytes.LastIndex(tail, []byte(`"usage"`))
	if i < 0 {
		return Usage{}, false
	}
	return parseUsage(append([]byte("{"), tail[i:]...))
}

// estimateUsage counts a non-streaming answer locally when the upstream sent
// no usage: the router's prompt count and the tokens of the answer's text.
func (t *trip) estimateUsage(body []byte) (Usage, bool) {
	if t.c.req.Endpoint == "" || len(body) == 0 {
		return Usage{}, false
	}
	u := Usage{PromptTokens: t.c.req.PromptTokens, Estimated: true}
	u.CompletionTokens = t.r.completionTokens(t.c.enc, body)
	return u, true
}

// bodyTag is a top-level JSON field set on every request body to an upstream.
type bodyTag struct {
	key string // the field's name
	raw []byte // its JSON value
}

func tagJSON(v any) ([]byte, error) { return json.Marshal(v) }

// topSet is one top-level field bodyFor sets.
type topSet struct {
	key      string
	raw      []byte
	ifAbsent bool // leave an existing field alone
}

// firstSet reports whether sets[i] is the first set of its key; a later
// set of the same key is ignored.
func firstSet(sets []topSet, i int) bool {
	for j := range i {
		if sets[j].key == sets[i].key {
			return false
		}
	}
	return true
}

// editTop sets top-level fields of a JSON object in one pass and one copy:
// an existing field's value is replaced where it stands (unless ifAbsent),
// a missing one is added before the closing brace; every other byte is kept.
// body must be a valid JSON object. found reports, per set, whether the field
// was there.
func editTop(body []byte, sets []topSet) (out []byte, found uint64) {
	root := gjson.ParseBytes(body)
	type span struct{ start, end, set int }
	var spansBuf [8]span
	spans := spansBuf[:0]
	empty := true
	root.ForEach(func(k, v gjson.Result) bool {
		empty = false
		for i := range sets {
			if k.Str == sets[i].key && firstSet(sets, i) { // every occurrence, should a key repeat
				found |= 1 << i
				if !sets[i].ifAbsent {
					spans = append(spans, span{v.Index, v.Index + len(v.Raw), i})
				}
			}
		}
		return true
	})
	closing := bytes.LastIndexByte(body, '}') // the object's: only whitespace may follow
	size := len(body)
	for i, st := range sets {
		if found&(1<<i) == 0 {
			size += len(st.key) + len(st.raw) + 8
		} else {
			size += len(st.raw)
		}
	}
	out = make([]byte, 0, size)
	at := 0
	for _, sp := range spans { // ForEach goes in document order
		out = append(out, body[at:sp.start]...)
		out = append(out, sets[sp.set].raw...)
		at = sp.end
	}
	out = append(out, body[at:closing]...)
	for i, st := range sets {
		if found&(1<<i) != 0 || !firstSet(sets, i) {
			continue
		}
		if !empty {
			out = append(out, ',')
		}
		empty = false
		out = gjson.AppendJSONString(out, st.key)
		out = append(out, ':')
		out = append(out, st.raw...)
	}
	return append(out, body[closing:]...), found
}
