package relay

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// Policy decides where a request goes. Route is called once per RoundTrip
// (and per Decide), concurrently from many goroutines; it must be safe for
// concurrent use and should be fast. It must not modify r.Header.
type Policy interface {
	Route(r Request) Route
}

// PolicyFunc adapts a function to Policy.
type PolicyFunc func(Request) Route

// Route calls f(r).
func (f PolicyFunc) Route(r Request) Route { return f(r) }

// Request is what a Policy sees of a request.
type Request struct {
	Endpoint     string      // "chat/completions", "responses", "completions", "embeddings"; "" for other paths
	Model        string      // as the caller asked
	PromptTokens int         // tiktoken count, as the API bills the prompt
	MaxTokens    int         // max_tokens / max_completion_tokens / max_output_tokens; 0 when absent
	Stream       bool        // "stream": true
	Bucket       string      // "short", "mid" or "long", from Config.Buckets
	Header       http.Header // caller's headers, read-only
	// Load reports live load per model, so a rule can say "when busy". It
	// is never nil in a Request made by the router.
	Load Load
	// Budget reports how much of each budget covering the request is
	// spent, so a rule can move it to a cheaper model as a budget runs low.
	// It is never nil in a Request made by the router.
	Budget Budgets
	// MaxInputTokens and MaxOutputTokens are the context window of the
	// requested model (from Config.Prices; 0 when unknown), so a rule can
	// send long prompts to a long-context model without a table of its own.
	MaxInputTokens, MaxOutputTokens int
	// Priority is the request's priority from its X-Relay-Priority header
	// (PriorityDefault without one).
	Priority Priority
}

// Endpoints the router recognises by path suffix (Request.Endpoint).
const (
	EndpointChat        = "chat/completions"
	EndpointResponses   = "responses"
	EndpointCompletions = "completions"
	EndpointEmbeddings  = "embeddings"
)

// Load is the policy's view of live load. The router's own (Router.Busy)
// is safe for concurrent use; a test may pass a fake.
type Load interface {
	// Busy reports whether the model's upstreams are busy: their recent p99
	// latency is over the bound, or every one of them is saturated.
	Busy(model string) bool
}

// Route is a Policy's answer. The zero Route keeps the requested model.
type Route struct {
	Model     string   // model to send; empty keeps the requested one
	Fallbacks []string // further models to try, in order, when Model's upstreams fail
	Bucket    string   // label for reports; empty: the request's bucket
	// Require lists tags every upstream of the request must carry, added
	// to those of its X-Relay-Require header (e.g. "region=eu").
	Require []string
	// Priority, when not zero, replaces the request's priority.
	Priority Priority
}

// route asks the policy for q's route and fills in what it left empty.
func (s *settings) route(q Request) Route {
	var rt Route
	if s.policy != nil {
		rt = s.policy.Route(q)
	}
	if rt.Model == "" {
		rt.Model = q.Model
	}
	if rt.Bucket == "" {
		rt.Bucket = q.Bucket
	}
	if rt.Priority == 0 {
		rt.Priority = q.Priority
	}
	return rt
}

// checkRoute refuses a route to a model the policy chose in place of the
// requested one when no upstream serves it (every upstream lists its
// Models, and none lists it): a misspelt name fails the request, naming
// it, instead of being quietly served by a fallback. The route's
// fallbacks that no upstream serves are skipped, as when they are down.
func (s *settings) checkRoute(q *Request, rt Route) error {
	if q.Endpoint == "" || rt.Model == q.Model || s.serves(rt.Model) {
		return nil
	}
	return &Error{Op: "route", Model: rt.Model,
		Err: fmt.Errorf("%w: the policy routed %q to %q, which no upstream lists in Models", ErrNoUpstream, q.Model, rt.Model)}
}

// serves reports whether some upstream serves model.
func (s *settings) serves(model string) bool {
	for i := range s.upstreams {
		if m := s.upstreams[i].models; m == nil || m[model] {
			return true
		}
	}
	return false
}

// ClusterPolicy is the ready-made cluster-aware policy. Prompts whose token
// count falls inside the window (the band that batch jobs and IDE
// completions fill, and that providers pin to one hot shard) go to the Fast
// model; other mid-size prompts go to the Cheap model; long prompts, and
// short ones below the window, keep the requested model. Every rewritten
// route falls back to the requested model, and the requested model's route
// falls back to Fallbacks.
//
// With WhenBusy set, the window moves to Fast only while the requested
// model's upstreams are busy (Request.Load.Busy; a nil Load is never busy),
// so an idle primary keeps its traffic.
//
// The zero ClusterPolicy keeps every request's model. A ClusterPolicy is a
// value; it is safe for concurrent use as long as Fallbacks is not
// modified.
type ClusterPolicy struct {
	Fast  string // model for prompts in the window; "" keeps the requested one
	Cheap string // model for mid-size prompts outside the window; "" keeps the requested one
	// WindowMin and WindowMax bound the window, inclusive, in prompt tokens.
	// If both are 0, 80 and 260.
	WindowMin, WindowMax int
	// WhenBusy moves the window to Fast only while the requested model is
	// busy.
	WhenBusy bool
	// CheapWhenSpent, when positive, also sends long prompts to Cheap once
	// a budget covering the request is spent (or reserved) past this share
	// of its limit (0.8: 80%), as Request.Budget tells: a cheaper route
	// before a refusal.
	CheapWhenSpent float64
	// Fallbacks follow the requested model when it is kept.
	Fallbacks []string
}

