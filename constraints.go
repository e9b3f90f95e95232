package relay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The promises the router keeps because it knows each request: a request
// is never sent to a model whose context window it cannot fit; a request
// that requires tags (residency, a tier) never leaves the upstreams that
// carry them, failover included; and under backpressure, waiting requests
// are admitted by priority.

// ErrContextWindow: the request fits no model of its route, nor any of
// Config.ContextFallbacks: its prompt (or its requested output) is larger
// than every window known. No upstream was called.
var ErrContextWindow = errors.New("relay: the request fits no model's context window")

// ErrNoTaggedUpstream: no upstream serving the request's models carries
// every tag the request requires. No upstream was called.
var ErrNoTaggedUpstream = errors.New("relay: no upstream carries the required tags")

// Constraints that can change a route, in Report.Constraint.
const (
	ConstraintContextWindow = "context-window" // a model whose window fits was chosen
	ConstraintTags          = "tags"           // upstreams without the required tags were left out
	ConstraintBudget        = "budget"         // a budget's Downgrade model was chosen
)

// Headers a caller may set on a request.
const (
	// HeaderRequire lists tags every upstream of the request must carry,
	// comma-separated (e.g. "region=eu, zdr").
	HeaderRequire = "X-Relay-Require"
	// HeaderPriority sets the request's priority: "interactive", "batch",
	// or a number (higher goes first).
	HeaderPriority = "X-Relay-Priority"
)

// Priority orders requests that wait for an upstream's limits: higher
// first. The zero Priority is the default.
type Priority int

// Named priorities.
const (
	PriorityBatch       Priority = -1
	PriorityDefault     Priority = 0
	PriorityInteractive Priority = 1
)

// priorityOf reads HeaderPriority.
func priorityOf(h http.Header) Priority {
	v := strings.TrimSpace(headerValue(h, HeaderPriority))
	switch strings.ToLower(v) {
	case "":
		return PriorityDefault
	case "interactive":
		return PriorityInteractive
	case "batch":
		return PriorityBatch
	}
	if n, err := strconv.Atoi(v); err == nil {
		return Priority(n)
	}
	return PriorityDefault
}

// requiredTags returns the tags a request requires: HeaderRequire's and the
// route's Require, nil when none.
func requiredTags(h http.Header, rt Route) []string {
	var tags []string
	for _, v := range h[HeaderRequire] {
		for _, tag := range strings.Split(v, ",") {
			if tag = strings.TrimSpace(tag); tag != "" && !slices.Contains(tags, tag) {
				tags = append(tags, tag)
			}
		}
	}
	for _, tag := range rt.Require {
		if tag != "" && !slices.Contains(tags, tag) {
			tags = append(tags, tag)
		}
	}
	return tags
}

// window returns a model's context window from the price table: the most
// input and output tokens it takes, 0 when unknown.
func (s *settings) window(model string) (in, out int) {
	p, ok := lookupPrice(s.prices, model)
	if !ok {
		return 0, 0
	}
	return p.MaxInputTokens, p.MaxOutputTokens
}

// fits reports whether a request of prompt tokens asking for maxOut output
// tokens fits model's window (an unknown window fits everything).
func (s *settings) fits(model string, prompt, maxOut int) bool {
	in, out := s.window(model)
	return (in == 0 || prompt <= in) && (out == 0 || maxOut <= out)
}

// fitWindow keeps the route's models whose context window fits the
// request: the route's model when it fits, else the first fallback (of the
// route, then Config.ContextFallbacks) that does; fallbacks that do not fit
// are dropped, so no upstream is asked what must fail with
// context_length_exceeded. changed reports a new model; a request that fits
// no model is an ErrContextWindow.
func (s *settings) fitWindow(q *Request, rt Route) (_ Route, changed bool, err error) {
	if q.Endpoint == "" || q.PromptTokens == 0 {
		return rt, false, nil
	}
	fit := func(m string) bool { return s.fits(m, q.PromptTokens, q.MaxTokens) }
	if fit(rt.Model) && !slices.ContainsFunc(rt.Fallbacks, func(m string) bool { return !fit(m) }) {
		return rt, false, nil // the common case: nothing to change
	}
	if rt.Model == "" {
		// A body with no model (the deployment is in the URL): its
		// window is unknown, so it fits; only fallbacks that do not fit
		// are dropped.
		rt.Fallbacks = slices.DeleteFunc(slices.Clone(rt.Fallbacks), func(m string) bool { return m == "" || !fit(m) })
		return rt, false, nil
	}
	var models []string
	for _, m := range slices.Concat([]string{rt.Model}, rt.Fallbacks, s.contextFallbacks) {
		if m != "" && fit(m) && !slices.Contains(models, m) {
			models = append(models, m)
		}
	}
	if len(models) == 0 {
		in, out := s.window(rt.Model)
		return rt, false, fmt.Errorf("%w: %d prompt tokens and %d output tokens asked of %s (window: %d input, %d output tokens)",
			ErrContextWindow, q.PromptTokens, q.MaxTokens, rt.Model, in, out)
	}
	changed = models[0] != rt.Model
	rt.Model, rt.Fallbacks = models[0], models[1:]
	return rt, changed, nil
}

