package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relayprom"
)

// config configures a gateway.
type config struct {
	// Upstreams are the router's upstreams; at least one.
	Upstreams []relay.Upstream
	// Policy routes every request; nil keeps the requested model.
	Policy relay.Policy
	// Model is the requested model of a /v1/chat call, and of a
	// /v1/chat/completions call whose body names none.
	Model string
	// MaxBodyBytes bounds a request body; if 0, 1 MiB. A larger body is
	// answered 400 without calling any upstream.
	MaxBodyBytes int64
	// Base sends the router's requests; nil: http.DefaultTransport.
	Base http.RoundTripper
	// Retry is the router's retry configuration.
	Retry relay.RetryConfig
	// OnReport, when set, sees every report (for logs), as relay.Config's.
	OnReport func(relay.Report)
	// ErrorLog receives the proxy's errors (e.g. a client that left in the
	// middle of a stream); nil discards them.
	ErrorLog *log.Logger
}

// IDHeader carries the gateway's request ID: the gateway sets it on every
// request it sends through the router (dropping any the client sent) and on
// its answer.
const IDHeader = "X-Gateway-Request-Id"

// idKey is the context key of the gateway's request ID.
type idKey struct{}

// gateway is the HTTP handler: OpenAI-compatible POST /v1/chat/completions
// (proxied through the router, streams included) and the simple POST
// /v1/chat. It is safe for concurrent use.
//
// Correlation: relay.Config.OnReport is one hook for the whole router. The
// gateway gives each request an ID, in IDHeader and in a context value; the
// report carries the request's context (Report.Context), so the hook hands
// the report to the request's waiting channel, looked up in a sync.Map.
// Since OnReport runs synchronously when the response body reaches EOF or is
// closed, the report is in the channel once the handler has read and closed
// the body.
type gateway struct {
	cfg     config
	router  *relay.Router
	proxy   *httputil.ReverseProxy
	mux     *http.ServeMux
	prefix  string
	seq     atomic.Uint64
	pending sync.Map // request ID → chan relay.Report (buffered, 1)
}

// policyModels are the models the gateway's requests may go to: its default
// model and those a ClusterPolicy names.
func policyModels(cfg config) []string {
	models := []string{cfg.Model}
	if p, ok := cfg.Policy.(relay.ClusterPolicy); ok {
		models = append(models, p.Fast, p.Cheap)
		models = append(models, p.Fallbacks...)
	}
	return models
}

// newGateway builds the gateway's handler and its router.
func newGateway(cfg config) (*gateway, error) {
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	if cfg.Model == "" {
		return nil, errors.New("gateway: no default model")
	}
	if cfg.ErrorLog == nil {
		cfg.ErrorLog = log.New(io.Discard, "", 0)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	g := &gateway{cfg: cfg, prefix: "gw-" + hex.EncodeToString(b[:]) + "-", mux: http.NewServeMux()}
	// Prometheus metrics of every call, on GET /metrics; labels are bounded
	// to the configured upstreams and models.
	prom := relayprom.New(relayprom.WithUpstreams(cfg.Upstreams...), relayprom.WithModels(policyModels(cfg)...))
	reg := prometheus.NewRegistry()
	reg.MustRegister(prom)
	r, err := relay.New(relay.Config{
		Upstreams:    cfg.Upstreams,
		Policy:       cfg.Policy,
		Base:         cfg.Base,
		Retry:        cfg.Retry,
		MaxBodyBytes: cfg.MaxBodyBytes,
		OnReport:     g.onReport,
		Hooks:        prom.Hooks(),
	})
	if err != nil {
		return nil, err
	}
	g.router = r
	g.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			// The router picks the upstream by the path's endpoint suffix;
			// the host is a placeholder it replaces.
			pr.Out.URL = &url.URL{Scheme: "http", Host: "relay.internal", Path: "/v1/chat/completions"}
			pr.Out.Host = ""
			pr.Out.Header.Del("Authorization") // the router sets each upstream's key
			pr.Out.Header.Set(IDHeader, pr.In.Header.Get(IDHeader))
		},
		Transport:     r,
		FlushInterval: -1, // every write of a stream reaches the client at once
		ErrorLog:      cfg.ErrorLog,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			writeRouterError(w, err)
		},
	}
	g.mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	g.mux.HandleFunc("POST /v1/chat/completions", g.chatCompletions)
	g.mux.HandleFunc("POST /v1/chat", g.chat)
	g.mux.HandleFunc("/v1/chat/completions", only(http.MethodPost))
	g.mux.HandleFunc("/v1/chat", only(http.MethodPost))
	g.mux.HandleFunc("/metrics", only(http.MethodGet))
	g.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("Unknown request URL: %s %s.", r.Method, r.URL.Path), "", "unknown_url")
	})
	return g, nil
}

