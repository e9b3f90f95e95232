package relay

import (
	"bytes"
	"context"
	"errors"
	"github.com/tidwall/gjson"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tokenrelay/relay/internal/jsonscan"
)

// Report describes one finished RoundTrip. OnReport gets exactly one per
// RoundTrip.
type Report struct {
	// RequestID identifies the request: the caller's X-Relay-Request-Id
	// or X-Request-Id header when it has a usable one (1 to 128 visible
	// ASCII characters), else one the Router made, unique across a fleet.
	// The response carries it in X-Relay-Request-Id.
	RequestID string

	RequestedModel string // as the caller asked
	Model          string // the model that answered (or was routed to)
	Upstream       string // the upstream that answered; "" when none was reached
	Bucket         string // the route's bucket label
	// UpstreamModel is Model as the upstream that answered names it
	// (Upstream.ModelNames; the deployment on Azure): the model sent. ""
	// when no upstream was reached. Prices and budgets go by Model.
	UpstreamModel string

	Endpoint     string  // as in Request
	PromptTokens int     // the router's count, before sending
	Usage        Usage   // what was billed, as the upstream reported it
	CostUSD      float64 // effective cost (after the upstream's price factor)
	ListCostUSD  float64 // at list price
	Cost         float64 // CostUSD in the billing currency (Config.Currency)
	Currency     string  // its ISO code
	Budget       string  // the budget that refused the request, if one did
	Constraint   string  // the constraint that changed the route, if one did (ConstraintContextWindow...)
	// StateFallback: a call to the shared Config.State failed or timed out,
	// and in-process state decided instead.
	StateFallback bool
	Priority      Priority      // the request's priority
	Priced        bool          // false when the model has no price: CostUSD is then 0, not a guess
	Latency       time.Duration // RoundTrip start to body done
	TTFT          time.Duration // to the first content byte (streams) or the response headers
	Attempts      int           // upstream calls made, hedges included
	Hedged        bool          // a hedge was sent
	HedgeUsage    Usage         // losing attempts' usage (hedges that answered too, answers set aside, streams failed over), added up (billed; in the costs, not in Usage)
	HedgeWon      bool          // the hedge's answer was the one returned
	Overhead      time.Duration // time RoundTrip spent in the router itself: upstream calls and waits excluded
	StatusCode    int           // final status; 0 when none came
	Stream        bool          // the request asked for a stream
	Err           error         // nil on success

	// UsageCapped: the upstream reported more completion tokens, in Usage
	// or HedgeUsage, than the request allowed (its max tokens times its
	// choices). That usage is taken for a broken upstream's: the costs and
	// budgets charge the bound, while Usage keeps the reported figures.
	UsageCapped bool

	// BadAnswer says why an answer was set aside for a model of
	// RetryConfig.BadAnswerFallbacks (BadAnswerContentFilter,
	// BadAnswerEmpty; the first one's, when several were); "" when none
	// was. Model is the model whose answer was returned.
	BadAnswer string

	// Clamp says how the request's output-token limit was lowered instead
	// of refusing it (Config.Clamp); the zero Clamp when it was not.
	Clamp Clamp

	// PredictedCached is the cached tokens StrategyExpectedCost predicted
	// for the upstream that answered, beside Usage.CachedTokens (what it
	// reported); 0 under other strategies.
	PredictedCached int

	// Context is the request's context, so a hook can reach what the
	// caller kept in it (a trace, a user). It may be done by the time the
	// report is made.
	Context context.Context
}

// bodyEnd is what a response body wrapper hands to finish when the body is
// done: the usage it found (or estimated), the error the reader got, and
// the time to the first content byte (to the headers for a plain body).
type bodyEnd struct {
	usage     Usage
	haveUsage bool
	err       error
	ttft      time.Duration
	elapsed   time.Duration // from the trip's start to when the body was done (set by finish; a time.Time would push the trip past its size class)
}

// fail finishes a trip that produced no response and returns err.
func (t *trip) fail(err error) error {
	t.returning()
	t.finish(bodyEnd{err: err})
	return err
}

// returning notes the router's own time when RoundTrip returns: all of it
// but the upstream calls and the waits.
func (t *trip) returning() (sinceStart time.Duration) {
	sinceStart = t.r.s.clock.Now().Sub(t.start)
	t.overhead = max(sinceStart-t.outside, 0)
	return sinceStart
}

