package prompt

import (
	"strconv"
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"

	"github.com/tokenrelay/relay/internal/jsonscan"
)

// Reader reads a request body in one pass: it checks that the body is JSON
// (as jsonscan.Valid defines it, nesting bound included, without
// recursion), and gathers everything the router reads: the model, stream
// and max-token fields, the strings and constants the prompt-token count
// (Tokens) adds up, and the pieces of the canonical prompt
// (AppendCanonical). What it gathers are offsets into the body: nothing is
// decoded or copied. The zero Reader is ready; Read resets it, so one
// Reader serves many bodies.
//
// Its results are those of the reference readers, Tokens over gjson and
// AppendCanonical over jsonscan. Both read the last occurrence of a
// repeated member of a message, as upstreams do; they differ in one way
// the Reader keeps: the count compares member names decoded while the
// canonical prompt compares them as written. When a
// member name the Reader looks at is spelled with escapes, or the type of a
// content part is, the two may disagree on which member is meant: Read then
// sets Fallback, and the caller uses the reference readers (no SDK writes
// such bodies).
type Reader struct {
	Body     string
	Endpoint string
	// JSON reports that the body is a JSON object; nothing else is set
	// when it is not.
	JSON bool
	// Fallback reports a body whose results the reference readers must
	// give (see above).
	Fallback bool
	// Model and Stream are the last "model" and "stream" members.
	Model, Stream Value
	// MaxTokens is the last positive number among max_tokens,
	// max_completion_tokens and max_output_tokens, as gjson's Int reads it;
	// HasMaxTokens reports there is one.
	MaxTokens    int64
	HasMaxTokens bool
	// Choices is the last "n" that is a number above 1, as gjson's Int
	// reads it (the completions a chat request asks for); 0 when none.
	Choices int64

	// Strs are the strings of the body the count and the canonical prompt
	// read, in body order; a field's strings are a range of them.
	Strs []Str

	// Known, when set, is asked about each string of at least KnownMin
	// bytes (as written) the Reader reads as a value; Read keeps both.
	Known    Known
	KnownMin int

	fields [numFields]field
	hints  []hint
	msgs   []msgRec
	ops    []op
	// members are the members of the messages being read (see message),
	// each name once; byName indexes a message's past linearMembers
	// (nameIdx, kept empty between messages, is its reused map).
	members []member
	byName  map[string]int32
	nameIdx map[string]int32
	// steps counts the member lookups' comparisons, for the tests that
	// hold reading to linear time.
	steps int
}

// Value is a member value: Body[Start:End], of kind '"', '{', '[', 'n'
// (number), 't', 'f' or '0' (null). The zero Value is absent.
type Value struct {
	Start, End int
	Kind       byte
}

// Str is a JSON string of the body: Body[Start:End] is its text between
// the quotes, Esc reports escapes in it, and Counted that the prompt-token
// count adds its tokens. Hashed reports that Known was asked about it: H
// is the hash it gave, and Seen, W what it knew.
type Str struct {
	Start, End int
	Esc        bool
	Counted    bool
	Hashed     bool
	Seen       bool
	H, W       uint64
}

// Known remembers strings read valid before. Known returns the hash of
// raw, the text of a string between its quotes as written, and whether a
// string with that text was found valid JSON before, with the word stored
// for it. The Reader then does not check the string again: it only finds
// its closing quote (jsonscan.StringEnd), which valid text and a known
// hash leave no doubt about. A Known must only know strings it was told
// were valid: the word is stored by the Reader's user, after a Read that
// found the body JSON.
type Known interface {
	Known(raw string) (h, w uint64, ok bool)
}

// hint is what Known said about the string that starts at Body[start].
type hint struct {
	start int
	h, w  uint64
	seen  bool
}

// Raw returns the string's text as written, between its quotes.
func (r *Reader) Raw(s Str) string { return r.Body[s.Start:s.End] }

// AppendStr appends the decoded string to dst.
func (r *Reader) AppendStr(dst []byte, s Str) []byte {
	if !s.Esc {
		return append(dst, r.Body[s.Start:s.End]...)
	}
	return jsonscan.AppendUnescaped(dst, r.Body[s.Start:s.End], 1<<62)
}

