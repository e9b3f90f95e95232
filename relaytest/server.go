package relaytest

import (
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tokenrelay/relay/internal/prompt"
)

// Defaults of a Server's options.
const (
	DefaultReply            = "Hello from relaytest."
	DefaultCompletionTokens = 8
)

// DefaultModels are the ids GET /models lists unless WithModels says otherwise.
var DefaultModels = []string{"gpt-4o", "gpt-4o-mini", "gpt-4.1", "gpt-5", "text-embedding-3-small"}

// NameHeader is the response header that carries the name given by WithName.
const NameHeader = "X-Relaytest-Name"

// Endpoint names, as recorded in Recorded.Endpoint.
const (
	epChat        = prompt.Chat
	epResponses   = prompt.Responses
	epCompletions = prompt.Completions
	epEmbeddings  = prompt.Embeddings
	epModels      = "models"
	epModel       = "models/{id}"
)

type config struct {
	name             string
	reply            string
	completionTokens int
	latency          time.Duration
	models           []string
	azure            *azureConfig // nil: no Azure paths
	apiKey           string       // "": any key
	schedule         Schedule
}

// Option configures a Server; pass options to NewServer.
type Option func(*config)

// WithName names the server: every answer (errors included) carries the name
// in the response header X-Relaytest-Name, so a test can tell which of several
// upstreams answered.
func WithName(name string) Option { return func(c *config) { c.name = name } }

// WithReply sets the assistant text of normal answers (default
// DefaultReply). The text is cut or repeated to the completion token count;
// see Pieces.
func WithReply(text string) Option { return func(c *config) { c.reply = text } }

// WithCompletionTokens sets the completion tokens of normal answers (default
// DefaultCompletionTokens; negative counts as 0). When the request sets a
// smaller max_completion_tokens, max_tokens or max_output_tokens, that
// smaller number is used instead and chat and completions answers finish
// with "length".
func WithCompletionTokens(n int) Option {
	return func(c *config) { c.completionTokens = max(n, 0) }
}

// WithLatency sets a base delay before the response headers of every call;
// a Fault's Delay adds to it.
func WithLatency(d time.Duration) Option { return func(c *config) { c.latency = d } }

// WithModels sets the model ids listed by GET /models (default
// DefaultModels).
func WithModels(ids ...string) Option {
	return func(c *config) { c.models = slices.Clone(ids) }
}

// Schedule decides how a Server answers one call (see WithSchedule): it is
// given the call's request, its record and the fault the call took from the
// queue (Script, SetDefault; the zero Fault when none), and returns the
// fault to answer with and, optionally, a func the Server calls once the
// answer is written or the call has ended otherwise.
type Schedule func(r *http.Request, call Recorded, f Fault) (Fault, func())

// WithSchedule makes the Server pass every call to fn once the call is
// recorded and before anything is answered, and answer with the Fault fn
// returns. fn may block, for example to queue the call behind others as a
// busy upstream does; it must then end when r's context ends, returning or
// calling panic(http.ErrAbortHandler) (which aborts the call's connection
// without logging). fn must not modify call.Body. A simulated fleet of
// upstreams with queues, caches and service times is built this way (the
// repository's examples/simulate/simfleet).
func WithSchedule(fn Schedule) Option { return func(c *config) { c.schedule = fn } }

