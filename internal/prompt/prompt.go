// Package prompt knows the shape of OpenAI-compatible request bodies: which
// endpoint a path names, and the canonical prompt text of a request, the one
// definition the router's affinity key and relaytest's prefix caches share.
package prompt

import (
	"strings"

	"github.com/tokenrelay/relay/internal/jsonscan"
)

// Endpoints recognised by path suffix.
const (
	Chat        = "chat/completions"
	Responses   = "responses"
	Completions = "completions"
	Embeddings  = "embeddings"
)

// Endpoint recognises the model endpoint of a POST by its path's suffix,
// whatever base URL the caller's SDK was given; "" for any other path.
func Endpoint(path string) string {
	path = strings.TrimSuffix(path, "/")
	switch {
	case strings.HasSuffix(path, "/"+Chat):
		return Chat
	case strings.HasSuffix(path, "/"+Responses):
		return Responses
	case strings.HasSuffix(path, "/"+Completions):
		return Completions
	case strings.HasSuffix(path, "/"+Embeddings):
		return Embeddings
	}
	return ""
}

// AppendCanonical appends to dst the canonical prompt of a request body
// (valid JSON) sent to endpoint, stopping once dst holds limit bytes.
//
// The canonical prompt is plain text built from the body, in this order,
// each piece followed by "\n":
//
//   - chat/completions: the leading system and developer messages, then
//     "tools\n" and the raw JSON of "tools" (if any), then the other
//     messages;
//   - responses: "system\n" and "instructions" (if any), then "tools\n" and
//     the raw JSON of "tools", then "input": a string as a user message, an
//     array as messages;
//   - completions and embeddings: the "prompt" or "input" string, or the
//     strings of an array joined by "\n" (token-id arrays contribute
//     nothing).
//
// A message is its role (or, for a Responses item without one, its type),
// "\n", then each of: the string content, or each text, input_text,
// output_text or refusal part's text ("<image>" for an image part), then
// name(arguments) for each tool call or function_call item, and the output
// of a function_call_output item, each followed by "\n". Strings are the
// decoded JSON strings; member names are matched as written.
//
// So a chat request with system message S and user message Q, and a
// Responses request with instructions S and input Q, have the same canonical
// prompt as long as they carry no tools (tool definitions are kept as sent,
// and the two APIs shape them differently) and use the same roles
// ("developer" is not "system"). Only the bytes kept are decoded: the rest
// of the body is stepped over.
func AppendCanonical(dst []byte, endpoint, body string, limit int) []byte {
	b := builder{buf: dst, limit: limit}
	b.build(endpoint, body)
	return b.buf
}

// AppendAnchor appends to dst the canonical text of the conversation's
// anchor, stopping once dst holds limit bytes: the first message of a chat
// request (of a Responses input array) after the leading system and
// developer messages, written as AppendCanonical writes a message, when at
// least one more message follows it. A one-shot request or a
// conversation's first turn has none. Reader.AppendAnchor gives the same.
func AppendAnchor(dst []byte, endpoint, body string, limit int) []byte {
	var f [5]string
	jsonscan.Pick(body, topKeys, f[:])
	list := f[0] // read as AppendCanonical reads it, whatever its kind
	switch endpoint {
	case Chat:
	case Responses:
		if list = f[3]; !strings.HasPrefix(list, "[") {
			return dst
		}
	default:
		return dst
	}
	anchor, more := "", false
	jsonscan.Each(list, 0, func(_, m string) bool {
		switch {
		case anchor != "":
			more = true
			return false
		case !isLeading(m):
			anchor = m
		}
		return true
	})
	if !more {
		return dst
	}
	b := builder{buf: dst, limit: limit}
	b.message(anchor)
	return b.buf
}

// isLeading reports whether m is a system or developer message, as the
// leading messages of a chat request are.
func isLeading(m string) bool {
	role := jsonscan.Field(m, "role")
	return role == `"system"` || role == `"developer"`
}

type builder struct {
	buf   []byte
	limit int
}

func (b *builder) full() bool { return len(b.buf) >= b.limit }

func (b *builder) str(s string) {
	if n := b.limit - len(b.buf); n > 0 {
		b.buf = append(b.buf, s[:min(n, len(s))]...)
	}
}