// The top-level fields a prompt is read from.
const (
	fMessages = iota // chat
	fInput           // responses (a string or items), embeddings (inputs)
	fPrompt          // completions (inputs)
	fInstructions
	fTools
	numFields
)

// field is the last occurrence of a top-level field.
type field struct {
	v      Value
	strs   [2]int // its range of Strs
	msgs   [2]int // its range of msgs (messages and Responses items)
	consts int    // what the count adds besides strings and images
	images int    // image parts
}

// msgRec is a chat message or Responses item, as the canonical prompt
// reads it: its members' last occurrences, and the ops of its content and
// tool calls. Indices are into Strs; -1 is none (absent, or not a string).
type msgRec struct {
	object                        bool
	firstRole                     Value // the first "role", for chat's leading system messages
	role, typ, name, args, output int32
	roleSet                       bool // the last role is a string
	content, calls                [2]int32
}

// op is a step of the canonical prompt of a content or tool-call list.
type op struct {
	kind uint8
	a, b int32 // Strs indices, -1 for none
}

const (
	opText  uint8 = iota // the string a, then "\n"
	opImage              // "<image>\n"
	opCall               // a "(" b ")\n"
)

// Cap returns the bytes the Reader's buffers hold.
func (r *Reader) Cap() int {
	return cap(r.Strs)*int(unsafe.Sizeof(Str{})) + cap(r.msgs)*int(unsafe.Sizeof(msgRec{})) + cap(r.ops)*int(unsafe.Sizeof(op{})) +
		cap(r.hints)*int(unsafe.Sizeof(hint{})) + cap(r.members)*int(unsafe.Sizeof(member{}))
}

// Forget drops the Reader's reference to the last body and its Known,
// keeping its buffers.
func (r *Reader) Forget() {
	*r = Reader{Strs: r.Strs[:0], msgs: r.msgs[:0], ops: r.ops[:0], hints: r.hints[:0], members: r.members[:0], nameIdx: r.nameIdx}
}

// Read reads body, a request to endpoint.
func (r *Reader) Read(endpoint, body string) {
	*r = Reader{Body: body, Endpoint: endpoint, Strs: r.Strs[:0], msgs: r.msgs[:0], ops: r.ops[:0], hints: r.hints[:0],
		members: r.members[:0], nameIdx: r.nameIdx, Known: r.Known, KnownMin: r.KnownMin}
	i := jsonscan.SkipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return // not an object: what it is does not matter
	}
	end, ok := r.each(i, 0, r.top)
	r.JSON = ok && jsonscan.SkipSpace(body, end) == len(body)
}

// each walks the object or array at Body[i], inside depth containers,
// calling f with each member's name as written (empty in an array) and the
// offset of its value; f returns the offset past the value, or -1 when it
// is not valid. each returns the offset past the container.
func (r *Reader) each(i, depth int, f func(key string, j, depth int) int) (int, bool) {
	s := r.Body
	if depth >= jsonscan.MaxDepth {
		return i, false
	}
	close := s[i] + 2 // '}' or ']'
	obj := s[i] == '{'
	i = jsonscan.SkipSpace(s, i+1)
	if i < len(s) && s[i] == close {
		return i + 1, true
	}
	for {
		key := ""
		if obj {
			if i >= len(s) || s[i] != '"' {
				return i, false
			}
			e, esc, ok := jsonscan.ValidString(s, i)
			if !ok {
				return e, false
			}
			if esc {
				r.Fallback = true
			}
			key = s[i+1 : e-1]
			i = jsonscan.SkipSpace(s, e)
			if i >= len(s) || s[i] != ':' {
				return i, false
			}
			i = jsonscan.SkipSpace(s, i+1)
		}
		if i >= len(s) {
			return i, false
		}
		if i = f(key, i, depth+1); i < 0 {
			return 0, false
		}
		i = jsonscan.SkipSpace(s, i)
		if i >= len(s) {
			return i, false
		}
		switch s[i] {
		case ',':
			i = jsonscan.SkipSpace(s, i+1)
		case close:
			return i + 1, true
		default:
			return i, false
		}
	}
}