// Fault shapes the answer to one call. The zero Fault is a normal answer.
//
// The steps of a call are: wait the server's latency plus Delay; then Drop,
// or Hang, or answer Status with Body, or answer 200 with Body, or give the
// normal answer of the endpoint shaped by the usage and streaming fields.
// Header and ContentType apply to every answer that writes headers.
type Fault struct {
	// Status, when non-zero, is the answer's status code. The body is Body,
	// or else an OpenAI-shaped error {"error":{"message","type","param",
	// "code"}} that fits the status: 400 invalid_request_error, 401
	// invalid_api_key, 403 permission, 404 model_not_found, 429
	// rate_limit_exceeded, 500 server_error, 503 overloaded, and so on.
	Status int
	// Header holds extra response headers for this answer, such as
	// Retry-After, retry-after-ms, x-ratelimit-* or x-should-retry. They
	// replace headers of the same name the server would send.
	Header http.Header
	// Body is the raw response body when Status is set. With Status zero, a
	// non-empty Body is sent as is with status 200 instead of the normal
	// answer.
	Body string
	// ContentType overrides the Content-Type of the answer, for example
	// "text/event-stream" on an error body.
	ContentType string
	// Delay is a wait before the response headers. It ends early when the
	// client goes away or the server closes.
	Delay time.Duration
	// Drop hijacks the connection and closes it without writing anything:
	// the client sees EOF or a reset before any header. Note that Go's
	// http.Transport by itself retries a replayable request (a GET, or a
	// request with an Idempotency-Key header) that meets this on a reused
	// connection; the retry is a new call and takes the next fault.
	Drop bool
	// Hang never sends headers: the call ends only when the client goes
	// away or the server closes (the connection is then aborted).
	Hang bool

	// CachedTokens is reported as prompt_tokens_details.cached_tokens
	// (Responses: input_tokens_details.cached_tokens). It is part of the
	// prompt tokens and clamped to them.
	CachedTokens int
	// ReasoningTokens is reported as completion_tokens_details.reasoning_tokens
	// (Responses: output_tokens_details.reasoning_tokens). It is part of the
	// completion tokens and clamped to them; the visible text then has that
	// many fewer pieces.
	ReasoningTokens int
	// CompletionTokens, when positive, is this answer's completion tokens
	// instead of the Server's (WithCompletionTokens); the request's max
	// tokens still bound it.
	CompletionTokens int
	// NoUsage omits usage: no "usage" key in a JSON answer, no usage chunk
	// in a chat or completions stream even when stream_options.include_usage
	// asks for one, no usage in the Responses response.completed event.
	NoUsage bool

	// The fields below shape streams ("stream": true requests) only.

	// ChunkDelay is a pause before each content event after the first.
	ChunkDelay time.Duration
	// FirstTokenDelay is a pause after the headers are flushed and before
	// the first event of the stream.
	FirstTokenDelay time.Duration
	// StallAfter, when positive, stops the stream after that many data
	// events: they are flushed, then nothing more is sent until the client
	// goes away or the server closes.
	StallAfter int
	// CutAfter, when positive, aborts the connection after that many data
	// events: no [DONE], no end of the chunked body, so the client reads an
	// unexpected EOF.
	CutAfter int
	// ErrorEvent sends, right after the first content event, an error event
	// and then ends the stream normally without [DONE]: chat and completions
	// send `data: {"error":{...}}` (a server_error); Responses sends
	// `event: error` with a {"type":"error",...} payload.
	ErrorEvent bool
	// EventLines makes a chat or completions stream precede each data line
	// with an event line: `event: message` for chunks, `event: error` for
	// an error, `event: done` for [DONE]. Responses streams always carry
	// event lines.
	EventLines bool
	// ToolCall makes a chat answer a call of the function "get_weather" with
	// arguments {"city":"Paris"} (streamed in pieces) instead of text, with
	// finish_reason "tool_calls".
	ToolCall bool
	// ChunkInterval, when positive, spaces the content events of a stream
	// from the first one: the k-th comes at least k·ChunkInterval after the
	// first (after ChunkDelay too, when both are set), so the time taken to
	// write events does not add up over a long stream, as a model decoding
	// at a steady rate sends them.
	ChunkInterval time.Duration
	// EarlyError makes a stream fail before its first content: after its
	// first event (the chat role chunk, Responses' response.created; at
	// once for completions) it sends an error event shaped as Status's
	// errors for this status (429 rate_limit_exceeded, whose message asks
	// to "try again in 1s"; 500 server_error; 400 invalid_request_error...)
	// and ends without [DONE]: chat and completions send `data:
	// {"error":{...}}`, Responses an `error` event, or, with FailedEvent,
	// response.failed.
	EarlyError int
	// FailedEvent makes a Responses stream's EarlyError a response.failed
	// event, its error in response.error, instead of an error event.
	FailedEvent bool
	// Malformed makes a stream send, right before its first content event,
	// an event whose data is JSON cut short (`data: {"id":"chatcmpl-…",
	// "choices":[{"delta":{"cont`), then go on as usual.
	Malformed bool
	// ContentFilter makes the answer one a content filter stopped before
	// any output: chat and completions choices finish with
	// "content_filter" and no text (streams: the role chunk, then the
	// finish chunk); a Responses answer is "incomplete" with
	// incomplete_details.reason "content_filter" and no output (streams:
	// response.created, response.in_progress, response.incomplete). Usage
	// is as usual.
	ContentFilter bool
	// Empty makes the answer one with no output: chat and completions
	// choices finish with "stop" and no text; a Responses answer is
	// completed with no output item. Usage is as usual.
	Empty bool
}

func (f Fault) clone() Fault {
	f.Header = f.Header.Clone()
	return f
}