func (b *builder) jstr(raw string) { b.buf = jsonscan.AppendString(b.buf, raw, b.limit) }

// The top-level fields the canonical prompt reads.
var topKeys = []string{"messages", "tools", "instructions", "input", "prompt"}

func (b *builder) build(endpoint string, body string) {
	var f [5]string
	jsonscan.Pick(body, topKeys, f[:])
	msgs, tools, ins, input := f[0], f[1], f[2], f[3]
	if endpoint == Completions {
		input = f[4]
	}
	switch endpoint {
	case Chat:
		b.chat(msgs, tools)
	case Responses:
		if jsonscan.IsString(ins) {
			b.str("system\n")
			b.jstr(ins)
			b.str("\n")
		}
		b.tools(tools)
		switch {
		case jsonscan.IsString(input):
			b.str("user\n")
			b.jstr(input)
			b.str("\n")
		case strings.HasPrefix(input, "["):
			b.messages(input)
		}
	case Completions, Embeddings:
		b.inputs(input)
	}
}

// chat puts the leading system and developer messages before the tools.
func (b *builder) chat(msgs, tools string) {
	leading := true
	jsonscan.Each(msgs, 0, func(_, m string) bool {
		if leading && !isLeading(m) {
			leading = false
			b.tools(tools)
		}
		b.message(m)
		return !b.full()
	})
	if leading {
		b.tools(tools)
	}
}

func (b *builder) messages(list string) {
	jsonscan.Each(list, 0, func(_, m string) bool {
		b.message(m)
		return !b.full()
	})
}

func (b *builder) inputs(input string) {
	switch {
	case strings.HasPrefix(input, `"`):
		b.jstr(input)
	case strings.HasPrefix(input, "["):
		first := true
		jsonscan.Each(input, 0, func(_, v string) bool {
			if strings.HasPrefix(v, `"`) {
				if !first {
					b.str("\n")
				}
				first = false
				b.jstr(v)
			}
			return !b.full()
		})
	}
}

func (b *builder) tools(tools string) {
	if strings.HasPrefix(tools, "[") && len(tools) > 2 && !b.full() {
		b.str("tools\n")
		b.str(tools)
		b.str("\n")
	}
}

// The fields of a message (or Responses item) the canonical prompt reads.
var messageKeys = []string{ // indexed by the m constants below
	"role", "type", "content", "tool_calls", "name", "arguments", "output"}

const (
	mRole = iota
	mType
	mContent
	mCalls
	mName
	mArgs
	mOutput
)

func (b *builder) message(m string) {
	if !strings.HasPrefix(m, "{") || b.full() {
		return
	}
	var f [7]string
	jsonscan.Pick(m, messageKeys, f[:])
	if strings.HasPrefix(f[mRole], `"`) {
		b.jstr(f[mRole])
	} else {
		b.jstr(f[mType])
	}
	b.str("\n")
	b.content(f[mContent])
	jsonscan.Each(f[mCalls], 0, func(_, call string) bool {
		fn := jsonscan.Field(call, "function")
		b.call(jsonscan.Field(fn, "name"), jsonscan.Field(fn, "arguments"))
		return !b.full()
	})
	if f[mType] == `"function_call"` {
		b.call(f[mName], f[mArgs])
	}
	if strings.HasPrefix(f[mOutput], `"`) {
		b.jstr(f[mOutput])
		b.str("\n")
	}
}

func (b *builder) call(name, args string) {
	b.jstr(name)
	b.str("(")
	b.jstr(args)
	b.str(")\n")
}

func (b *builder) content(content string) {
	switch {
	case strings.HasPrefix(content, `"`):
		b.jstr(content)
		b.str("\n")
	case strings.HasPrefix(content, "["):
		jsonscan.Each(content, 0, func(_, part string) bool {
			switch jsonscan.Field(part, "type") {
			case `"text"`, `"input_text"`, `"output_text"`:
				b.jstr(jsonscan.Field(part, "text"))
				b.str("\n")
			case `"refusal"`:
				b.jstr(jsonscan.Field(part, "refusal"))
				b.str("\n")
			case `"image_url"`, `"input_image"`, `"image"`:
				b.str("<image>\n")
			}
			return !b.full()
		})
	}
}