// value checks the value at Body[i] and returns it; end < 0 when it is
// not valid.
func (r *Reader) value(i, depth int) (v Value, esc bool, end int) {
	s := r.Body
	if s[i] == '"' {
		if r.Known != nil {
			if q := jsonscan.StringEnd(s, i); q < len(s) && q-i-1 >= r.KnownMin {
				raw := s[i+1 : q]
				h, w, seen := r.Known.Known(raw)
				r.hints = append(r.hints, hint{start: i + 1, h: h, w: w, seen: seen})
				if seen {
					return Value{i, q + 1, '"'}, strings.IndexByte(raw, '\\') >= 0, q + 1
				}
			}
		}
		e, esc, ok := jsonscan.ValidString(s, i)
		if !ok {
			return v, esc, -1
		}
		return Value{i, e, '"'}, esc, e
	}
	e, ok := jsonscan.ValidValue(s, i, depth)
	if !ok {
		return v, false, -1
	}
	k := s[i]
	switch k {
	case '{', '[', 't', 'f':
	case 'n':
		k = '0' // null
	default:
		k = 'n'
	}
	return Value{i, e, k}, false, e
}

// positive returns the number v as gjson's Int reads it, when v is a
// positive number; else 0.
func (r *Reader) positive(v Value) int64 {
	if v.Kind != 'n' {
		return 0
	}
	raw := r.Body[v.Start:v.End]
	num, _ := strconv.ParseFloat(raw, 64)
	return max((gjson.Result{Type: gjson.Number, Raw: raw, Num: num}).Int(), 0)
}

// skip checks the value at Body[i] and returns its end, or -1.
func (r *Reader) skip(i, depth int) int {
	e, ok := jsonscan.ValidValue(r.Body, i, depth)
	if !ok {
		return -1
	}
	return e
}

// str adds the string v to Strs and returns its index.
func (r *Reader) str(v Value, esc, counted bool) int32 {
	st := Str{Start: v.Start + 1, End: v.End - 1, Esc: esc, Counted: counted}
	// The string's hint, if it has one, is among the last few: a content
	// part's text is added after the part's other members are read.
	for k := len(r.hints) - 1; k >= 0 && k >= len(r.hints)-4; k-- {
		if h := &r.hints[k]; h.start == st.Start {
			st.Hashed, st.Seen, st.H, st.W = true, h.seen, h.h, h.w
			break
		}
	}
	r.Strs = append(r.Strs, st)
	return int32(len(r.Strs) - 1)
}

// top reads a member of the body's object.
func (r *Reader) top(key string, j, depth int) int {
	switch key {
	case "model":
		v, _, e := r.value(j, depth)
		r.Model = v
		return e
	case "stream":
		v, _, e := r.value(j, depth)
		r.Stream = v
		return e
	case "max_tokens", "max_completion_tokens", "max_output_tokens":
		v, _, e := r.value(j, depth)
		if n := r.positive(v); n > 0 {
			r.MaxTokens, r.HasMaxTokens = n, true
		}
		return e
	case "n":
		v, _, e := r.value(j, depth)
		if n := r.positive(v); n > 1 {
			r.Choices = n
		}
		return e
	}
	f := -1
	switch r.Endpoint {
	case Chat:
		switch key {
		case "messages":
			f = fMessages
		case "tools":
			f = fTools
		}
	case Responses:
		switch key {
		case "input":
			f = fInput
		case "instructions":
			f = fInstructions
		case "tools":
			f = fTools
		}
	case Completions:
		if key == "prompt" {
			f = fPrompt
		}
	case Embeddings:
		if key == "input" {
			f = fInput
		}
	}
	if f < 0 {
		return r.skip(j, depth)
	}
	fd := &r.fields[f]
	*fd = field{}
	fd.strs[0], fd.msgs[0] = len(r.Strs), len(r.msgs)
	var e int
	switch {
	case f == fMessages || f == fInput && r.Endpoint == Responses && r.Body[j] == '[':
		e = r.messages(j, depth, fd)
	case f == fInput || f == fPrompt:
		e = r.inputs(j, depth, fd)
	default: // instructions, tools, a Responses input that is not an array
		var esc bool
		fd.v, esc, e = r.value(j, depth)
		if fd.v.Kind == '"' && f != fTools {
			r.str(fd.v, esc, true)
		}
	}
	fd.strs[1], fd.msgs[1] = len(r.Strs), len(r.msgs)
	return e
}