// finish ends the trip: the first call wins, later ones do nothing. It
// releases the answering attempt's in-flight slot and casts the body's vote
// for the report (see vote).
func (t *trip) finish(end bodyEnd) {
	if !t.done.CompareAndSwap(false, true) {
		return
	}
	end.elapsed = t.r.s.clock.Now().Sub(t.start)
	t.att.release()
	t.end = end
	t.vote()
}

// vote counts down the parties the Report waits for: the body's end, and a
// hedge's losing answer whose usage is being read in the background. The
// last one makes the trip's one Report and hands it to OnReport, so the
// caller never waits for a loser.
func (t *trip) vote() {
	if t.votes.Add(-1) != 0 {
		return
	}
	t.learnTTFT(t.end)
	rep := t.report(t.end)
	t.noteServed(&rep)
	var spends []SpendEvent
	var late *hookPanic
	if len(t.r.s.budgets) > 0 {
		spends, late = t.settle(t.costParts(rep))
	}
	t.settleTPM(rep.Usage)
	if late != nil {
		defer panic(late.v) // a Scope's, once all is settled and reported
	}
	t.notify(spends, rep)
}

// notify calls Hooks.OnSpend with each of spends, then OnReport, once the
// trip has given back all it held: a hook that panics does not keep the
// later ones from running (they are deferred, so they run in order; the
// panic then goes on).
func (t *trip) notify(spends []SpendEvent, rep Report) {
	if f := t.r.s.onReport; f != nil {
		defer f(rep)
	}
	if hook := t.r.s.hooks.OnSpend; hook != nil {
		for i := len(spends) - 1; i >= 0; i-- {
			defer hook(spends[i])
		}
	}
}

// report assembles the Report: the one place one is built.
func (t *trip) report(end bodyEnd) Report {
	s := &t.r.s
	rep := Report{
		RequestID:      t.id,
		RequestedModel: t.c.req.Model,
		Model:          t.model(),
		Upstream:       t.upstreamName(),
		UpstreamModel:  t.upstreamModel(),
		Bucket:         t.route.Bucket,
		Endpoint:       t.c.req.Endpoint,
		PromptTokens:   t.c.req.PromptTokens,
		Latency:        end.elapsed,
		TTFT:           end.ttft,
		Attempts:       t.attempts,
		Hedged:         t.hedged,
		Constraint:     t.constraint,
		StateFallback:  t.stateFallback.Load(),
		Priority:       t.route.Priority,
		HedgeWon:       t.att.hedge == 1,
		HedgeUsage:     t.loserUsage(),
		BadAnswer:      t.bad.String(),
		Overhead:       t.overhead,
		Stream:         t.c.req.Stream,
		Err:            end.err,
		Context:        t.ctx,

		PredictedCached: int(t.att.cand.predicted),
	}
	if t.clamp != nil {
		rep.Clamp = t.clamp.Clamp
	}
	if rep.Upstream == "" {
		rep.Upstream = failedUpstream(end.err) // the upstream a failure names, if any
	}
	if resp := t.att.resp; resp != nil {
		rep.StatusCode = resp.StatusCode
		if resp.StatusCode >= 400 {
			e := t.errorf("send", ErrUpstreamStatus)
			e.StatusCode = resp.StatusCode
			rep.Err = e
		}
	}
	p, priced := lookupPrice(s.prices, rep.Model)
	rep.Priced = priced // the model has a price, whatever the status
	if end.haveUsage {
		rep.Usage = end.usage
		var billed Usage
		billed, rep.UsageCapped = t.billable(end.usage)
		if priced {
			rep.ListCostUSD = p.Cost(billed)
			rep.CostUSD = rep.ListCostUSD * t.att.factor()
		}
	}
	for _, l := range t.losers { // billed whatever the answer that won
		c, capped := t.listCost(l)
		rep.UsageCapped = rep.UsageCapped || capped
		rep.ListCostUSD += c
		rep.CostUSD += c * l.factor
	}
	rep.Currency = s.currency.Code
	rep.Cost = rep.CostUSD * s.currency.PerUSD
	if t.res.refused != nil && errors.Is(rep.Err, ErrBudgetExceeded) {
		rep.Budget = t.res.refused.Name
	}
	return rep
}

