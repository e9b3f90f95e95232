package relay

import (
	"hash/maphash"
	"net/http"
	"strings"
	"sync"
	"unsafe"

	"github.com/tidwall/gjson"
)

// Endpoints the router recognises by path suffix.
const (
	EndpointChat        = "chat/completions"
	EndpointResponses   = "responses"
	EndpointCompletions = "completions"
	EndpointEmbeddings  = "embeddings"
)

// endpointOf recognises the endpoint by the path's suffix, whatever base URL
// the caller's SDK was given.
func endpointOf(path string) string {
	path = strings.TrimSuffix(path, "/")
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		return EndpointChat
	case strings.HasSuffix(path, "/responses"):
		return EndpointResponses
	case strings.HasSuffix(path, "/completions"):
		return EndpointCompletions
	case strings.HasSuffix(path, "/embeddings"):
		return EndpointEmbeddings
	}
	return ""
}

// maxJSONDepth bounds the nesting of JSON the router parses. gjson's
// validator recurses once per level, so a body of millions of '[' would
// overflow the goroutine stack, a fatal error no recover catches. Deeper
// JSON is treated as not JSON: forwarded unchanged, zero tokens.
const maxJSONDepth = 512

// validJSON is gjson.Valid for JSON nested at most maxJSONDepth deep. The
// depth is scanned only when the document has that many brackets at all.
func validJSON(s string) bool {
	if strings.Count(s, "[")+strings.Count(s, "{") > maxJSONDepth && jsonDepth(s) > maxJSONDepth {
		return false
	}
	return gjson.Valid(s)
}

// jsonDepth returns the deepest nesting of arrays and objects in s, strings
// skipped.
func jsonDepth(s string) int {
	depth, deepest, inString := 0, 0, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if inString {
			switch c {
			case '\\':
				i++
			case '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '[', '{':
			depth++
			deepest = max(deepest, depth)
		case ']', '}':
			depth--
		}
	}
	return deepest
}

// encoding is a tiktoken encoding.
type encoding uint8

const (
	o200k encoding = iota
	cl100k
)

func (e encoding) String() string {
	if e == cl100k {
		return "cl100k_base"
	}
	return "o200k_base"
}

// encodingFor returns the encoding that bills model: cl100k_base for gpt-4,
// gpt-3.5 and the text-embedding-3/ada-002 models, o200k_base for gpt-4o,
// gpt-4.1, gpt-5, the o-series and, as an estimate, every other vendor's
// model.
func encodingFor(model string) encoding {
	m := model
	if i := strings.LastIndexByte(m, '/'); i >= 0 {
		m = m[i+1:] // "openai/gpt-4" → "gpt-4"
	}
	switch {
	case strings.HasPrefix(m, "gpt-4o"), strings.HasPrefix(m, "gpt-4.1"), strings.HasPrefix(m, "gpt-4.5"):
		return o200k
	case strings.HasPrefix(m, "gpt-4"), strings.HasPrefix(m, "gpt-3.5"), strings.HasPrefix(m, "gpt-35"),
		strings.HasPrefix(m, "text-embedding-3"), strings.HasPrefix(m, "text-embedding-ada-002"):
		return cl100k
	}
	return o200k
}

// classified is what the router learned from a request body.
type classified struct {
	req  Request
	enc  encoding
	json bool   // the body is a JSON object the router may edit
	body string // the body, viewed as a string (no copy)
}

// classify reads what a policy needs from a request without decoding the
// whole body. A body that is not a JSON object, or that has an unexpected
// shape, yields zero tokens and is never an error.
func (r *Router) classify(method string, path string, h http.Header, body []byte) classified {
	c := classified{req: Request{Header: h, Load: r}}
	if method == http.MethodPost {
		c.req.Endpoint = endpointOf(path)
	}
	if c.req.Endpoint == "" || len(body) == 0 {
		c.req.Bucket = r.cfg.Buckets.Bucket(0)
		return c
	}
	s := unsafe.String(unsafe.SliceData(body), len(body))
	c.body = s
	if !validJSON(s) {
		c.req.Bucket = r.cfg.Buckets.Bucket(0)
		return c
	}
	root := gjson.Parse(s)
	if !root.IsObject() {
		c.req.Bucket = r.cfg.Buckets.Bucket(0)
		return c
	}
	c.json = true
	// One pass over the top level picks every field the router reads, so
	// the (possibly large) prompt is not scanned again to find it.
	var f topFields
	root.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "model":
			f.model = v
		case "stream":
			f.stream = v
		case "max_tokens", "max_completion_tokens", "max_output_tokens":
			if v.Type == gjson.Number && v.Int() > 0 {
				f.maxTokens = v
			}
		case "messages":
			f.messages = v
		case "input":
			f.input = v
		case "prompt":
			f.prompt = v
		case "instructions":
			f.instructions = v
		case "tools":
			f.tools = v
		}
		return true
	})
	if f.model.Type == gjson.String {
		c.req.Model = f.model.Str
	}
	c.req.Stream = f.stream.Type == gjson.True
	if f.maxTokens.Exists() {
		c.req.MaxTokens = int(min(f.maxTokens.Int(), 1<<31-1))
	}
	c.enc = encodingFor(c.req.Model)
	c.req.PromptTokens = r.promptTokens(c.enc, c.req.Endpoint, &f)
	c.req.Bucket = r.cfg.Buckets.Bucket(c.req.PromptTokens)
	return c
}

