package relay

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
)

// Errors callers may branch on with errors.Is. Every error the router returns
// or reports is an *Error wrapping one of these (or a context or transport
// error), with a message prefixed "relay: ". No error ever contains an API
// key.
var (
	// ErrNoUpstream: no configured upstream serves the requested model, or
	// the model a Policy routed the request to in its place (the request
	// is then refused, not sent to a fallback). An upstream with empty
	// Models serves every model: with one configured, no model's name is
	// refused so.
	ErrNoUpstream = errors.New("relay: no upstream serves the model")
	// ErrBodyTooLarge: the request body exceeds Config.MaxBodyBytes; no
	// upstream was called.
	ErrBodyTooLarge = errors.New("relay: request body too large")
	// ErrBadPath: the request's URL could reach outside the upstream's
	// BaseURL, where its key would go too: its path has a "." or ".."
	// segment (percent-encoded or not, between "/", "\" or their
	// encodings), or its query holds a space, '#' or a control character.
	// No upstream was called.
	ErrBadPath = errors.New("relay: request path could leave the upstream's BaseURL")
	// ErrBadName: a model name (the body's "model", a Route's Model or
	// Fallbacks) or a Route's Bucket holds a control character (CR, LF,
	// NUL...); the router would write it into a response header
	// (X-Relay-Model) or a report. No upstream was called.
	ErrBadName = errors.New("relay: name holds a control character")
	// ErrRateLimited: every candidate upstream's limiter refused the request
	// within Config.Limits.MaxWait; no upstream was called.
	ErrRateLimited = errors.New("relay: rate limited by every upstream")
	// ErrCircuitOpen: every candidate's circuit opened while the request was
	// being routed, and no response was obtained.
	ErrCircuitOpen = errors.New("relay: every candidate's circuit is open")
	// ErrDeadlineUnreachable: the request's context deadline leaves less
	// time than every candidate's predicted median time to first token for
	// its size (each candidate's fit warm: see HedgeConfig); no upstream
	// was called, and it is not retried. A candidate whose fit is cold is
	// never counted out.
	ErrDeadlineUnreachable = errors.New("relay: no candidate can answer before the deadline")
	// ErrAttemptTimeout: an attempt got no response headers within its
	// attempt timeout (RetryConfig.AttemptTimeout, or its upstream's or
	// model's Timeouts.Attempt). It is retried like a connection error. It
	// is a timeout (net.Error).
	ErrAttemptTimeout error = &timeoutError{"relay: no response headers within the attempt timeout"}
	// ErrFirstTokenTimeout: a stream sent no content within its first-token
	// timeout (StreamConfig.FirstTokenTimeout, or its upstream's or model's
	// Timeouts.FirstToken); the router tried the next candidate.
	ErrFirstTokenTimeout = errors.New("relay: no first token within the first-token timeout")
	// ErrStreamStalled: a stream sent no byte for the idle timeout. It is a
	// timeout (net.Error).
	ErrStreamStalled error = &timeoutError{"relay: stream stalled"}
	// ErrStreamError: a 200 stream carried an error event (`data:
	// {"error":...}` in chat and completions streams; an `error` or
	// `response.failed` event in Responses streams). It appears only in
	// Report.Err: the caller reads the event's bytes as the upstream sent
	// them.
	ErrStreamError = errors.New("relay: upstream sent an error in the stream")
	// ErrStreamMalformed: a stream held for its first content sent an
	// event whose data is not valid JSON before it; the router tried the
	// next candidate, as after a connection error (see
	// StreamConfig.FailoverWindow).
	ErrStreamMalformed = errors.New("relay: upstream sent malformed data before the stream's first content")
	// ErrUpstreamStatus: the final response had a status of 400 or more.
	// The response itself is still returned to the caller with err == nil;
	// this error only appears in Report.Err.
	ErrUpstreamStatus = errors.New("relay: upstream answered with an error status")
)