// model is the model the answering attempt asked for, else the route's.
func (t *trip) model() string {
	if t.att.cand.model != "" {
		return t.att.cand.model
	}
	return t.route.Model
}

// upstreamModel is the model the answering attempt sent, as its upstream
// names it, if there is one.
func (t *trip) upstreamModel() string {
	switch {
	case t.att.cand.up == nil:
		return ""
	case t.att.cand.model == "":
		return t.c.req.Model // a path not routed by model: its body went as it came
	}
	return t.att.cand.up.sentName(t.att.cand.model)
}

// upstreamName is the answering attempt's upstream, if there is one.
func (t *trip) upstreamName() string {
	if t.att.cand.up != nil {
		return t.att.cand.up.cfg.Name
	}
	return ""
}

// errorf wraps err as an *Error of op naming the answering attempt.
func (t *trip) errorf(op string, err error) *Error {
	return &Error{Op: op, Upstream: t.upstreamName(), Model: t.model(), Err: err}
}

// estimated is the usage of an answer that came without one: the router's
// prompt count and completion tokens counted locally. ok is false for a
// request the router cannot count (an unknown endpoint).
func (t *trip) estimated(completion int) (Usage, bool) {
	if t.c.req.Endpoint == "" {
		return Usage{}, false
	}
	return Usage{PromptTokens: t.c.req.PromptTokens, CompletionTokens: completion, Estimated: true}, true
}

// usageTeeMax bounds the response bytes kept to find the usage of a
// non-streaming answer. Past it, only the tail is kept and usage is looked
// for there.
const usageTeeMax = 4 << 20

// reportBody passes a plain (non-stream) response body through unchanged,
// keeps a bounded copy to read usage from, and finishes the trip at EOF, on
// a read error or on Close, whichever comes first. Close may run
// concurrently with Read (net/http allows it to cancel a read); mu orders
// them.
type reportBody struct {
	rc   io.ReadCloser
	t    *trip
	ttft time.Duration
	mu   sync.Mutex
	buf  []byte
	n    int64 // bytes read
	cut  bool  // buf overflowed: it holds only a tail
	err  error
	// closing is set by Close before it closes the upstream body: a Read
	// that then fails was cut by the caller's Close, not by a failure.
	closing atomic.Bool
}

func (b *reportBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.t.done.Load() {
		return n, err // closed meanwhile: the report is made
	}
	if n > 0 {
		b.n += int64(n)
		b.keep(p[:n])
	}
	if err != nil {
		if err != io.EOF && !b.closing.Load() {
			b.err = err
		}
		b.done()
	}
	return n, err
}