// messages reads a list of chat messages or Responses items (an array or,
// for the canonical prompt only, an object).
func (r *Reader) messages(j, depth int, fd *field) int {
	s := r.Body
	if c := s[j]; c != '[' && c != '{' {
		var e int
		fd.v, _, e = r.value(j, depth)
		return e
	}
	e, ok := r.each(j, depth, func(_ string, k, depth int) int {
		return r.message(k, depth, fd)
	})
	if !ok {
		return -1
	}
	fd.v = Value{j, e, s[j]}
	return e
}

// message reads one message or Responses item.
func (r *Reader) message(j, depth int, fd *field) int {
	if r.Body[j] != '{' {
		r.msgs = append(r.msgs, msgRec{})
		return r.skip(j, depth)
	}
	m := msgRec{object: true, role: -1, typ: -1, name: -1, args: -1, output: -1}
	fd.consts += tokensPerMessage
	base := len(r.members)
	e, ok := r.each(j, depth, func(key string, k, depth int) int {
		s0, c0, i0 := int32(len(r.Strs)), fd.consts, fd.images
		e := r.member(key, k, depth, fd, &m)
		if e < 0 {
			return e
		}
		at := int(uintptr(unsafe.Pointer(unsafe.StringData(key))) - uintptr(unsafe.Pointer(unsafe.StringData(r.Body))))
		mb := member{at, len(key), [2]int32{s0, int32(len(r.Strs))}, fd.consts - c0, fd.images - i0}
		// Upstreams read a repeated member's last occurrence, as the
		// canonical prompt does: an earlier one counts nothing, and the
		// later one takes its place, so the list holds each name once.
		if i := r.findMember(base, key); i >= 0 {
			r.uncount(&r.members[i], fd)
			r.members[i] = mb
		} else {
			r.members = append(r.members, mb)
			if r.byName != nil {
				r.byName[key] = int32(len(r.members) - 1)
			}
		}
		return e
	})
	r.members = r.members[:base]
	if r.byName != nil {
		clear(r.byName) // its keys are views of the body: keep none past the message
		r.byName = nil
	}
	if !ok {
		return -1
	}
	r.msgs = append(r.msgs, m)
	return e
}

// linearMembers is how many members of a message findMember compares one
// by one before it indexes them by name.
const linearMembers = 8

// findMember returns the index in r.members of the member of the message
// being read (from base) named key, or -1. Past linearMembers names it
// looks them up in an index by name, so that a message of many members
// is read in linear time.
func (r *Reader) findMember(base int, key string) int {
	if r.byName == nil {
		if len(r.members)-base < linearMembers {
			for i := base; i < len(r.members); i++ {
				r.steps++
				if o := &r.members[i]; o.n == len(key) && (o.n == 0 || r.Body[o.at:o.at+o.n] == key) {
					return i
				}
			}
			return -1
		}
		if r.nameIdx == nil {
			r.nameIdx = make(map[string]int32)
		}
		r.byName = r.nameIdx
		for i := base; i < len(r.members); i++ {
			o := &r.members[i]
			r.byName[r.Body[o.at:o.at+o.n]] = int32(i)
		}
	}
	r.steps++
	if i, ok := r.byName[key]; ok {
		return int(i)
	}
	return -1
}

// member is what one member of a message added to the count: its range of
// Strs, and the constants and image parts it added to its field. Its name
// is Body[at:at+n] (offsets, so that the buffer keeps no body alive).
type member struct {
	at, n          int
	strs           [2]int32
	consts, images int
}

// uncount takes what member mb added out of the count.
func (r *Reader) uncount(mb *member, fd *field) {
	for k := mb.strs[0]; k < mb.strs[1]; k++ {
		r.Strs[k].Counted = false
	}
	fd.consts -= mb.consts
	fd.images -= mb.images
	mb.strs, mb.consts, mb.images = [2]int32{}, 0, 0
}