func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := g.prefix + strconv.FormatUint(g.seq.Add(1), 10)
	r.Header.Set(IDHeader, id) // a client's own value is replaced
	w.Header().Set(IDHeader, id)
	g.mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), idKey{}, id)))
}

// Close releases the router's idle connections.
func (g *gateway) Close() { g.router.CloseIdleConnections() }

func (g *gateway) onReport(rep relay.Report) {
	if id, ok := rep.Context.Value(idKey{}).(string); ok {
		if ch, ok := g.pending.LoadAndDelete(id); ok {
			ch.(chan relay.Report) <- rep // buffered; one report per request
		}
	}
	if g.cfg.OnReport != nil {
		g.cfg.OnReport(rep)
	}
}

// chatCompletions validates an OpenAI chat-completions body and proxies it
// through the router; answers, streams and upstream errors pass through.
func (g *gateway) chatCompletions(w http.ResponseWriter, r *http.Request) {
	body, ok := g.readBody(w, r)
	if !ok {
		return
	}
	if e := validateCompletions(body); e != nil {
		e.write(w)
		return
	}
	if !gjson.GetBytes(body, "model").Exists() {
		body, _ = sjson.SetBytes(body, "model", g.cfg.Model)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.Header.Del("Content-Length")
	g.proxy.ServeHTTP(w, r)
}

// chatRequest is the body of POST /v1/chat.
type chatRequest struct {
	Model       string            `json:"model,omitempty"`
	Messages    []json.RawMessage `json:"messages"`
	Temperature *float64          `json:"temperature,omitempty"`
	MaxTokens   *int              `json:"max_tokens,omitempty"`
}

// chatResponse is the answer of POST /v1/chat.
type chatResponse struct {
	Model   string  `json:"model"`   // the model that answered
	Tokens  int     `json:"tokens"`  // prompt + completion, as billed
	Ms      float64 `json:"ms"`      // the router's latency
	Cost    float64 `json:"cost"`    // USD, after the upstream's price factor
	Content string  `json:"content"` // the assistant's text
}

// chat answers POST /v1/chat: {messages, temperature, max_tokens} in,
// {model, tokens, ms, cost, content} out, routed by the policy.
func (g *gateway) chat(w http.ResponseWriter, r *http.Request) {
	body, ok := g.readBody(w, r)
	if !ok {
		return
	}
	if e := validateChat(body); e != nil {
		e.write(w)
		return
	}
	var in chatRequest
	if err := json.Unmarshal(body, &in); err != nil { // validated: cannot fail
		writeError(w, http.StatusBadRequest, err.Error(), "", "invalid_json")
		return
	}
	if in.Model == "" {
		in.Model = g.cfg.Model
	}
	out, _ := json.Marshal(in)

	id := r.Header.Get(IDHeader)
	ch := make(chan relay.Report, 1)
	g.pending.Store(id, ch)
	defer g.pending.Delete(id)

	req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, "http://relay.internal/v1/chat/completions", bytes.NewReader(out))
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error(), "", "internal_error")
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(IDHeader, id)
	resp, err := g.router.RoundTrip(req)
	if err != nil {
		writeRouterError(w, err)
		return
	}
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	resp.Body.Close() // the report is sent by now
	if err != nil {
		writeRouterError(w, err)
		return
	}
	if resp.StatusCode != http.StatusOK {
		// The upstream's own error, OpenAI-shaped, passes through.
		for _, k := range []string{"Content-Type", "Retry-After", "Retry-After-Ms"} {
			if v := resp.Header.Get(k); v != "" {
				w.Header().Set(k, v) // (a 429's wait, for the client to honour)
			}
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(answer)
		return
	}
	res := chatResponse{Content: gjson.GetBytes(answer, "choices.0.message.content").Str}
	select {
	case rep := <-ch:
		res.Model = rep.Model
		res.Tokens = rep.Usage.PromptTokens + rep.Usage.CompletionTokens
		res.Ms = math.Round(float64(rep.Latency)/1e4) / 100
		res.Cost = rep.CostUSD
	default:
		// Not reached: the router reports before Close returns. Fall back
		// on the answer itself, unpriced.
		res.Model = gjson.GetBytes(answer, "model").Str
		res.Tokens = int(gjson.GetBytes(answer, "usage.total_tokens").Int())
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(res)
}

// readBody reads the request body, at most MaxBodyBytes; on failure it
// answers 400 and returns false.
func (g *gateway) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, g.cfg.MaxBodyBytes))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		writeError(w, http.StatusBadRequest,
			fmt.Sprintf("Request body too large: the limit is %d bytes.", g.cfg.MaxBodyBytes), "", "request_too_large")
		return nil, false
	case err != nil:
		writeError(w, http.StatusBadRequest, "Could not read the request body.", "", "invalid_body")
		return nil, false
	}
	return b, true
}