// Token counting follows OpenAI's published formula for chat ("How to count
// tokens with tiktoken"): 3 tokens per message, the tokens of every string
// field of the message (role, content, name, tool_call_id), 1 more per name,
// and 3 for the reply priming. Content-part arrays count their text parts
// and Config.ImageTokens per image part; tool calls count their function
// name and arguments. Tool definitions use the cookbook's function-calling
// estimate (7 per function, 3 per property, 12 at the end, names, types,
// descriptions and enum values counted).
const (
	tokensPerMessage = 3
	tokensPerName    = 1
	tokensReply      = 3
	toolFuncInit     = 7
	toolPropInit     = 3
	toolPropKey      = 3
	toolEnumInit     = -3
	toolEnumItem     = 3
	toolFuncEnd      = 12
)

// topFields are the top-level fields of a request body the router reads.
type topFields struct {
	model, stream, maxTokens                     gjson.Result
	messages, input, prompt, instructions, tools gjson.Result
}

func (r *Router) promptTokens(enc encoding, endpoint string, f *topFields) int {
	switch endpoint {
	case EndpointChat:
		msgs := f.messages
		if !msgs.IsArray() {
			return 0
		}
		n := 0
		msgs.ForEach(func(_, m gjson.Result) bool {
			n += r.messageTokens(enc, m)
			return true
		})
		n += tokensReply
		n += r.toolsTokens(enc, f.tools)
		return n
	case EndpointResponses:
		n := 0
		if ins := f.instructions; ins.Type == gjson.String {
			n += tokensPerMessage + r.counter.count(enc, ins.Str)
		}
		in := f.input
		switch {
		case in.Type == gjson.String:
			n += tokensPerMessage + r.counter.count(enc, in.Str)
		case in.IsArray():
			in.ForEach(func(_, item gjson.Result) bool {
				n += r.messageTokens(enc, item)
				return true
			})
		default:
			return n
		}
		n += tokensReply
		n += r.toolsTokens(enc, f.tools)
		return n
	case EndpointCompletions:
		return r.inputTokens(enc, f.prompt)
	case EndpointEmbeddings:
		return r.inputTokens(enc, f.input)
	}
	return 0
}

// messageTokens counts one chat message or Responses input item.
func (r *Router) messageTokens(enc encoding, m gjson.Result) int {
	if !m.IsObject() {
		return 0
	}
	n := tokensPerMessage
	m.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "content":
			n += r.contentTokens(enc, v)
		case "name":
			if v.Type == gjson.String {
				n += r.counter.count(enc, v.Str) + tokensPerName
			}
		case "tool_calls":
			v.ForEach(func(_, call gjson.Result) bool {
				fn := call.Get("function")
				n += r.counter.count(enc, fn.Get("name").Str) + r.counter.count(enc, fn.Get("arguments").Str)
				return true
			})
		case "function_call":
			n += r.counter.count(enc, v.Get("name").Str) + r.counter.count(enc, v.Get("arguments").Str)
		case "type", "id", "status":
			// Responses item framing, not billed text.
		default:
			if v.Type == gjson.String { // role, tool_call_id, arguments, output, ...
				n += r.counter.count(enc, v.Str)
			}
		}
		return true
	})
	return n
}