// Recorded is a copy of one request the Server received.
type Recorded struct {
	Method   string
	Path     string
	RawQuery string
	Header   http.Header
	Body     []byte
	// Model is the body's "model", "" when absent or the body is not JSON.
	Model string
	// Stream is the body's "stream".
	Stream bool
	// Endpoint is the recognised endpoint: "chat/completions", "responses",
	// "completions", "embeddings", "models", "models/{id}", or "" when the
	// path or method matches none.
	Endpoint string
	// Deployment is the deployment an Azure deployment path names
	// (WithAzure), "" for other paths; Model is then the deployment too.
	Deployment string
}

// Server is a fake OpenAI-compatible API on loopback, started by NewServer.
// Each call takes the next Fault queued by Script, or the default fault
// (SetDefault) when the queue is empty, and is recorded before it is
// answered. A Server is safe for concurrent use by multiple goroutines.
type Server struct {
	// URL is the base URL of the API, ending in "/v1", such as
	// "http://127.0.0.1:1234/v1". Endpoints are recognised by their exact
	// path, as the real API does: "/v1/chat/completions" is one, but
	// "/v1/chat/completions/chat/completions" (a BaseURL that already named
	// the endpoint) or "/openai/chat/completions" is answered 404.
	URL string
	// AzureURL is the root of the server, such as "http://127.0.0.1:1234":
	// the resource endpoint of the Azure API it answers with WithAzure.
	AzureURL string

	ts        *httptest.Server
	cfg       config
	closing   chan struct{}
	closeOnce sync.Once
	seq       atomic.Int64

	mu    sync.Mutex
	queue []Fault
	def   Fault
	recs  []Recorded
}

// NewServer starts a Server. Call Close when done.
func NewServer(opts ...Option) *Server {
	s := &Server{
		cfg: config{
			reply:            DefaultReply,
			completionTokens: DefaultCompletionTokens,
			models:           slices.Clone(DefaultModels),
		},
		closing: make(chan struct{}),
	}
	for _, o := range opts {
		o(&s.cfg)
	}
	s.ts = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	s.ts.Config.ErrorLog = log.New(io.Discard, "", 0)
	s.ts.Start()
	s.URL = s.ts.URL + "/v1"
	s.AzureURL = s.ts.URL
	return s
}

// Close shuts the server down and waits for its handlers to end. Handlers
// that hang, stall or wait are woken first and abort their connections, so
// Close does not wait for them. Close may be called more than once.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.closing)
		s.ts.CloseClientConnections()
		s.ts.Close()
	})
}

// Client returns an *http.Client for the server, whose transport is closed
// with the server.
func (s *Server) Client() *http.Client { return s.ts.Client() }

// Script appends faults to the queue: each incoming call, whatever its
// endpoint, takes the next queued fault.
func (s *Server) Script(f ...Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, x := range f {
		s.queue = append(s.queue, x.clone())
	}
}

// SetDefault sets the fault for calls that find the queue empty. The zero
// Fault gives normal answers.
func (s *Server) SetDefault(f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.def = f.clone()
}

// Pending returns the number of scripted faults not yet taken.
func (s *Server) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue)
}

// Requests returns copies of every request received since NewServer or
// Reset, in arrival order.
func (s *Server) Requests() []Recorded {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Recorded, len(s.recs))
	for i, r := range s.recs {
		r.Header = r.Header.Clone()
		r.Body = slices.Clone(r.Body)
		out[i] = r
	}
	return out
}

// Calls returns the number of requests received since NewServer or Reset.
func (s *Server) Calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.recs)
}

// Reset clears the fault queue, the default fault and the records.
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queue, s.def, s.recs = nil, Fault{}, nil
}

// record stores the request and takes its fault in one step, so the i-th
// recorded request is the one that took the i-th fault.
func (s *Server) record(rec Recorded) Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recs = append(s.recs, rec)
	if len(s.queue) > 0 {
		f := s.queue[0]
		s.queue[0] = Fault{}
		s.queue = s.queue[1:]
		return f
	}
	return s.def
}

// apiRoot is the path of the API root, the path of Server.URL.
const apiRoot = "/v1/"

// endpointOf recognises an endpoint by method and exact path, as the real
// API does: "/v1/chat/completions", not "/v1/chat/completions/" nor a
// BaseURL's mistake such as "/v1/chat/completions/chat/completions".
func endpointOf(method, path string) string {
	rest, ok := strings.CutPrefix(path, apiRoot)
	if !ok {
		return ""
	}
	switch method {
	case http.MethodPost:
		switch rest {
		case epChat, epResponses, epCompletions, epEmbeddings:
			return rest
		}
	case http.MethodGet:
		if rest == epModels {
			return epModels
		}
		if id, ok := strings.CutPrefix(rest, "models/"); ok && id != "" && !strings.Contains(id, "/") {
			return epModel
		}
	}
	return ""
}