// ErrInvalidHeader: the outgoing request carries a header HTTP cannot
// send (a name that is not a token, a value with CR, LF, NUL or another
// control character), so the Base refused it; the header is the caller's,
// since New refuses such headers and keys in the configuration. The
// request cannot succeed anywhere: DefaultShouldRetry does not retry it.
var ErrInvalidHeader = errors.New("relay: request header cannot be sent over HTTP")

// ErrNotUpdatable: Router.Update was given a Config whose Clock, State or
// Ledger differs from the router's; the error names the setting, and
// nothing changed. Those settings hold what the router learned: make a
// new Router to change them.
var ErrNotUpdatable = errors.New("relay: setting cannot change in an Update")

// Error describes a failed request. It wraps the cause (a sentinel above, a
// context error or a transport error).
type Error struct {
	Op         string // what failed, e.g. "read body", "send", "route", "budget"
	Upstream   string // upstream name, when one was involved
	Model      string // model sent, when known
	Budget     string // the budget that refused the request (ErrBudgetExceeded)
	StatusCode int    // upstream status, when one came
	Err        error  // the cause
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("relay: ")
	b.WriteString(e.Op)
	if e.Upstream != "" {
		b.WriteString(" upstream ")
		b.WriteString(e.Upstream)
	}
	if e.Model != "" {
		b.WriteString(" model ")
		b.WriteString(e.Model)
	}
	if e.Budget != "" {
		b.WriteString(" budget ")
		b.WriteString(e.Budget)
	}
	if e.StatusCode != 0 {
		fmt.Fprintf(&b, " status %d", e.StatusCode)
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(strings.TrimPrefix(e.Err.Error(), "relay: "))
	}
	return b.String()
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Timeout reports whether the cause is a timeout: the request's deadline
// (context.DeadlineExceeded), a transport timeout, ErrAttemptTimeout or
// ErrStreamStalled. net/http's *url.Error, os.IsTimeout and net.Error
// callers ask the error itself, not its chain: this keeps a timeout a
// timeout through the router and the SDKs' wrapping.
func (e *Error) Timeout() bool { return isTimeout(e.Err) }

// Temporary reports whether the cause says it is temporary (a deprecated
// net.Error method some callers still read).
func (e *Error) Temporary() bool { return isTemporary(e.Err) }

// isTimeout and isTemporary ask err's chain whether it is a timeout, or
// temporary.
func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

func isTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

// timeoutError is a sentinel that is a timeout.
type timeoutError struct{ msg string }

func (e *timeoutError) Error() string   { return e.msg }
func (e *timeoutError) Timeout() bool   { return true }
func (e *timeoutError) Temporary() bool { return true }

// secrets redacts API keys from text an upstream sent that the router
// copies into a report or an error: the configured keys and header values,
// and anything shaped like a key (sk-..., or a configured key prefix
// followed by key characters).
type secrets struct {
	values []string       // configured keys and header values, longest first
	shaped *regexp.Regexp // key-shaped tokens
}

func newSecrets(ups []Upstream) secrets {
	var s secrets
	prefixes := []string{"sk-", "sk_"}
	for _, u := range ups {
		if len(u.APIKey) >= 8 {
			s.values = append(s.values, u.APIKey)
		}
		s.values = append(s.values, urlSecrets(u.BaseURL)...)
		for _, vs := range u.Header {
			for _, v := range vs {
				if len(v) >= 8 {
					s.values = append(s.values, v)
				}
			}
		}
		for _, p := range u.KeyPrefixes {
			if p != "" { // (New refuses it; an empty prefix would make every word a key)
				prefixes = append(prefixes, p)
			}
		}
	}
	slices.SortFunc(s.values, func(a, b string) int { return len(b) - len(a) })
	alts := make([]string, len(prefixes))
	for i, p := range prefixes {
		alts[i] = regexp.QuoteMeta(p)
	}
	s.shaped = regexp.MustCompile(`(?:` + strings.Join(alts, "|") + `)[A-Za-z0-9_\-*.]{4,}`)
	return s
}

// urlSecrets returns what a BaseURL may carry as a secret: its user part
// and its query values (Azure's ?api-key=), those of 8 bytes or more.
func urlSecrets(raw string) []string {
	u, err := url.Parse(raw)
	if err != nil {
		return nil
	}
	var out []string
	add := func(v string) {
		if len(v) >= 8 {
			out = append(out, v, url.QueryEscape(v))
		}
	}
	if u.User != nil {
		add(u.User.Username())
		if p, ok := u.User.Password(); ok {
			add(p)
		}
	}
	for _, vs := range u.Query() {
		for _, v := range vs {
			add(v)
		}
	}
	return out
}

// redactURL returns a URL for printing: without its user part, its query
// values replaced, or "(unparsable)".
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable)"
	}
	if u.User != nil {
		u.User = url.User("redacted")
	}
	if u.RawQuery != "" {
		q := u.Query()
		for k := range q {
			q[k] = []string{"redacted"}
		}
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// redactedError is a transport error whose text has the secrets taken out
// (a Base's *url.Error names the upstream's URL, query key included); it
// is still the same error to errors.Is/As, os.IsTimeout and net.Error.
type redactedError struct {
	err error
	msg string
}

func (e *redactedError) Error() string   { return e.msg }
func (e *redactedError) Unwrap() error   { return e.err }
func (e *redactedError) Timeout() bool   { return isTimeout(e.err) }
func (e *redactedError) Temporary() bool { return isTemporary(e.err) }

// redactErr returns err with the secrets taken out of its text (those
// redact takes out), err itself when its text has none.
func (s *secrets) redactErr(err error, sent ...string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if r := s.redact(msg, sent...); r != msg {
		return &redactedError{err: err, msg: r}
	}
	return err
}

// redact returns text with every secret replaced by "[redacted]": sent,
// the values an attempt carried (see sentSecrets), then the configured
// ones and those shaped like a key.
func (s *secrets) redact(text string, sent ...string) string {
	for _, v := range sent {
		text = strings.ReplaceAll(text, v, "[redacted]")
	}
	for _, v := range s.values {
		text = strings.ReplaceAll(text, v, "[redacted]")
	}
	if s.shaped != nil {
		text = s.shaped.ReplaceAllString(text, "[redacted]")
	}
	return text
}

// minSecret is the shortest value taken for a secret: a shorter one
// would take ordinary words out of messages.
const minSecret = 8

// sentSecrets returns the secret values an outgoing request carries,
// longest first: those of its headers that carry credentials (a caller's
// own Authorization, api-key, x-api-key, x-goog-api-key... forwarded as
// they came, and an upstream's), with a credential's scheme ("Bearer ")
// taken off as well, and the values of its query parameters named like
// one (key=, api-key=, sig=...), as sent and decoded.
func sentSecrets(out *http.Request) []string {
	if out == nil {
		return nil
	}
	var vs []string
	add := func(v string) {
		if len(v) >= minSecret && !slices.Contains(vs, v) {
			vs = append(vs, v)
		}
	}
	for k, hv := range out.Header {
		if !secretName(k) {
			continue
		}
		for _, v := range hv {
			add(v)
			if _, cred, ok := strings.Cut(strings.TrimSpace(v), " "); ok {
				add(strings.TrimSpace(cred)) // "Bearer <token>", "Basic <credentials>"
			}
		}
	}
	if u := out.URL; u != nil && u.RawQuery != "" {
		for k, qv := range u.Query() {
			if !secretName(k) {
				continue
			}
			for _, v := range qv {
				add(v)
				add(url.QueryEscape(v))
			}
		}
	}
	slices.SortFunc(vs, func(a, b string) int { return len(b) - len(a) })
	return vs
}

// secretName reports whether a header or query parameter of this name
// carries a credential.
func secretName(name string) bool {
	n := strings.ToLower(name)
	for _, w := range []string{"auth", "key", "token", "secret", "password", "signature", "credential", "cookie"} {
		if strings.Contains(n, w) {
			return true
		}
	}
	return n == "sig"
}