// member reads one member of a message or Responses item.
func (r *Reader) member(key string, k, depth int, fd *field, m *msgRec) int {
	switch key {
	case "content":
		return r.content(k, depth, fd, m)
	case "tool_calls":
		return r.toolCalls(k, depth, m)
	case "function_call":
		return r.functionCall(k, depth)
	case "id", "status":
		return r.skip(k, depth)
	}
	v, esc, e := r.value(k, depth)
	if e < 0 {
		return e
	}
	isStr := v.Kind == '"'
	idx := int32(-1)
	if isStr {
		idx = r.str(v, esc, key != "type") // "type" is framing, not billed
	}
	switch key {
	case "role":
		if m.firstRole.Kind == 0 {
			m.firstRole = v
		}
		m.role, m.roleSet = idx, isStr
	case "type":
		m.typ = idx
	case "name":
		m.name = idx
		if isStr {
			fd.consts += tokensPerName
		}
	case "arguments":
		m.args = idx
	case "output":
		m.output = idx
	}
	return e
}

// content reads a message's content: a string or an array of parts.
func (r *Reader) content(j, depth int, fd *field, m *msgRec) int {
	start := int32(len(r.ops))
	defer func() { m.content = [2]int32{start, int32(len(r.ops))} }()
	switch r.Body[j] {
	case '"':
		v, esc, e := r.value(j, depth)
		if e >= 0 {
			r.ops = append(r.ops, op{kind: opText, a: r.str(v, esc, true), b: -1})
		}
		return e
	case '[':
	default:
		return r.skip(j, depth)
	}
	e, ok := r.each(j, depth, func(_ string, k, depth int) int {
		if r.Body[k] != '{' {
			return r.skip(k, depth)
		}
		// The first type, text and refusal of the part.
		var typ, text, refusal Value
		var textEsc, refusalEsc bool
		e, ok := r.each(k, depth, func(key string, k, depth int) int {
			var p *Value
			var pesc *bool
			switch key {
			case "type":
				p = &typ
			case "text":
				p, pesc = &text, &textEsc
			case "refusal":
				p, pesc = &refusal, &refusalEsc
			default:
				return r.skip(k, depth)
			}
			v, esc, e := r.value(k, depth)
			if p.Kind == 0 {
				*p = v
				if pesc != nil {
					*pesc = esc
				} else if esc {
					r.Fallback = true // a type spelled with escapes
				}
			}
			return e
		})
		if !ok {
			return -1
		}
		if typ.Kind != '"' {
			return e
		}
		switch r.Body[typ.Start+1 : typ.End-1] {
		case "text", "input_text", "output_text":
			r.ops = append(r.ops, op{kind: opText, a: r.strOf(text, textEsc), b: -1})
		case "refusal":
			r.ops = append(r.ops, op{kind: opText, a: r.strOf(refusal, refusalEsc), b: -1})
		case "image_url", "input_image", "image":
			fd.images++
			r.ops = append(r.ops, op{kind: opImage, a: -1, b: -1})
		}
		return e
	})
	if !ok {
		return -1
	}
	return e
}

// strOf adds v to Strs, counted, when it is a string, and returns its
// index or -1.
func (r *Reader) strOf(v Value, esc bool) int32 {
	if v.Kind != '"' {
		return -1
	}
	return r.str(v, esc, true)
}

// toolCalls reads a message's tool calls: each element (or member value)
// is a call whose first "function" gives the first "name" and
// "arguments".
func (r *Reader) toolCalls(j, depth int, m *msgRec) int {
	start := int32(len(r.ops))
	defer func() { m.calls = [2]int32{start, int32(len(r.ops))} }()
	if c := r.Body[j]; c != '[' && c != '{' {
		return r.skip(j, depth)
	}
	e, ok := r.each(j, depth, func(_ string, k, depth int) int {
		name, args := int32(-1), int32(-1)
		var e int
		if r.Body[k] != '{' {
			e = r.skip(k, depth)
		} else {
			seen := false
			var ok bool
			e, ok = r.each(k, depth, func(key string, k, depth int) int {
				if key != "function" || seen || r.Body[k] != '{' {
					seen = seen || key == "function"
					return r.skip(k, depth)
				}
				seen = true
				var e int
				e, name, args = r.nameArgs(k, depth)
				return e
			})
			if !ok {
				e = -1
			}
		}
		r.ops = append(r.ops, op{kind: opCall, a: name, b: args})
		return e
	})
	if !ok {
		return -1
	}
	return e
}

