package relay

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"
)

// A stream is held, before its first content, so that one that fails
// before it can be retried elsewhere (see StreamConfig.FailoverWindow).
// What the hold found is judged like an answer's status: an error event
// counts as the status its kind has (errorKindOf), with its retry hint; a
// cut, a stall or data that is not JSON counts as a connection error.

// streamFailure is how a held stream failed before its first content.
type streamFailure struct {
	// resp, for an error event, is the status it counts as, with the
	// event's retry hint in Retry-After-Ms and its data as the body: what
	// the retry rules, the breaker and the limiter judge the attempt by.
	// It is nil for a failure that counts as a connection error.
	resp *http.Response
	err  error  // what hooks see, and a caller when the attempt is the last one kept
	why  string // AttemptInfo.Retry of the next attempt
}

// judgeHold looks at what the hold read and sets s.failed when the stream
// failed before its first content: an error event, malformed data, a
// stall, or a cut. A stream whose request's context ended is not judged
// (the caller gave up, not the upstream).
func (s *streamBody) judgeHold() {
	st := &s.st
	if s.t.ctx.Err() != nil {
		return
	}
	if s.rerr != nil {
		s.junkError()
	}
	switch {
	case st.errKind.status != 0:
		s.failed = &streamFailure{resp: s.errorResponse(), err: fmt.Errorf("%w: %s", ErrStreamError, st.errMsg), why: "stream-error"}
	case st.malformed:
		s.failed = &streamFailure{err: ErrStreamMalformed, why: "stream-malformed"}
	case st.gotFirst:
	case s.stalled.Load():
		s.failed = &streamFailure{err: ErrStreamStalled, why: "stalled"}
	case s.rerr != nil && !s.complete():
		err := s.rerr
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		s.failed = &streamFailure{err: err, why: "stream-cut"}
	}
}

// errorResponse is the response an error event counts as: its status, the
// stream's headers with the event's retry hint, the event's data.
func (s *streamBody) errorResponse() *http.Response {
	k := s.st.errKind
	real := s.a.resp
	h := real.Header.Clone()
	if h == nil {
		h = http.Header{}
	}
	if k.hinted {
		delete(h, "Retry-After")
		h["Retry-After-Ms"] = []string{strconv.FormatInt(k.hint.Milliseconds(), 10)}
	}
	var body []byte
	if raw := s.st.errRaw; len(raw) > 0 && raw[0] == '{' {
		body = append(append([]byte(`{"error":`), raw...), '}')
	} else {
		body = []byte(`{"error":{"message":` + strconv.Quote(s.st.errMsg) + `}}`)
	}
	return &http.Response{
		Status:     strconv.Itoa(k.status) + " " + http.StatusText(k.status),
		StatusCode: k.status,
		Proto:      real.Proto, ProtoMajor: real.ProtoMajor, ProtoMinor: real.ProtoMinor,
		Header:        h,
		Body:          io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)),
		Request:       real.Request,
	}
}

// judged is what the retry rules, the breaker and the limiter judge an
// attempt by: its response or error, or, for a stream that failed before
// its first content, the status its error event counts as, or the error
// that counts as a connection error's.
func (a *attempt) judged() (*http.Response, error) {
	if a.stream != nil && a.stream.failed != nil {
		if f := a.stream.failed; f.resp != nil {
			return f.resp, nil
		}
		return nil, a.stream.failed.err
	}
	return a.resp, a.err
}

// failure is the error of a stream that failed before its first content,
// or nil.
func (a *attempt) failure() error {
	if a.stream != nil && a.stream.failed != nil {
		return a.stream.failed.err
	}
	return nil
}

// errorKind is what an error event of a stream counts as: a status, and
// the wait it asks for.
type errorKind struct {
	status int
	hint   time.Duration
	hinted bool
}

