package relay

import (
	"context"
	"net/http"
	"time"
)

// Hooks observe a Router as it works, for tracing and metrics beyond what
// a Report carries: the request's start, each upstream call as it happens,
// limiter waits and breaker transitions. Every hook is optional (nil: not
// called, at no cost), is called synchronously with no lock held, must not
// block, and must be safe for concurrent use. JoinHooks composes several
// observers (OpenTelemetry, Prometheus, your own) into one.
//
// A panic in OnAttempt, an attempt's done function, OnWait, OnBreaker,
// OnStateFallback or a Budget's Scope while RoundTrip runs is caught: the
// request unwinds as a cancelled one, giving back its in-flight slot, rate
// tokens and budget holds, and RoundTrip then panics with the hook's value.
// One in OnBreaker during Router.Probe goes to Probe's caller; one in Scope
// while the answer's end settles the request is raised in the body's Read
// or Close, once every hold is settled and the report made.
type Hooks struct {
	// OnRequest runs when RoundTrip starts, before the body is read. The
	// context it returns, if not nil, is the request's from then on:
	// attempts are sent with contexts derived from it, hooks receive it,
	// and Report.Context is it. A tracer starts its span here and ends it
	// in OnReport (found again through Report.Context).
	OnRequest func(ctx context.Context, req *http.Request) context.Context
	// OnAttempt runs before each upstream call, with the outgoing request
	// (it may add headers, such as a W3C traceparent). The function it
	// returns, if not nil, runs once, when the call's outcome is known: its
	// response headers or its error, or ErrFirstTokenTimeout when
	// first-token failover gave up on its stream, or the failure of a
	// stream that failed before its first content (an error wrapping
	// ErrStreamError, ErrStreamMalformed, ErrStreamStalled or
	// io.ErrUnexpectedEOF), with the stream's status.
	OnAttempt func(ctx context.Context, a AttemptInfo, out *http.Request) func(AttemptDone)
	// OnWait runs after a request waited for an upstream's rate limits or
	// in-flight slot.
	OnWait func(WaitEvent)
	// OnBreaker runs on every breaker state change, as
	// BreakerConfig.OnChange does.
	OnBreaker func(BreakerEvent)
	// OnReport runs with each request's Report, as Config.OnReport does.
	OnReport func(Report)
	// OnSpend runs when a request's cost is charged to a budget's ledger:
	// once per budget that covers its answering attempt, as the request
	// settles (see Budget). A budget's refusal is in Report.Budget.
	OnSpend func(SpendEvent)
	// OnStateFallback runs each time a call to Config.State or to a shared
	// Config.Ledger fails or times out, and in-process state decides
	// instead (Router.StateFallbacks counts them).
	OnStateFallback func(StateFallbackEvent)
}

// SpendEvent is one charge to a budget's ledger.
type SpendEvent struct {
	Context  context.Context // the request's
	Budget   string          // the budget's name
	Key      string          // the ledger's key, from the budget's Scope
	Amount   float64         // what was charged, in the billing currency
	Currency string          // its ISO code (Config.Currency)
}

// StateFallbackEvent is a shared-state call that failed.
type StateFallbackEvent struct {
	// Context is the request's, or nil for a call no request made.
	Context context.Context
	// Op is the call: "admit" or "refund" (limits and circuits),
	// "observe" (a hold, a failure, a success or an open circuit told to
	// the fleet), "reserve", "settle" or "usage" (a budget's ledger;
	// "usage" when a Policy reads Request.Budget, or Router.Spend).
	Op  string
	Err error // what the call returned (a timeout is context.DeadlineExceeded)
}

// StateFallbackOps returns the operations a StateFallbackEvent names (its
// Op), for observers that label by them.
func StateFallbackOps() []string {
	return []string{"admit", "refund", "observe", "reserve", "settle", "usage"}
}

// AttemptInfo describes one upstream call as it starts. Its Retry is also,
// after a stream that failed before its first content, "stream-error",
// "stream-cut", "stream-malformed" or "stalled", and after a bad answer
// set aside for a fallback model (RetryConfig.BadAnswerFallbacks),
// "content_filter" or "empty".
type AttemptInfo struct {
	Upstream string        // the upstream's name
	Model    string        // the model asked of the upstream
	N        int           // 1 for the request's first call
	Hedge    bool          // a hedge racing the call before it
	Retry    string        // why the call before did not answer: "" for the first call, else its status ("503") or "connection", "timeout", "first-token", "context-window"
	Backoff  time.Duration // the wait before this call

	UpstreamModel string // Model as the upstream names it (Upstream.ModelNames; the deployment on Azure)
}

// AttemptDone is the outcome of one upstream call.
type AttemptDone struct {
	StatusCode int           // 0 when no response came
	Err        error         // the transport's error, ErrAttemptTimeout, or the context's
	Latency    time.Duration // to the response headers or the error
}

// WaitEvent describes a wait for an upstream's limits.
type WaitEvent struct {
	Context  context.Context // the request's
	Upstream string          // the upstream's name
	Reason   string          // "rate" (RPM, TPM or a hold) or "slot" (MaxInFlight)
	Wait     time.Duration   // how long the request waited
	Err      error           // nil when the wait ended in admission
}

// JoinHooks returns Hooks that call each of hs's hooks in order. OnRequest
// hooks chain: each gets the context the one before returned. An
// observing hook that panics (OnWait, OnBreaker, OnReport, OnSpend,
// OnStateFallback, or an attempt's done function) does not keep the ones
// after it from running, so an observer's span still ends when
// Config.OnReport panics; the panic then goes on. A panic in OnRequest or
// in OnAttempt itself stops the chain, as it stops the request.
func JoinHooks(hs ...Hooks) Hooks {
	var j Hooks
	for _, h := range hs {
		j.OnRequest = joinRequest(j.OnRequest, h.OnRequest)
		j.OnAttempt = joinAttempt(j.OnAttempt, h.OnAttempt)
		j.OnWait = join1(j.OnWait, h.OnWait)
		j.OnBreaker = join1(j.OnBreaker, h.OnBreaker)
		j.OnReport = join1(j.OnReport, h.OnReport)
		j.OnSpend = join1(j.OnSpend, h.OnSpend)
		j.OnStateFallback = join1(j.OnStateFallback, h.OnStateFallback)
	}
	return j
}

func join1[T any](a, b func(T)) func(T) {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	return func(v T) {
		defer b(v) // runs even if a panics
		a(v)
	}
}

func joinRequest(a, b func(context.Context, *http.Request) context.Context) func(context.Context, *http.Request) context.Context {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	return func(ctx context.Context, r *http.Request) context.Context {
		if c := a(ctx, r); c != nil {
			ctx = c
		}
		if c := b(ctx, r); c != nil {
			ctx = c
		}
		return ctx
	}
}

func joinAttempt(a, b func(context.Context, AttemptInfo, *http.Request) func(AttemptDone)) func(context.Context, AttemptInfo, *http.Request) func(AttemptDone) {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	return func(ctx context.Context, info AttemptInfo, out *http.Request) func(AttemptDone) {
		return join1(a(ctx, info, out), b(ctx, info, out))
	}
}