// functionCall reads a message's function_call: its first "name" and
// "arguments" are counted.
func (r *Reader) functionCall(j, depth int) int {
	if r.Body[j] != '{' {
		return r.skip(j, depth)
	}
	e, _, _ := r.nameArgs(j, depth)
	return e
}

// nameArgs reads the object at Body[j] and adds its first "name" and
// "arguments" to Strs, counted, when they are strings.
func (r *Reader) nameArgs(j, depth int) (end int, name, args int32) {
	var nv, av Value
	var nesc, aesc bool
	e, ok := r.each(j, depth, func(key string, k, depth int) int {
		var p *Value
		var pesc *bool
		switch key {
		case "name":
			p, pesc = &nv, &nesc
		case "arguments":
			p, pesc = &av, &aesc
		default:
			return r.skip(k, depth)
		}
		v, esc, e := r.value(k, depth)
		if p.Kind == 0 {
			*p, *pesc = v, esc
		}
		return e
	})
	if !ok {
		return -1, -1, -1
	}
	// In body order, as the count reads them.
	if nv.Start < av.Start || av.Kind == 0 {
		name, args = r.strOf(nv, nesc), r.strOf(av, aesc)
	} else {
		args, name = r.strOf(av, aesc), r.strOf(nv, nesc)
	}
	return e, name, args
}

// inputs reads a completions prompt or an embeddings input: a string, or
// an array of strings, token ids and arrays of token ids.
func (r *Reader) inputs(j, depth int, fd *field) int {
	if r.Body[j] != '[' {
		v, esc, e := r.value(j, depth)
		fd.v = v
		if v.Kind == '"' {
			r.str(v, esc, true)
		}
		return e
	}
	e, ok := r.each(j, depth, func(_ string, k, depth int) int {
		switch r.Body[k] {
		case '"':
			v, esc, e := r.value(k, depth)
			if e >= 0 {
				r.str(v, esc, true)
			}
			return e
		case '[':
			e, ok := r.each(k, depth, func(_ string, k, depth int) int {
				v, _, e := r.value(k, depth)
				if v.Kind == 'n' {
					fd.consts++ // a token id
				}
				return e
			})
			if !ok {
				return -1
			}
			return e
		}
		v, _, e := r.value(k, depth)
		if v.Kind == 'n' {
			fd.consts++ // a token id
		}
		return e
	})
	if !ok {
		return -1
	}
	fd.v = Value{j, e, '['}
	return e
}

// StrCounter counts the tokens of the Reader's strings (Str, by index into
// Strs) and of a tools block (Tools, given its raw JSON).
type StrCounter interface {
	Str(i int) int
	Tools(raw string) int
}

// Tokens counts the prompt the Reader read as the API bills it (the formula
// of Tokens), with image the estimate of one image part.
func (r *Reader) Tokens(c StrCounter, image int) int {
	n := 0
	switch r.Endpoint {
	case Chat:
		fd := &r.fields[fMessages]
		if fd.v.Kind != '[' {
			return 0
		}
		n = r.strTokens(c, fd, image)
	case Responses:
		if fd := &r.fields[fInstructions]; fd.v.Kind == '"' {
			n += tokensPerMessage + r.strTokens(c, fd, image)
		}
		switch fd := &r.fields[fInput]; fd.v.Kind {
		case '"':
			n += tokensPerMessage + r.strTokens(c, fd, image)
		case '[':
			n += r.strTokens(c, fd, image)
		default:
			return n
		}
	case Completions:
		return r.strTokens(c, &r.fields[fPrompt], image)
	case Embeddings:
		return r.strTokens(c, &r.fields[fInput], image)
	default:
		return 0
	}
	n += tokensReply
	if t := r.fields[fTools].v; t.Kind == '[' && t.End-t.Start > 2 {
		n += c.Tools(r.Body[t.Start:t.End])
	}
	return n
}