// errorStatuses are the statuses of the error codes and types providers
// send in a stream's error event (OpenAI's code and type, Anthropic's
// type, Google's status).
var errorStatuses = map[string]int{
	"rate_limit_exceeded": 429, "rate_limit_error": 429, "insufficient_quota": 429, "requests": 429, "tokens": 429,
	"too_many_requests": 429, "overloaded_error": 429, "resource_exhausted": 429,
	"server_error": 500, "internal_error": 500, "internal_server_error": 500, "api_error": 500, "internal": 500,
	"bad_gateway": 502, "overloaded": 503, "service_unavailable": 503, "unavailable": 503, "timeout": 408,
	"invalid_request_error": 400, "invalid_request": 400, "invalid_prompt": 400, "invalid_argument": 400,
	"context_length_exceeded": 400, "content_filter": 400, "content_policy_violation": 400, "bad_request": 400,
	"invalid_api_key": 401, "authentication_error": 401, "unauthenticated": 401,
	"permission_error": 403, "permission_denied": 403, "not_found_error": 404, "model_not_found": 404, "not_found": 404,
	"request_too_large": 413,
}

// errorKindOf classifies an error event's error object e: by a numeric
// code or status, else by its code, else by its type (or Google's status
// name); an error of no known kind counts as a 500. Its retry hint is its
// retry_after_ms or retry_after member, else the wait its message asks for
// ("Please try again in 1.2s").
func errorKindOf(e gjson.Result) errorKind {
	k := errorKind{}
	for _, f := range [...]string{"code", "status"} {
		if v := e.Get(f); v.Type == gjson.Number && v.Num >= 400 && v.Num < 600 {
			k.status = int(v.Num)
			break
		}
	}
	for _, f := range [...]string{"code", "type", "status"} {
		if k.status != 0 {
			break
		}
		if v := e.Get(f); v.Type == gjson.String {
			k.status = errorStatuses[strings.ToLower(v.Str)]
		}
	}
	if k.status == 0 {
		k.status = http.StatusInternalServerError
	}
	k.hint, k.hinted = errorHint(e)
	return k
}

// tryAgainIn finds the wait an error message asks for, as OpenAI writes it
// ("Please try again in 1.2s", "in 20ms", "in 6m0s").
var tryAgainIn = regexp.MustCompile(`(?i)try again in ((?:\d+(?:\.\d+)?(?:ms|h|m|s))+)`)

// errorHint returns the wait an error object asks for.
func errorHint(e gjson.Result) (time.Duration, bool) {
	if v := e.Get("retry_after_ms"); v.Type == gjson.Number && v.Num >= 0 {
		return hintDuration(v.Num, time.Millisecond), true
	}
	if v := e.Get("retry_after"); v.Exists() {
		if n, err := strconv.ParseFloat(strings.TrimSpace(v.String()), 64); err == nil && n >= 0 {
			return hintDuration(n, time.Second), true
		}
	}
	if m := tryAgainIn.FindStringSubmatch(e.Get("message").Str); m != nil {
		if d, err := time.ParseDuration(m[1]); err == nil {
			return d, true
		}
	}
	return 0, false
}

// setAside closes an attempt that will not be returned and bills it as a
// hedge's losing attempt is (Report.HedgeUsage and the costs): a stream's
// usage, when it reported one; for a whole answer without one (est set),
// an estimate.
func (t *trip) setAside(a *attempt, est bool) {
	var u Usage
	var ok bool
	switch {
	case a.stream != nil:
		st := &a.stream.st
		u, ok = st.usage, st.haveUsage
		if !ok && est {
			u, ok = t.estimated(st.estTokens + a.stream.countEst())
		}
		a.stream.abandon()
	case a.resp != nil:
		if b, whole := a.resp.Body.(*aheadBody); whole {
			b.mu.Lock()
			body := b.buf[b.off:]
			if u, ok = parseUsage(body); !ok && est {
				u, ok = t.estimated(t.r.counter.completion(t.c.enc, body))
			}
			b.mu.Unlock()
		}
		a.resp.Body.Close()
	}
	if ok {
		t.loserMu.Lock()
		t.losers = append(t.losers, loserUsage{u: u, model: a.cand.model, upstream: a.cand.up.cfg.Name, factor: a.cand.up.factor})
		t.loserMu.Unlock()
	}
	a.resp, a.stream = nil, nil
	a.release()
}