// contentTokens counts a string content or an array of content parts.
func (r *Router) contentTokens(enc encoding, v gjson.Result) int {
	if v.Type == gjson.String {
		return r.counter.count(enc, v.Str)
	}
	if !v.IsArray() {
		return 0
	}
	n := 0
	v.ForEach(func(_, part gjson.Result) bool {
		switch part.Get("type").Str {
		case "text", "input_text", "output_text":
			n += r.counter.count(enc, part.Get("text").Str)
		case "image_url", "input_image", "image":
			n += r.cfg.ImageTokens
		case "refusal":
			n += r.counter.count(enc, part.Get("refusal").Str)
		}
		return true
	})
	return n
}

// toolsTokens estimates the tokens of tool definitions with the cookbook's
// function-calling formula; the result is memoized per tools block.
func (r *Router) toolsTokens(enc encoding, tools gjson.Result) int {
	if !tools.IsArray() || len(tools.Raw) <= 2 {
		return 0
	}
	if n, ok := r.counter.memo.get(enc, kindTools, tools.Raw); ok {
		return n
	}
	n := 0
	tools.ForEach(func(_, t gjson.Result) bool {
		fn := t.Get("function")
		if !fn.Exists() {
			fn = t // Responses API: the function's fields are on the tool
		}
		name := fn.Get("name")
		if name.Type != gjson.String {
			return true
		}
		n += toolFuncInit
		n += r.counter.countRaw(enc, name.Str+":"+strings.TrimSuffix(fn.Get("description").Str, "."))
		props := fn.Get("parameters.properties")
		if props.IsObject() && len(props.Raw) > 2 {
			n += toolPropInit
			props.ForEach(func(key, p gjson.Result) bool {
				n += toolPropKey
				if enum := p.Get("enum"); enum.IsArray() {
					n += toolEnumInit
					enum.ForEach(func(_, item gjson.Result) bool {
						n += toolEnumItem + r.counter.countRaw(enc, item.String())
						return true
					})
				}
				n += r.counter.countRaw(enc, key.Str+":"+p.Get("type").String()+":"+strings.TrimSuffix(p.Get("description").Str, "."))
				return true
			})
		}
		return true
	})
	if n > 0 {
		n += toolFuncEnd
	}
	r.counter.memo.put(enc, kindTools, tools.Raw, n)
	return n
}

// inputTokens counts a completions prompt or an embeddings input: a string,
// an array of strings, an array of token ids, or an array of such arrays.
func (r *Router) inputTokens(enc encoding, v gjson.Result) int {
	switch {
	case v.Type == gjson.String:
		return r.counter.count(enc, v.Str)
	case v.IsArray():
		n := 0
		v.ForEach(func(_, e gjson.Result) bool {
			switch {
			case e.Type == gjson.String:
				n += r.counter.count(enc, e.Str)
			case e.Type == gjson.Number:
				n++ // a token id
			case e.IsArray():
				e.ForEach(func(_, id gjson.Result) bool {
					if id.Type == gjson.Number {
						n++
					}
					return true
				})
			}
			return true
		})
		return n
	}
	return 0
}

// counter counts tokens, memoizing the counts of long strings.
type counter struct {
	memo *memo // nil: no memo
}

func newCounter(entries int) *counter {
	c := &counter{}
	if entries > 0 {
		c.memo = newMemo(entries)
	}
	return c
}

// memoMin is the shortest string whose count is memoized: shorter ones cost
// less to count than to look up.
const memoMin = 64

const (
	kindText uint8 = iota
	kindTools
)

func (c *counter) count(enc encoding, s string) int {
	if len(s) < memoMin || c.memo == nil {
		return c.countRaw(enc, s)
	}
	if n, ok := c.memo.get(enc, kindText, s); ok {
		return n
	}
	n := c.countRaw(enc, s)
	c.memo.put(enc, kindText, s, n)
	return n
}