// apiError is an OpenAI-shaped error answer.
type apiError struct {
	status               int
	message, param, code string
}

func (e *apiError) write(w http.ResponseWriter) { writeError(w, e.status, e.message, e.param, e.code) }

func invalid(param, code, format string, a ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, message: fmt.Sprintf(format, a...), param: param, code: code}
}

// writeError writes {"error":{"message","type","param","code"}}; param and
// code are null when empty. The type follows the status.
func writeError(w http.ResponseWriter, status int, message, param, code string) {
	typ := "invalid_request_error"
	switch {
	case status == http.StatusTooManyRequests:
		typ = "rate_limit_error"
	case status >= 500:
		typ = "api_error"
	}
	var e struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	e.Error.Message, e.Error.Type = message, typ
	if param != "" {
		e.Error.Param = &param
	}
	if code != "" {
		e.Error.Code = &code
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Del("Content-Length")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(e)
}

// only answers 405 to a request for a path served for method alone.
func only(method string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", method)
		writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("Method %s is not allowed: use %s.", r.Method, method), "", "method_not_allowed")
	}
}

// writeRouterError answers a request the router could not get any upstream
// response for. Router errors name no API key.
func writeRouterError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, relay.ErrNoUpstream):
		writeError(w, http.StatusNotFound, err.Error(), "model", "model_not_found")
	case errors.Is(err, relay.ErrRateLimited):
		writeError(w, http.StatusTooManyRequests, err.Error(), "", "rate_limit_exceeded")
	case errors.Is(err, relay.ErrBodyTooLarge):
		writeError(w, http.StatusBadRequest, err.Error(), "", "request_too_large")
	case errors.Is(err, relay.ErrContextWindow):
		writeError(w, http.StatusBadRequest, err.Error(), "messages", "context_length_exceeded")
	case errors.Is(err, relay.ErrBudgetExceeded):
		writeError(w, http.StatusTooManyRequests, err.Error(), "", "budget_exceeded")
	case errors.Is(err, relay.ErrNoTaggedUpstream):
		writeError(w, http.StatusNotFound, err.Error(), "", "no_tagged_upstream")
	case errors.Is(err, context.Canceled):
		writeError(w, 499, "The client closed the request.", "", "client_closed_request")
	default:
		writeError(w, http.StatusBadGateway, err.Error(), "", "upstream_unavailable")
	}
}

// Validation, in the spirit of the API's own 400s: the first problem found,
// named by its parameter.

var roles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true, "function": true}

func parseObject(body []byte) (gjson.Result, *apiError) {
	if len(bytes.TrimSpace(body)) == 0 {
		return gjson.Result{}, invalid("", "invalid_json", "The request body is empty: send a JSON object.")
	}
	if !gjson.ValidBytes(body) {
		return gjson.Result{}, invalid("", "invalid_json", "We could not parse the JSON body of your request. The OpenAI API expects a JSON payload.")
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return root, invalid("", "invalid_json", "The request body must be a JSON object.")
	}
	return root, nil
}

