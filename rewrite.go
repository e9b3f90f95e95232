package relay

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/tokenrelay/relay/internal/jsonscan"
	"github.com/tokenrelay/relay/internal/prompt"
)

// Every edit of the outgoing request is here: the URL (the upstream's
// BaseURL, the endpoint or path, on Azure the deployment and api-version,
// the query strings), Authorization (or Azure's Api-Key), the upstream's
// headers, Accept-Encoding (removed), and the body's model (under the
// upstream's name for it), body tags, prompt_cache_key and
// stream_options. The caller's request is never
// modified: each attempt works on its own copy.

// outgoing builds the request for one attempt on a copy of the caller's.
func (t *trip) outgoing(ctx context.Context, cand candidate, ob outBody) *http.Request {
	body := ob.b
	req := t.req
	// A shallow copy, as Request.Clone makes but for the URL, replaced
	// below, and the header, built by outHeader: the rest (trailer,
	// transfer encoding) is only read.
	out := req.WithContext(ctx)
	var u url.URL
	if ep := t.c.req.Endpoint; ep != "" {
		u = cand.up.endpointURL(ep, cand.up.sentName(cand.model), req.URL.RawQuery)
	} else {
		rawRest := ""
		if req.URL.RawPath != "" {
			// A path the caller escaped (a model id "org%2Fname" in
			// /v1/models/{model}) goes out escaped as the caller wrote it.
			rawRest = afterV1(req.URL.EscapedPath())
		}
		u = cand.up.pathURL(afterV1(req.URL.Path), rawRest, req.URL.RawQuery)
	}
	out.URL = &u
	out.Host = ""
	out.Header = outHeader(req.Header, cand.up)
	if body == nil {
		out.Body, out.GetBody, out.ContentLength = nil, nil, 0
		return out
	}
	out.ContentLength = int64(len(body))
	rb := &reqBody{b: body}
	rb.Reset(body)
	out.Body, out.GetBody = rb, rb.again
	return out
}

// outHeader is the header of a request to up: the caller's, without
// Accept-Encoding (the router reads every answer: its Base negotiates the
// content coding, as http.Transport does, asking for gzip and
// decompressing), with up's Authorization and header values. It is made
// in two allocations, and shares no slice with the caller's header or
// up's configuration (a Base may add to them).
func outHeader(in http.Header, up *upstream) http.Header {
	extra := up.cfg.Header
	n := 0
	for _, vs := range in {
		n += len(vs)
	}
	for _, vs := range extra {
		n += len(vs)
	}
	h := make(http.Header, len(in)+len(extra)+1)
	all := make([]string, 0, n+1)
	add := func(k string, vs []string) {
		if vs == nil {
			h[k] = nil
			return
		}
		all = append(all, vs...)
		h[k] = all[len(all)-len(vs) : len(all) : len(all)]
	}
	for k, vs := range in {
		switch ck := http.CanonicalHeaderKey(k); {
		case ck == "Accept-Encoding", up.auth != nil && (ck == "Authorization" || ck == up.authHeader), extra[ck] != nil:
			// (compared canonically: a caller's header map set by index,
			// "authorization", must not travel beside the upstream's key)
			continue
		}
		add(k, vs)
	}
	if up.auth != nil {
		add(up.authHeader, []string{up.auth()})
	}
	for k, vs := range extra {
		add(k, vs)
	}
	return h
}

// reqBody is an outgoing request's body, and its GetBody, in one
// allocation.
type reqBody struct {
	bytes.Reader
	b []byte
}

func (*reqBody) Close() error { return nil }

func (r *reqBody) again() (io.ReadCloser, error) {
	return &reqBody{Reader: *bytes.NewReader(r.b), b: r.b}, nil
}

// knownEndpoints are the endpoints whose URL path on each upstream is
// made once (upstream.paths).
var knownEndpoints = [...]string{prompt.Chat, prompt.Responses, prompt.Completions, prompt.Embeddings}

// pathTo returns the URL path of endpoint ep on up (not Azure).
func (up *upstream) pathTo(ep string) string {
	for i, k := range knownEndpoints {
		if ep == k {
			return up.paths[i]
		}
	}
	return up.base.Path + "/" + ep
}