func (b *reportBody) keep(p []byte) {
	if len(b.buf)+len(p) <= usageTeeMax {
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
	b.closing.Store(true)
	err := b.rc.Close()
	b.mu.Lock()
	if !b.t.done.Load() && b.err == nil && b.t.ctx.Err() != nil && !b.whole() {
		// The request was cancelled and the body closed before its end
		// (openai-go closes it so when its context ends): not a success.
		b.err = b.t.ctx.Err()
	}
	b.done()
	b.mu.Unlock()
	return err
}

// whole tells whether the caller has read the whole answer, if not its
// EOF: all of its Content-Length, or, without one, a whole JSON value (a
// json.Decoder stops at the value's end).
func (b *reportBody) whole() bool {
	if cl := b.t.att.resp.ContentLength; cl >= 0 {
		return b.n == cl
	}
	return !b.cut && len(b.buf) > 0 && gjson.ValidBytes(b.buf)
}

// done finishes the trip from what was read; b.mu is held.
func (b *reportBody) done() {
	t := b.t
	if t.done.Load() {
		return
	}
	end := bodyEnd{ttft: b.ttft}
	status := t.att.resp.StatusCode
	if b.err != nil {
		e := t.errorf("read response", b.err)
		e.StatusCode = status
		end.err = e
	}
	if status >= 400 {
		t.finish(end)
		return
	}
	if b.cut {
		end.usage, end.haveUsage = tailUsage(b.buf)
	} else {
		end.usage, end.haveUsage = parseUsage(b.buf)
	}
	if !end.haveUsage && status < 300 && len(b.buf) > 0 {
		end.usage, end.haveUsage = t.estimated(t.r.counter.completion(t.c.enc, b.buf))
	}
	t.finish(end)
}

// tailUsage reads the last usage object in tail, the end of a long body
// or stream event, which may start inside a string or a value: the member
// "usage":{ whose key is a JSON key (its quote follows '{', ',' or white
// space, never a backslash: inside a string a quote is escaped), and whose
// object closes within tail and reads as a usage (parseUsage).
func tailUsage(tail []byte) (Usage, bool) {
	end := len(tail)
	for {
		k := bytes.LastIndex(tail[:end], []byte(`"usage"`))
		if k < 0 {
			return Usage{}, false
		}
		end = k
		if k == 0 || !strings.ContainsRune("{, \t\r\n", rune(tail[k-1])) {
			continue
		}
		j := jsonscan.SkipSpace(tail, k+len(`"usage"`))
		if j >= len(tail) || tail[j] != ':' {
			continue
		}
		j = jsonscan.SkipSpace(tail, j+1)
		if j >= len(tail) || tail[j] != '{' {
			continue
		}
		e, ok := objectEnd(tail, j)
		if !ok {
			continue
		}
		obj := make([]byte, 0, len(`{"usage":}`)+e-j)
		obj = append(append(append(obj, `{"usage":`...), tail[j:e]...), '}')
		if u, ok := parseUsage(obj); ok {
			return u, true
		}
	}
}

// failedUpstream returns the upstream an error names, if it is an *Error.
func failedUpstream(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Upstream
	}
	return ""
}

// settleTPM gives the answering upstream back the part of the request's
// TPM charge (prompt plus max output tokens) that its usage did not take,
// to the limits the charge was taken from.
func (t *trip) settleTPM(u Usage) {
	c := &t.att.cand
	if c.up == nil || t.att.resp == nil || c.up.cfg.TPM <= 0 {
		return
	}
	used := u.PromptTokens + u.CompletionTokens
	unused := c.up.lim.charge(t.tokens, c.took) - used
	if used == 0 || unused <= 0 {
		return
	}
	t.r.refundIn(t.ctx, t, c.up, c.took, 0, unused, t.start.Add(t.end.elapsed))
	c.up.lim.turns.refunded() // the queue's head may be waiting for these
}

// loserUsage is the usage of the hedges' losing attempts that answered
// too, added up.
func (t *trip) loserUsage() Usage {
	var u Usage
	for _, l := range t.losers {
		u.PromptTokens += l.u.PromptTokens
		u.CompletionTokens += l.u.CompletionTokens
		u.CachedTokens += l.u.CachedTokens
		u.CacheWriteTokens += l.u.CacheWriteTokens
		u.ReasoningTokens += l.u.ReasoningTokens
	}
	return u
}

// costParts splits rep's cost, in the billing currency, by where it was
// spent: the answering attempt's model and upstream, then each hedge loser
// billed too, so that each part goes to the budget ledgers that cover it.
func (t *trip) costParts(rep Report) []costPart {
	perUSD := t.r.s.currency.PerUSD
	win := rep.Cost
	var parts []costPart
	for _, l := range t.losers {
		c, _ := t.listCost(l)
		c *= l.factor * perUSD
		win -= c
		_, priced := lookupPrice(t.r.s.prices, l.model)
		parts = append(parts, costPart{model: l.model, upstream: l.upstream, cost: c, unpriced: !priced, usage: l.u, factor: l.factor})
	}
	if up := t.att.cand.up; up != nil {
		parts = append(parts, costPart{model: t.att.cand.model, upstream: up.cfg.Name, cost: max(win, 0),
			unpriced: !rep.Priced, usage: rep.Usage, factor: t.att.factor()})
	}
	return parts
}

// listCost is what a hedge's losing attempt cost at list price, for its
// billable usage (capped reports its usage over the request's bound); 0
// for a model without a price.
func (t *trip) listCost(l loserUsage) (cost float64, capped bool) {
	u, capped := t.billable(l.u)
	p, ok := lookupPrice(t.r.s.prices, l.model)
	if !ok {
		return 0, capped
	}
	return p.Cost(u), capped
}