// serve is the handler of every call. Handlers end a call that must stop
// early (client gone, server closing, CutAfter) with
// panic(http.ErrAbortHandler), which net/http turns into an aborted
// connection without logging.
func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	ep := endpointOf(r.Method, r.URL.Path)
	var az azureCall
	isAzure := false
	if s.cfg.azure != nil {
		if az, isAzure = azureOf(r.Method, r.URL.Path); isAzure {
			ep = az.ep
		}
	}
	valid := len(body) > 0 && gjson.ValidBytes(body)
	rec := Recorded{
		Method:     r.Method,
		Path:       r.URL.Path,
		RawQuery:   r.URL.RawQuery,
		Header:     r.Header.Clone(),
		Body:       body,
		Endpoint:   ep,
		Deployment: az.deployment,
	}
	if valid {
		rec.Model = gjson.GetBytes(body, "model").Str
		rec.Stream = gjson.GetBytes(body, "stream").Bool()
	}
	if az.deployment != "" {
		rec.Model = az.deployment // (Azure ignores the body's)
	}
	if no := s.refuse(r, az, isAzure); no != nil {
		s.refused(w, rec, no)
		return
	}
	f := s.record(rec)
	if s.cfg.schedule != nil {
		var done func()
		f, done = s.cfg.schedule(r, rec, f)
		if done != nil {
			defer done()
		}
	}

	ctx := r.Context()
	s.sleep(ctx, s.cfg.latency+f.Delay)
	switch {
	case f.Drop:
		s.drop(w)
		return
	case f.Hang:
		s.waitEnd(ctx)
	}

	h := w.Header()
	n := s.seq.Add(1)
	h.Set("X-Request-Id", "req_relaytest_"+itoa(n))
	if s.cfg.name != "" {
		h.Set(NameHeader, s.cfg.name)
	}
	for k, vs := range f.Header {
		h[k] = slices.Clone(vs)
	}

	a := &answer{s: s, w: w, r: r, f: f, n: n, body: body}
	switch {
	case f.Status != 0:
		if f.Body != "" {
			a.write(f.Status, "application/json", []byte(f.Body))
		} else {
			a.write(f.Status, "application/json", errorBody(f.Status, rec.Model, r))
		}
	case f.Body != "":
		a.write(http.StatusOK, "application/json", []byte(f.Body))
	case ep == "":
		a.write(http.StatusNotFound, "application/json", errorJSON(
			"Invalid URL ("+r.Method+" "+r.URL.Path+")", "invalid_request_error", "", ""))
	case ep == epModels:
		a.models()
	case ep == epModel:
		a.model(r.URL.Path[strings.LastIndex(strings.TrimSuffix(r.URL.Path, "/"), "/")+1:])
	case !valid:
		a.write(http.StatusBadRequest, "application/json", errorJSON(
			"We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON. If you have trouble figuring out how to fix this, please contact us through our help center at help.openai.com.)",
			"invalid_request_error", "", ""))
	default:
		a.answer(ep, gjson.ParseBytes(body))
	}
}

// sleep waits d. It aborts the call when the client goes away or the server
// closes first.
func (s *Server) sleep(ctx interface{ Done() <-chan struct{} }, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		panic(http.ErrAbortHandler)
	case <-s.closing:
		panic(http.ErrAbortHandler)
	}
}

// waitEnd blocks until the client goes away or the server closes, then
// aborts the call.
func (s *Server) waitEnd(ctx interface{ Done() <-chan struct{} }) {
	select {
	case <-ctx.Done():
	case <-s.closing:
	}
	panic(http.ErrAbortHandler)
}

// drop closes the connection without writing anything.
func (s *Server) drop(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	conn.Close()
}

// IsZero reports whether f is the zero Fault (a normal answer): a Schedule
// tells by it whether a test scripted a fault for the call.
func (f Fault) IsZero() bool {
	return f.Status == 0 && len(f.Header) == 0 && f.Body == "" && f.ContentType == "" && f.Delay == 0 && !f.Drop && !f.Hang &&
		f.CachedTokens == 0 && f.ReasoningTokens == 0 && !f.NoUsage && f.ChunkDelay == 0 && f.FirstTokenDelay == 0 &&
		f.StallAfter == 0 && f.CutAfter == 0 && !f.ErrorEvent && !f.EventLines && !f.ToolCall &&
		f.ChunkInterval == 0 && f.CompletionTokens == 0 &&
		f.EarlyError == 0 && !f.FailedEvent && !f.Malformed && !f.ContentFilter && !f.Empty
}
