package prompt

import (
	"strings"

	"github.com/tidwall/gjson"
)

// Token counting follows OpenAI's published formula for chat ("How to count
// tokens with tiktoken"): 3 tokens per message, the tokens of every string
// field of the message (role, content, name, tool_call_id), 1 more per name,
// and 3 for the reply priming. Content-part arrays count their text parts
// and a fixed estimate per image part; tool calls count their function name
// and arguments. Tool definitions use the cookbook's function-calling
// estimate (7 per function for gpt-4o and later, 10 for gpt-4 and
// gpt-3.5-turbo; 3 per property, 12 at the end, names, types, descriptions
// and enum values counted).
const (
	tokensPerMessage = 3
	tokensPerName    = 1
	tokensReply      = 3
	toolPropInit     = 3
	toolPropKey      = 3
	toolEnumInit     = -3
	toolEnumItem     = 3
	toolFuncEnd      = 12
)

// Fields are the top-level fields of a request body a count reads.
type Fields struct {
	Messages, Input, Prompt, Instructions, Tools gjson.Result
}

// Counter counts the tokens of a string (Text) and of a tools block
// (Tools, which may memoize; it calls ToolsTokens to count).
type Counter interface {
	Text(s string) int
	Tools(tools gjson.Result) int
}

// Tokens counts a request's prompt as the API bills it, with c counting
// strings and image the estimate of one image part.
func Tokens[C Counter](c C, image int, endpoint string, f *Fields) int {
	switch endpoint {
	case Chat:
		if !f.Messages.IsArray() {
			return 0
		}
		n := 0
		f.Messages.ForEach(func(_, m gjson.Result) bool {
			n += message(c, image, m)
			return true
		})
		return n + tokensReply + c.Tools(f.Tools)
	case Responses:
		n := 0
		if ins := f.Instructions; ins.Type == gjson.String {
			n += tokensPerMessage + c.Text(ins.Str)
		}
		switch in := f.Input; {
		case in.Type == gjson.String:
			n += tokensPerMessage + c.Text(in.Str)
		case in.IsArray():
			in.ForEach(func(_, item gjson.Result) bool {
				n += message(c, image, item)
				return true
			})
		default:
			return n
		}
		return n + tokensReply + c.Tools(f.Tools)
	case Completions:
		return inputs(c, f.Prompt)
	case Embeddings:
		return inputs(c, f.Input)
	}
	return 0
}

// message counts one chat message or Responses input item. A member
// repeated in it counts its last occurrence only, as upstreams read it.
func message[C Counter](c C, image int, m gjson.Result) int {
	if !m.IsObject() {
		return 0
	}
	type counted struct {
		key string
		n   int
	}
	var (
		members []counted
		byName  map[string]int // past 8 members, so that many are counted in linear time
	)
	m.ForEach(func(k, v gjson.Result) bool {
		n := 0
		switch k.Str {
		case "content":
			n += content(c, image, v)
		case "name":
			if v.Type == gjson.String {
				n += c.Text(v.Str) + tokensPerName
			}
		case "tool_calls":
			v.ForEach(func(_, call gjson.Result) bool {
				fn := call.Get("function")
				n += c.Text(fn.Get("name").Str) + c.Text(fn.Get("arguments").Str)
				return true
			})
		case "function_call":
			n += c.Text(v.Get("name").Str) + c.Text(v.Get("arguments").Str)
		case "type", "id", "status":
			// Responses item framing, not billed text.
		default:
			if v.Type == gjson.String { // role, tool_call_id, arguments, output, ...
				n += c.Text(v.Str)
			}
		}
		if byName == nil && len(members) >= 8 {
			byName = make(map[string]int, 2*len(members))
			for i, mb := range members {
				byName[mb.key] = i
			}
		}
		if byName != nil {
			if i, ok := byName[k.Str]; ok {
				members[i].n = n
				return true
			}
			byName[k.Str] = len(members)
		} else {
			for i := range members {
				if members[i].key == k.Str {
					members[i].n = n
					return true
				}
			}
		}
		members = append(members, counted{k.Str, n})
		return true
	})
	n := tokensPerMessage
	for _, mb := range members {
		n += mb.n
	}
	return n
}

// content counts a string content or an array of content parts.
func content[C Counter](c C, image int, v gjson.Result) int {
	if v.Type == gjson.String {
		return c.Text(v.Str)
	}
	if !v.IsArray() {
		return 0
	}
	n := 0
	v.ForEach(func(_, part gjson.Result) bool {
		switch part.Get("type").Str {
		case "text", "input_text", "output_text":
			n += c.Text(part.Get("text").Str)
		case "image_url", "input_image", "image":
			n += image
		case "refusal":
			n += c.Text(part.Get("refusal").Str)
		}
		return true
	})
	return n
}

// The cookbook's tokens per function definition: for the o200k_base models
// (gpt-4o and later), and for the cl100k_base ones (gpt-4, gpt-3.5-turbo).
const (
	FuncInitO200K  = 7
	FuncInitCL100K = 10
)

// ToolsTokens estimates the tokens of tool definitions with the cookbook's
// function-calling formula for the o200k_base models; count counts one
// string.
func ToolsTokens(count func(string) int, tools gjson.Result) int {
	return ToolsTokensFor(count, tools, FuncInitO200K)
}

// ToolsTokensFor is ToolsTokens with funcInit tokens per function
// (FuncInitO200K or FuncInitCL100K).
func ToolsTokensFor(count func(string) int, tools gjson.Result, funcInit int) int {
	if !tools.IsArray() || len(tools.Raw) <= 2 {
		return 0
	}
	n := 0
	tools.ForEach(func(_, t gjson.Result) bool {
		n += tool(count, t, funcInit)
		return true
	})
	if n > 0 {
		n += toolFuncEnd
	}
	return n
}

// tool counts one tool definition (chat's {"function": {...}} or the
// Responses API's flat shape).
func tool(count func(string) int, t gjson.Result, funcInit int) int {
	fn := t.Get("function")
	if !fn.Exists() {
		fn = t
	}
	name := fn.Get("name")
	if name.Type != gjson.String {
		return 0
	}
	n := funcInit + count(name.Str+":"+strings.TrimSuffix(fn.Get("description").Str, "."))
	props := fn.Get("parameters.properties")
	if !props.IsObject() || len(props.Raw) <= 2 {
		return n
	}
	n += toolPropInit
	props.ForEach(func(key, p gjson.Result) bool {
		n += toolPropKey
		if enum := p.Get("enum"); enum.IsArray() {
			n += toolEnumInit
			enum.ForEach(func(_, item gjson.Result) bool {
				n += toolEnumItem + count(item.String())
				return true
			})
		}
		n += count(key.Str + ":" + p.Get("type").String() + ":" + strings.TrimSuffix(p.Get("description").Str, "."))
		return true
	})
	return n
}

// inputs counts a completions prompt or an embeddings input: a string, an
// array of strings, an array of token ids, or an array of such arrays.
func inputs[C Counter](c C, v gjson.Result) int {
	switch {
	case v.Type == gjson.String:
		return c.Text(v.Str)
	case v.IsArray():
		n := 0
		v.ForEach(func(_, e gjson.Result) bool {
			switch {
			case e.Type == gjson.String:
				n += c.Text(e.Str)
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