// Route implements Policy.
func (p ClusterPolicy) Route(r Request) Route {
	lo, hi := p.WindowMin, p.WindowMax
	if lo == 0 && hi == 0 {
		lo, hi = 80, 260
	}
	rt := Route{Model: r.Model, Bucket: r.Bucket, Fallbacks: p.Fallbacks}
	switch {
	case p.Fast != "" && r.PromptTokens >= lo && r.PromptTokens <= hi &&
		(!p.WhenBusy || (r.Load != nil && r.Load.Busy(r.Model))):
		rt.Model = p.Fast
	case p.Cheap != "" && r.Bucket == BucketMid:
		rt.Model = p.Cheap
	case p.Cheap != "" && p.CheapWhenSpent > 0 && r.Bucket == BucketLong && r.Budget != nil && r.Budget.Most() >= p.CheapWhenSpent:
		rt.Model = p.Cheap
	default:
		return rt
	}
	if rt.Model != r.Model && r.Model != "" {
		rt.Fallbacks = append([]string{r.Model}, p.Fallbacks...)
	}
	return rt
}

// Decision is the router's answer for a request, without sending it.
type Decision struct {
	Request    Request  // what the policy saw
	Route      Route    // the policy's route, as the constraints left it
	Upstreams  []string // upstream names in the order they would be tried
	Constraint string   // the constraint that changed the route, if one did
	// Candidates are the attempts of Upstreams, in the same order: the
	// upstream, the model it would be sent, and the timeouts its attempt
	// would get.
	Candidates []Candidate
	// Clamp is the clamp of the request's output-token limit to its
	// model's window (Config.Clamp), if one would be made; Request keeps
	// the limit the policy saw.
	Clamp Clamp
}

// Candidate is one attempt a Decision plans.
type Candidate struct {
	Upstream string
	Model    string // the model as routed (the Route's Model or a fallback)
	// UpstreamModel is the model as this upstream names it
	// (Upstream.ModelNames; the deployment on Azure).
	UpstreamModel string
	Timeouts      Timeouts // resolved for this upstream and model: zero is no bound
	// PredictedCached is the cached tokens StrategyExpectedCost predicts
	// the request would report on this upstream (0 under other strategies).
	PredictedCached int
	// PredictedTTFT and PredictedTTFTP95 are the median and p95 time to
	// first token (the response headers' for an answer that is not a
	// stream) predicted for this request's prompt size on this upstream
	// and model; zero until the fit holds 20 answers.
	PredictedTTFT, PredictedTTFTP95 time.Duration
}

// Decide returns the routing decision for req without sending it: no
// network, no limiter tokens taken, and req.Body left readable (read through
// req.GetBody when set, else read and replaced by an equal reader). The
// upstream order is the strategy's deterministic ranking; at run time
// Jitter (and the random parts of the other strategies) may move a request.
// It is safe for concurrent use, as RoundTrip is.
func (r *Router) Decide(req *http.Request) (Decision, error) {
	r = r.current()
	if req.URL == nil {
		return Decision{}, &Error{Op: "read request", Err: errors.New("nil request URL")}
	}
	body, err := r.peekBody(req)
	if err != nil {
		return Decision{}, &Error{Op: "read body", Err: err}
	}
	t := &trip{r: r, req: req, ctx: req.Context()} // no hooks: nothing is sent
	cands, err := t.decide(body, false)
	d := Decision{Request: t.c.req, Route: t.route, Constraint: t.constraint}
	if t.clamp != nil {
		d.Clamp, d.Request.MaxTokens = t.clamp.Clamp, t.clamp.From
	}
	if err != nil {
		return d, err
	}
	for _, cand := range cands {
		d.Upstreams = append(d.Upstreams, cand.up.cfg.Name)
		c := Candidate{Upstream: cand.up.cfg.Name, Model: cand.model,
			UpstreamModel: cand.up.sentName(cand.model), Timeouts: cand.timeouts(), PredictedCached: int(cand.predicted)}
		c.PredictedTTFT, c.PredictedTTFTP95, _ = t.predictedTTFT(&cand)
		d.Candidates = append(d.Candidates, c)
	}
	return d, nil
}

// peekBody reads req's body for Decide and leaves it readable.
func (r *Router) peekBody(req *http.Request) ([]byte, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return nil, nil
	}
	rc := req.Body
	if req.GetBody != nil {
		var err error
		if rc, err = req.GetBody(); err != nil {
			return nil, err
		}
	}
	b, err := io.ReadAll(io.LimitReader(rc, r.s.maxBody+1))
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
		return nil, err
	}
	if int64(len(b)) > r.s.maxBody {
		return nil, ErrBodyTooLarge
	}
	return b, nil
}