// largerWindow returns a model, not tried yet, whose input window is
// larger than model's: for a request the upstream refused with
// context_length_exceeded although the router's count fit.
func (s *settings) largerWindow(model string, rt Route, tried func(string) bool) string {
	in, _ := s.window(model)
	for _, m := range slices.Concat(rt.Fallbacks, s.contextFallbacks) {
		if mi, _ := s.window(m); m != model && !tried(m) && (mi == 0 || in == 0 || mi > in) {
			return m
		}
	}
	return ""
}

// contextLengthExceeded reports whether an upstream's answer is a 400
// context_length_exceeded, from the start of its body that arrived within
// peekWait (or before ctx ended); the body stays whole for the caller.
func contextLengthExceeded(ctx context.Context, resp *http.Response) bool {
	if resp == nil || resp.StatusCode != http.StatusBadRequest {
		return false
	}
	b := readAhead(resp.Body, peekMax, nil)
	resp.Body = b
	return b.await(ctx, peekWait, func(head []byte) bool {
		return bytes.Contains(head, []byte("context_length_exceeded"))
	})
}

// The look into a 400 for context_length_exceeded: its first peekMax
// bytes, those that came within peekWait (real time).
const (
	peekMax  = 64 << 10
	peekWait = 100 * time.Millisecond
)

// decide classifies the request's body, asks the policy for its route,
// derives its affinity key, and plans its candidates (with random false,
// the deterministic ranking, for Decide).
func (t *trip) decide(body []byte, random bool) ([]candidate, error) {
	r, req := t.r, t.req
	if err := checkURL(req.URL); err != nil {
		return nil, err
	}
	t.body = body
	t.c = r.classify(req.Method, req.URL.Path, req.Header, body)
	if len(r.s.budgets) > 0 {
		t.view = budgetView{r: r, q: &t.c.req, ctx: t.ctx}
		t.c.req.Budget = &t.view
	}
	if err := nameErr(`the body's "model"`, t.c.req.Model); err != nil {
		return nil, err // (before the policy sees it)
	}
	t.route = r.s.route(t.c.req)
	if err := checkRouteNames(&t.route); err != nil {
		return nil, err
	}
	if err := r.s.checkRoute(&t.c.req, t.route); err != nil {
		return nil, err
	}
	t.key = r.keyOf(&t.c)
	cands, err := t.plan(random)
	if err == nil {
		err = t.byDeadline(t.ctx, cands)
	}
	return cands, err
}

// plan applies the route's constraints and lists its candidates: the
// models whose window fits, the upstreams that carry the required tags.
func (t *trip) plan(random bool) ([]candidate, error) {
	r := t.r
	t.clampWindow(t.route)
	rt, changed, err := r.s.fitWindow(&t.c.req, t.route)
	if err != nil {
		return nil, &Error{Op: "route", Model: t.route.Model, Err: err}
	}
	if changed {
		t.route, t.constraint = rt, ConstraintContextWindow
	}
	t.route.Fallbacks = rt.Fallbacks
	t.require = requiredTags(t.req.Header, t.route)
	cands := r.candidates(t.cbuf[:0], &t.c, t.route, t.key, random, t.require)
	switch {
	case len(cands) > 0:
		return cands, nil
	case len(t.require) > 0 && len(r.candidates(nil, &t.c, t.route, t.key, false, nil)) > 0:
		return nil, &Error{Op: "route", Model: t.route.Model, Err: fmt.Errorf("%w: %s", ErrNoTaggedUpstream, strings.Join(t.require, ", "))}
	}
	return nil, &Error{Op: "route", Model: t.route.Model, Err: ErrNoUpstream}
}

// widen answers an upstream's 400 context_length_exceeded (its count
// differs from the router's): once per request, the attempt is retried at
// once on a model with a larger window, when the route has one. It returns
// the index of that model's first candidate.
func (t *trip) widen(cands *[]candidate, a *attempt) (int, bool) {
	if t.widened || a.resp == nil || !contextLengthExceeded(t.ctx, a.resp) {
		return 0, false
	}
	t.widened = true
	tried := func(m string) bool {
		return slices.ContainsFunc(*cands, func(c candidate) bool { return c.model == m && c.up == a.cand.up })
	}
	m := t.r.s.largerWindow(a.cand.model, t.route, tried)
	if m == "" {
		return 0, false
	}
	n := len(*cands)
	*cands = t.r.appendCandidates(*cands, m, t.r.s.clock.Now(), t.key, true, t.require)
	if len(*cands) == n {
		return 0, false
	}
	t.constraint, t.why = ConstraintContextWindow, "context-window"
	return n, true
}