func (c *counter) countRaw(enc encoding, s string) int {
	if s == "" {
		return 0
	}
	return countTokens(enc, s)
}

// memo is a bounded, concurrency-safe map from (encoding, string) to a token
// count. Each shard keeps two generations: when the current one is full it
// becomes the old one and the previous old one is dropped; a hit in the old
// generation moves the entry back. Entries are keyed by a 64-bit hash of the
// string, so the memo holds no reference to request bodies.
type memo struct {
	seed   maphash.Seed
	per    int
	shards [memoShards]memoShard
}

const memoShards = 16

type memoShard struct {
	mu       sync.Mutex
	cur, old map[uint64]int32
	_        [40]byte // keep shards on separate cache lines
}

func newMemo(entries int) *memo {
	m := &memo{seed: maphash.MakeSeed(), per: max(1, entries/(2*memoShards))}
	for i := range m.shards {
		m.shards[i].cur = make(map[uint64]int32, m.per)
	}
	return m
}

func (m *memo) key(enc encoding, kind uint8, s string) uint64 {
	return maphash.String(m.seed, s) ^ uint64(enc)<<56 ^ uint64(kind)<<48
}

func (m *memo) get(enc encoding, kind uint8, s string) (int, bool) {
	if m == nil {
		return 0, false
	}
	k := m.key(enc, kind, s)
	sh := &m.shards[k%memoShards]
	sh.mu.Lock()
	v, ok := sh.cur[k]
	if !ok {
		if v, ok = sh.old[k]; ok {
			sh.insert(k, v, m.per)
		}
	}
	sh.mu.Unlock()
	return int(v), ok
}

func (m *memo) put(enc encoding, kind uint8, s string, n int) {
	if m == nil {
		return
	}
	k := m.key(enc, kind, s)
	sh := &m.shards[k%memoShards]
	sh.mu.Lock()
	sh.insert(k, int32(min(n, 1<<31-1)), m.per)
	sh.mu.Unlock()
}

func (sh *memoShard) insert(k uint64, v int32, per int) {
	if len(sh.cur) >= per {
		sh.old, sh.cur = sh.cur, make(map[uint64]int32, per)
	}
	sh.cur[k] = v
}

// completionTokens counts the answer text of a non-streaming response: chat
// choices' content, tool-call names and arguments, completions' text, and the
// Responses API's output text.
func (r *Router) completionTokens(enc encoding, body []byte) int {
	s := unsafe.String(unsafe.SliceData(body), len(body))
	if !validJSON(s) {
		return 0
	}
	root := gjson.Parse(s)
	n := 0
	root.Get("choices").ForEach(func(_, ch gjson.Result) bool {
		msg := ch.Get("message")
		n += r.counter.countRaw(enc, msg.Get("content").Str)
		msg.Get("tool_calls").ForEach(func(_, call gjson.Result) bool {
			n += r.counter.countRaw(enc, call.Get("function.name").Str) + r.counter.countRaw(enc, call.Get("function.arguments").Str)
			return true
		})
		n += r.counter.countRaw(enc, ch.Get("text").Str)
		return true
	})
	root.Get("output").ForEach(func(_, item gjson.Result) bool {
		item.Get("content").ForEach(func(_, part gjson.Result) bool {
			n += r.counter.countRaw(enc, part.Get("text").Str)
			return true
		})
		n += r.counter.countRaw(enc, item.Get("arguments").Str)
		return true
	})
	return n
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
type ClusterPolicy struct {
	Fast  string // model for prompts in the window; "" keeps the requested one
	Cheap string // model for mid-size prompts outside the window; "" keeps the requested one
	// WindowMin and WindowMax bound the window, inclusive, in prompt tokens.
	// If both are 0, 80 and 260.
	WindowMin, WindowMax int
	WhenBusy             bool
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
	default:
		return rt
	}
	if rt.Model != r.Model && r.Model != "" {
		rt.Fallbacks = append([]string{r.Model}, p.Fallbacks...)
	}
	return rt
}