// endpointURL is the URL of a call to endpoint ep on up for the model up
// names name, with the caller's query: BaseURL + "/" + ep; on Azure,
// BaseURL/openai/deployments/{name}/{ep} for the endpoints served by
// deployments, else BaseURL/openai/{ep}, with the api-version.
func (up *upstream) endpointURL(ep, name, query string) url.URL {
	u := *up.base
	switch {
	case up.azure == "":
		u.Path = up.pathTo(ep)
	case name != "" && deploymentEndpoint(ep):
		// (name is a deploymentName, which New and serves checked: it
		// needs no escaping and has no dot segment)
		u.Path = up.base.Path + "/openai/deployments/" + name + "/" + ep
	default:
		u.Path = up.base.Path + "/openai/" + ep
	}
	u.RawPath = ""
	u.RawQuery = up.query(query)
	return u
}

// pathURL is the URL of a call to another path on up: rest, what follows
// the caller's "/v1/" (rawRest its escaped form, when the caller escaped
// it), appended to BaseURL (on Azure, to BaseURL/openai, with the
// api-version), with the caller's query.
func (up *upstream) pathURL(rest, rawRest, query string) url.URL {
	u := *up.base
	prefix := "/"
	if up.azure != "" {
		prefix = "/openai/"
	}
	u.Path = up.base.Path + prefix + rest
	u.RawPath = ""
	if rawRest != "" {
		u.RawPath = up.base.EscapedPath() + prefix + rawRest
	}
	u.RawQuery = up.query(query)
	return u
}

// query is the query of a call to up: the BaseURL's own (e.g. a key),
// then the Azure api-version, then the caller's.
func (up *upstream) query(caller string) string {
	q := up.base.RawQuery
	if up.azure != "" {
		q = joinQuery(q, "api-version="+url.QueryEscape(up.azure))
	}
	return joinQuery(q, caller)
}

// joinQuery joins two query strings.
func joinQuery(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "&" + b
}

// afterV1 is what follows a path's "/v1/" (or the whole path when it has
// none), without leading slashes: appended to a BaseURL without a path, it
// must not start with "//", which a server may read as another host.
func afterV1(p string) string {
	if i := strings.Index(p, "/v1/"); i >= 0 {
		p = p[i+len("/v1/"):]
	}
	return strings.TrimLeft(p, "/")
}

// outBody is the body of one attempt, and whether the router added
// stream_options.include_usage to it, so that the stream must hide the
// usage chunk the caller did not ask for.
type outBody struct {
	b        []byte
	injected bool
}

// bodyFor returns the body to send to cand: the caller's bytes, with, when
// the body is a JSON object, the model, the upstream's body tags, the prompt
// cache key and the stream usage option set in place, in one copy (none when
// nothing changes).
func (t *trip) bodyFor(cand candidate) outBody {
	if !t.c.json {
		return outBody{b: t.body}
	}
	s := &t.r.s
	var buf [8]topSet
	sets := buf[:0]
	if t.clamp != nil {
		sets = t.clamp.appendSets(sets, t.c.req.Endpoint)
	}
	if name := cand.up.sentName(cand.model); name != "" && name != t.c.req.Model {
		sets = append(sets, topSet{key: "model", raw: gjson.AppendJSONString(nil, name)})
	}
	for _, tag := range cand.up.tags {
		sets = append(sets, topSet{key: tag.key, raw: tag.raw})
	}
	if s.cacheKey && t.key != 0 {
		sets = append(sets, topSet{key: "prompt_cache_key", raw: gjson.AppendJSONString(nil, cacheKeyString(t.key)), ifAbsent: true})
	}
	usage := -1
	if t.c.req.Stream && s.stream.injectUsage && wantsStreamUsage(t.c.req.Endpoint) {
		usage = len(sets)
		sets = append(sets, topSet{key: "stream_options", raw: []byte(`{"include_usage":true}`), ifAbsent: true})
	}
	if len(sets) == 0 || len(sets) > 64 {
		return outBody{b: t.body}
	}
	b, found := editTop(t.body, sets)
	switch {
	case usage < 0:
		return outBody{b: b}
	case found&(1<<usage) == 0:
		return outBody{b: b, injected: true}
	}
	b, injected := t.injectStreamUsage(b) // stream_options exists: set the one field in it
	return outBody{b: b, injected: injected}
}