func (r *Reader) strTokens(c StrCounter, fd *field, image int) int {
	n := fd.consts + fd.images*image
	for i := fd.strs[0]; i < fd.strs[1]; i++ {
		if r.Strs[i].Counted {
			n += c.Str(i)
		}
	}
	return n
}

// Canon builds the canonical prompt (see AppendCanonical) of what a Reader
// read.
type Canon struct {
	Buf   []byte
	Limit int
	// At[i] is the offset in Buf at which Strs[i] starts, or -1 when it is
	// not in Buf (not in the canonical prompt, or past Limit).
	At []int32
	// End[i] is the offset in Buf just past Strs[i] when all of it is in
	// Buf (decoded: Buf[At[i]:End[i]] is what AppendStr gives), else -1.
	End []int32
}

// AppendCanonical builds into c.Buf the canonical prompt of the body,
// stopping once it holds c.Limit bytes, and fills c.At.
func (r *Reader) AppendCanonical(c *Canon) {
	c.At, c.End = c.At[:0], c.End[:0]
	for range r.Strs {
		c.At, c.End = append(c.At, -1), append(c.End, -1)
	}
	b := canonBuilder{r: r, c: c}
	b.canonical()
}

// Piece is a piece of the canonical prompt: the decoded string Strs[Str],
// or Lit when Str is -1.
type Piece struct {
	Str int32
	Lit string
}

// PieceSink takes pieces until it returns false.
type PieceSink interface{ Piece(Piece) bool }

// CanonicalPieces tells f the pieces of the canonical prompt, whose
// concatenation AppendCanonical builds, in order, until f returns false.
func (r *Reader) CanonicalPieces(f PieceSink) {
	b := canonBuilder{r: r, f: f}
	b.canonical()
}

func (b *canonBuilder) canonical() {
	r := b.r
	switch r.Endpoint {
	case Chat:
		fd := &r.fields[fMessages]
		leading := true
		for _, m := range r.msgs[fd.msgs[0]:fd.msgs[1]] {
			if b.full() {
				break
			}
			if leading && !m.leading(r.Body) {
				leading = false
				b.tools()
			}
			b.message(&m)
		}
		if leading {
			b.tools()
		}
	case Responses:
		if fd := &r.fields[fInstructions]; fd.v.Kind == '"' && fd.v.End-fd.v.Start > 2 {
			b.lit("system\n")
			b.str(int32(fd.strs[0]))
			b.lit("\n")
		}
		b.tools()
		switch fd := &r.fields[fInput]; fd.v.Kind {
		case '"':
			if fd.v.End-fd.v.Start > 2 {
				b.lit("user\n")
				b.str(int32(fd.strs[0]))
				b.lit("\n")
			}
		case '[':
			for _, m := range r.msgs[fd.msgs[0]:fd.msgs[1]] {
				if b.full() {
					break
				}
				b.message(&m)
			}
		}
	case Completions, Embeddings:
		fd := &r.fields[fInput]
		if r.Endpoint == Completions {
			fd = &r.fields[fPrompt]
		}
		for i := fd.strs[0]; i < fd.strs[1] && !b.full(); i++ {
			if i > fd.strs[0] {
				b.lit("\n")
			}
			b.str(int32(i))
		}
	}
}

// AppendAnchor appends to c.Buf the canonical text of the conversation's
// anchor, stopping once it holds c.Limit bytes: the first message of a
// chat request (of a Responses input array) after the leading system and
// developer messages, written as AppendCanonical writes it, when at least
// one more message follows it. A one-shot request or a conversation's
// first turn has none. It leaves c.At alone.
func (r *Reader) AppendAnchor(c *Canon) {
	if m := r.anchor(); m != nil {
		b := canonBuilder{r: r, c: c, noAt: true}
		b.message(m)
	}
}