func validateMessages(root gjson.Result) *apiError {
	msgs := root.Get("messages")
	switch {
	case !msgs.Exists():
		return invalid("messages", "missing_required_parameter", "Missing required parameter: 'messages'.")
	case !msgs.IsArray():
		return invalid("messages", "invalid_type", "Invalid type for 'messages': expected an array, but got %s.", typeName(msgs))
	case len(msgs.Array()) == 0:
		return invalid("messages", "empty_array", "Invalid 'messages': empty array. Expected an array with minimum length 1.")
	}
	for i, m := range msgs.Array() {
		p := fmt.Sprintf("messages[%d]", i)
		if !m.IsObject() {
			return invalid(p, "invalid_type", "Invalid type for '%s': expected an object, but got %s.", p, typeName(m))
		}
		role := m.Get("role")
		if role.Type != gjson.String {
			return invalid(p+".role", "invalid_type", "Invalid type for '%s.role': expected a string, but got %s.", p, typeName(role))
		}
		if !roles[role.Str] {
			return invalid(p+".role", "invalid_value", "Invalid value for '%s.role': %q is not one of system, developer, user, assistant, tool.", p, role.Str)
		}
		c := m.Get("content")
		if c.Exists() && c.Type != gjson.String && c.Type != gjson.Null && !c.IsArray() {
			return invalid(p+".content", "invalid_type", "Invalid type for '%s.content': expected a string or an array, but got %s.", p, typeName(c))
		}
	}
	return nil
}

func validateNumbers(root gjson.Result) *apiError {
	if t := root.Get("temperature"); t.Exists() {
		if t.Type != gjson.Number {
			return invalid("temperature", "invalid_type", "Invalid type for 'temperature': expected a number, but got %s.", typeName(t))
		}
		if t.Num < 0 || t.Num > 2 {
			return invalid("temperature", "decimal_out_of_range", "Invalid 'temperature': %g is outside [0, 2].", t.Num)
		}
	}
	for _, k := range []string{"max_tokens", "max_completion_tokens"} {
		if t := root.Get(k); t.Exists() {
			if t.Type != gjson.Number || t.Num != math.Trunc(t.Num) {
				return invalid(k, "invalid_type", "Invalid type for '%s': expected an integer, but got %s.", k, typeName(t))
			}
			if t.Num < 1 || t.Num > 1<<24 {
				return invalid(k, "integer_out_of_range", "Invalid '%s': %g is out of range; it must be at least 1.", k, t.Num)
			}
		}
	}
	return nil
}

func validateModel(root gjson.Result) *apiError {
	if m := root.Get("model"); m.Exists() && (m.Type != gjson.String || m.Str == "") {
		return invalid("model", "invalid_type", "Invalid type for 'model': expected a non-empty string, but got %s.", typeName(m))
	}
	return nil
}

// validateCompletions checks a chat-completions body: a JSON object with a
// non-empty messages array of role-bearing objects; model, stream,
// temperature and max tokens of the right types. Other fields pass through
// unchecked.
func validateCompletions(body []byte) *apiError {
	root, e := parseObject(body)
	if e != nil {
		return e
	}
	if e := validateModel(root); e != nil {
		return e
	}
	if e := validateMessages(root); e != nil {
		return e
	}
	if s := root.Get("stream"); s.Exists() && s.Type != gjson.True && s.Type != gjson.False {
		return invalid("stream", "invalid_type", "Invalid type for 'stream': expected a boolean, but got %s.", typeName(s))
	}
	return validateNumbers(root)
}

// validateChat checks a /v1/chat body: messages (required), temperature,
// max_tokens and model (optional), nothing else.
func validateChat(body []byte) *apiError {
	root, e := parseObject(body)
	if e != nil {
		return e
	}
	var unknown string
	root.ForEach(func(k, _ gjson.Result) bool {
		switch k.Str {
		case "messages", "temperature", "max_tokens", "model":
			return true
		}
		unknown = k.Str
		return false
	})
	if unknown != "" {
		return invalid(unknown, "unknown_parameter", "Unrecognized request argument supplied: %s. /v1/chat takes messages, temperature, max_tokens and model.", unknown)
	}
	if e := validateModel(root); e != nil {
		return e
	}
	if e := validateMessages(root); e != nil {
		return e
	}
	return validateNumbers(root)
}

func typeName(r gjson.Result) string {
	switch {
	case !r.Exists():
		return "nothing"
	case r.Type == gjson.Null:
		return "null"
	case r.Type == gjson.String:
		return "a string"
	case r.Type == gjson.Number:
		return "a number"
	case r.Type == gjson.True || r.Type == gjson.False:
		return "a boolean"
	case r.IsArray():
		return "an array"
	}
	return "an object"
}