// wantsStreamUsage reports whether an endpoint's streams carry usage only
// when asked (stream_options.include_usage); the Responses API always sends
// it in response.completed.
func wantsStreamUsage(endpoint string) bool {
	return endpoint == EndpointChat || endpoint == EndpointCompletions
}

// injectStreamUsage returns body with stream_options.include_usage set when
// the request is a chat or completions stream that did not ask for usage,
// and whether it did so.
func (t *trip) injectStreamUsage(body []byte) ([]byte, bool) {
	if !wantsStreamUsage(t.c.req.Endpoint) {
		return body, false
	}
	if string(lastMember(lastMember(body, "stream_options"), "include_usage")) == "true" {
		// The caller asked for it, in the member an upstream reads: the
		// last of repeated ones, as encoding/json and Python's json do.
		return body, false
	}
	nb, err := sjson.SetBytes(body, "stream_options.include_usage", true)
	if err != nil || !jsonscan.Valid(nb) {
		return body, false
	}
	return nb, true
}

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
	type span struct{ start, end, set int }
	var spansBuf [8]span
	spans := spansBuf[:0]
	empty := true
	var keyBuf [32]byte
	jsonscan.Each(body, 0, func(k, v []byte) bool {
		empty = false
		if bytes.IndexByte(k, '\\') >= 0 { // a key spelled with escapes
			k = jsonscan.AppendUnescaped(keyBuf[:0], k, len(k))
		}
		for i := range sets {
			if string(k) == sets[i].key && firstSet(sets, i) { // every occurrence, should a key repeat
				found |= 1 << i
				if !sets[i].ifAbsent {
					start := cap(body) - cap(v) // v is a slice of body: its offset
					spans = append(spans, span{start, start + len(v), i})
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
	for _, sp := range spans { // in document order
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

// lastMember returns the raw value of the last member named key of the
// JSON object obj, "" when it has none.
func lastMember[T jsonscan.Text](obj T, key string) T {
	var v T
	jsonscan.Each(obj, 0, func(k, x T) bool {
		if string(k) == key {
			v = x
		}
		return true
	})
	return v
}

// What the router writes is checked before it is written. A key never
// leaves its BaseURL: a request path that a server could resolve outside
// the BaseURL's path is refused (checkURL). No header value the router
// writes carries a control character: the names that go into headers are
// checked per request (nameErr, checkRouteNames) and in New (checkWritten).

// maxDecodes is how many times dotSegments percent-decodes a path (a proxy
// and the server behind it may each decode once) before it refuses one
// that still decodes further.
const maxDecodes = 3

// checkURL refuses a request URL that could take the upstream's key
// outside its BaseURL (ErrBadPath): a "." or ".." segment in its path,
// however spelled (see dotSegments), in the decoded, raw or opaque form;
// or a query with a byte that could end the request line's target.
func checkURL(u *url.URL) error {
	for _, p := range [...]string{u.Path, u.RawPath, u.Opaque} {
		if dotSegments(p) {
			return &Error{Op: "read request", Err: fmt.Errorf("%w: path %q has a dot segment", ErrBadPath, p)}
		}
	}
	if !queryText(u.RawQuery) {
		return &Error{Op: "read request", Err: fmt.Errorf("%w: query %q has a space, '#' or a control character", ErrBadPath, u.RawQuery)}
	}
	return nil
}

// dotSegments reports whether a server could read path p as having a "."
// or ".." segment: segments end at '/' and '\', a segment's parameters
// (";...", which some servers strip) do not count, and p is read again
// percent-decoded, up to maxDecodes times; a path that still decodes
// further is refused as well.
func dotSegments(p string) bool {
	for range maxDecodes + 1 {
		if hasDotSegment(p) {
			return true
		}
		q := percentDecode(p)
		if q == p {
			return false
		}
		p = q
	}
	return true
}

// hasDotSegment reports whether p, split at '/' and '\', has a segment
// that is "." or "..", parameters aside.
func hasDotSegment(p string) bool {
	if strings.IndexByte(p, '.') < 0 {
		return false
	}
	for p != "" {
		seg := p
		if i := strings.IndexAny(p, `/\`); i >= 0 {
			seg, p = p[:i], p[i+1:]
		} else {
			p = ""
		}
		if i := strings.IndexByte(seg, ';'); i >= 0 {
			seg = seg[:i]
		}
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

// percentDecode decodes every valid %XX of s (case-insensitive) and keeps
// any other '%' as it is, as a lenient server does.
func percentDecode(s string) string {
	if strings.IndexByte(s, '%') < 0 {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]) {
			b = append(b, unHex(s[i+1])<<4|unHex(s[i+2]))
			i += 2
			continue
		}
		b = append(b, s[i])
	}
	return string(b)
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unHex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

// queryText reports whether q can go after the '?' of a request target as
// it is: no space, no '#', no control character.
func queryText(q string) bool {
	for i := 0; i < len(q); i++ {
		if c := q[i]; c <= ' ' || c == 0x7f || c == '#' {
			return false
		}
	}
	return true
}

// hasCtl reports whether s has a control character: a byte below 0x20
// (CR, LF, NUL, tab...) or DEL.
func hasCtl(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] == 0x7f {
			return true
		}
	}
	return false
}

// nameErr refuses a name the router writes into a header or a report
// that holds a control character (ErrBadName), naming its field: the
// model sent goes into the X-Relay-Model response header, the bucket into
// reports and the observers' labels.
func nameErr(field, v string) error {
	if !hasCtl(v) {
		return nil
	}
	return &Error{Op: "route", Err: fmt.Errorf("%w: %s %q", ErrBadName, field, v)}
}

// checkRouteNames refuses a Policy's route whose models or bucket hold a
// control character (ErrBadName).
func checkRouteNames(rt *Route) error {
	if err := nameErr("Route.Model", rt.Model); err != nil {
		return err
	}
	if err := nameErr("Route.Bucket", rt.Bucket); err != nil {
		return err
	}
	for i, m := range rt.Fallbacks {
		if hasCtl(m) {
			return nameErr(fmt.Sprintf("Route.Fallbacks[%d]", i), m)
		}
	}
	return nil
}

// checkWritten checks, for New, the configured values the router writes
// into requests and response headers: upstream names (X-Relay-Upstream),
// API keys (Authorization), extra headers, the models of ContextFallbacks
// and budget downgrades (X-Relay-Model), and Breaker.ProbePath (a path
// under each BaseURL). No message contains a key or a header value.
func checkWritten(c Config, bad func(string, ...any)) {
	for _, u := range c.Upstreams {
		if hasCtl(u.Name) {
			bad("upstream %q: Name has a control character", u.Name)
		}
		if hasCtl(u.APIKey) {
			bad("upstream %q: APIKey has a control character", u.Name)
		}
		for _, k := range slices.Sorted(maps.Keys(u.Header)) {
			if !headerName(k) {
				bad("upstream %q: Header name %q is not a valid header field name", u.Name, k)
			}
			if slices.ContainsFunc(u.Header[k], func(v string) bool { return hasCtl(strings.ReplaceAll(v, "\t", " ")) }) {
				bad("upstream %q: Header %q has a value with a control character", u.Name, k)
			}
		}
	}
	for i, m := range c.ContextFallbacks {
		if hasCtl(m) {
			bad("ContextFallbacks[%d] %q has a control character", i, m)
		}
	}
	for _, b := range c.Budgets {
		if hasCtl(b.Downgrade) {
			bad("budget %q: Downgrade %q has a control character", b.Name, b.Downgrade)
		}
	}
	if path, query, _ := strings.Cut(c.Breaker.ProbePath, "?"); dotSegments(path) || hasCtl(path) || !queryText(query) {
		bad("Breaker.ProbePath %q could leave the BaseURL: it has a dot segment, a control character, or a query with a space or '#'", c.Breaker.ProbePath)
	}
}

// headerName reports whether k is a valid header field name (an RFC 9110
// token).
func headerName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}