// AnchorPieces tells f the pieces of the conversation's anchor, whose
// concatenation AppendAnchor appends, in order, until f returns false.
func (r *Reader) AnchorPieces(f PieceSink) {
	if m := r.anchor(); m != nil {
		b := canonBuilder{r: r, f: f}
		b.message(m)
	}
}

// anchor returns the conversation's anchor message, or nil.
func (r *Reader) anchor() *msgRec {
	var fd *field
	switch r.Endpoint {
	case Chat:
		fd = &r.fields[fMessages]
	case Responses:
		fd = &r.fields[fInput]
		if fd.v.Kind != '[' {
			return nil
		}
	default:
		return nil
	}
	msgs := r.msgs[fd.msgs[0]:fd.msgs[1]]
	for i := range msgs {
		if m := &msgs[i]; !m.leading(r.Body) {
			if i+1 < len(msgs) {
				return m
			}
			return nil
		}
	}
	return nil
}

// leading reports whether m is a system or developer message, as the
// leading messages of a chat request are (by its first "role").
func (m *msgRec) leading(body string) bool {
	role := m.firstRole
	return m.object && role.Kind != 0 && (body[role.Start:role.End] == `"system"` || body[role.Start:role.End] == `"developer"`)
}

// canonBuilder builds a canonical prompt into c or, when f is set, tells f
// its pieces until f returns false.
type canonBuilder struct {
	r       *Reader
	c       *Canon
	f       PieceSink
	stopped bool
	noAt    bool // leave c.At alone
}

func (b *canonBuilder) full() bool {
	if b.f != nil {
		return b.stopped
	}
	return len(b.c.Buf) >= b.c.Limit
}

func (b *canonBuilder) lit(s string) {
	if b.f != nil {
		b.stopped = b.stopped || !b.f.Piece(Piece{Str: -1, Lit: s})
		return
	}
	if n := b.c.Limit - len(b.c.Buf); n > 0 {
		b.c.Buf = append(b.c.Buf, s[:min(n, len(s))]...)
	}
}

// str appends the decoded string Strs[i], if i is one.
func (b *canonBuilder) str(i int32) {
	if i < 0 || b.full() {
		return
	}
	if b.f != nil {
		b.stopped = !b.f.Piece(Piece{Str: i})
		return
	}
	s := b.r.Strs[i]
	at := int(i) < len(b.c.At) && !b.noAt
	if at {
		b.c.At[i] = int32(len(b.c.Buf))
	}
	if !s.Esc {
		b.lit(b.r.Body[s.Start:s.End])
	} else {
		b.c.Buf = jsonscan.AppendUnescaped(b.c.Buf, b.r.Body[s.Start:s.End], b.c.Limit)
	}
	if at && int(i) < len(b.c.End) && len(b.c.Buf) < b.c.Limit { // not cut by Limit
		b.c.End[i] = int32(len(b.c.Buf))
	}
}

func (b *canonBuilder) tools() {
	if t := b.r.fields[fTools].v; t.Kind == '[' && t.End-t.Start > 2 && !b.full() {
		b.lit("tools\n")
		b.lit(b.r.Body[t.Start:t.End])
		b.lit("\n")
	}
}

func (b *canonBuilder) message(m *msgRec) {
	if !m.object || b.full() {
		return
	}
	if m.roleSet {
		b.str(m.role)
	} else {
		b.str(m.typ)
	}
	b.lit("\n")
	for _, o := range b.r.ops[m.content[0]:m.content[1]] {
		switch o.kind {
		case opText:
			b.str(o.a)
			b.lit("\n")
		case opImage:
			b.lit("<image>\n")
		}
	}
	for _, o := range b.r.ops[m.calls[0]:m.calls[1]] {
		b.call(o.a, o.b)
	}
	if m.typ >= 0 && b.r.Raw(b.r.Strs[m.typ]) == "function_call" {
		b.call(m.name, m.args)
	}
	if m.output >= 0 {
		b.str(m.output)
		b.lit("\n")
	}
}

func (b *canonBuilder) call(name, args int32) {
	b.str(name)
	b.lit("(")
	b.str(args)
	b.lit(")\n")
}
