package relaytest

import (
	"regexp"
	"strings"
	"unicode"

	"github.com/tidwall/gjson"

	"github.com/tokenrelay/relay/internal/bpe"
)

const (
	tokensPerMessage = 3
	tokensPerName    = 1
	tokensReply      = 3
)

// countTokens returns the exact number of o200k_base tokens of text (the
// project's linear-time counter, built on tiktoken's embedded BPE ranks).
func countTokens(text string) int {
	return bpe.O200K().Count(text)
}

// promptTokens counts the prompt of a request body for an endpoint
// ("chat/completions", "responses", "completions", "embeddings"), following
// OpenAI's published chat formula: 3 tokens per message, the tokens of every
// string field of a message (role, content, name, tool_call_id), 1 more per
// name, 3 for the reply priming. Tool definitions and images are not counted.
func promptTokens(endpoint string, root gjson.Result) int {
	switch endpoint {
	case epChat:
		n := 0
		root.Get("messages").ForEach(func(_, m gjson.Result) bool {
			n += messageTokens(m)
			return true
		})
		return n + tokensReply
	case epResponses:
		n := 0
		if ins := root.Get("instructions"); ins.Type == gjson.String {
			n += tokensPerMessage + countTokens(ins.Str)
		}
		in := root.Get("input")
		switch {
		case in.Type == gjson.String:
			n += tokensPerMessage + countTokens(in.Str)
		case in.IsArray():
			in.ForEach(func(_, item gjson.Result) bool {
				n += messageTokens(item)
				return true
			})
		}
		return n + tokensReply
	case epCompletions:
		return inputTokens(root.Get("prompt"))
	case epEmbeddings:
		return inputTokens(root.Get("input"))
	}
	return 0
}

// messageTokens counts one chat message or Responses input item.
func messageTokens(m gjson.Result) int {
	if !m.IsObject() {
		return 0
	}
	n := tokensPerMessage
	m.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "content":
			n += contentTokens(v)
		case "name":
			if v.Type == gjson.String {
				n += countTokens(v.Str) + tokensPerName
			}
		case "tool_calls":
			v.ForEach(func(_, call gjson.Result) bool {
				fn := call.Get("function")
				n += countTokens(fn.Get("name").Str) + countTokens(fn.Get("arguments").Str)
				return true
			})
		case "type", "id", "status":
			// Responses item framing, not billed text.
		default:
			if v.Type == gjson.String {
				n += countTokens(v.Str)
			}
		}
		return true
	})
	return n
}

// contentTokens counts a string content or the text of content parts.
func contentTokens(v gjson.Result) int {
	if v.Type == gjson.String {
		return countTokens(v.Str)
	}
	n := 0
	if v.IsArray() {
		v.ForEach(func(_, part gjson.Result) bool {
			if t := part.Get("text"); t.Type == gjson.String {
				n += countTokens(t.Str)
			}
			return true
		})
	}
	return n
}

// inputTokens counts a completions prompt or an embeddings input: a string,
// an array of strings, an array of token ids, or an array of such arrays.
func inputTokens(v gjson.Result) int {
	switch {
	case v.Type == gjson.String:
		return countTokens(v.Str)
	case v.Type == gjson.Number:
		return 1
	case v.IsArray():
		n := 0
		v.ForEach(func(_, e gjson.Result) bool {
			n += inputTokens(e)
			return true
		})
		return n
	}
	return 0
}

// pieceRE splits text into word-sized pieces: a run of letters or digits, or
// one other character, each with the white space before it.
var pieceRE = regexp.MustCompile(`\s*(?:[\p{L}\p{N}]+|[^\s\p{L}\p{N}])|\s+`)

// Pieces returns the n pieces a Server sends as the assistant text of an
// answer that reports n completion tokens: text is split into words (a run of
// letters or digits, or one punctuation character, each with the white space
// before it); a text with more than n pieces is cut to its first n, and a
// text with fewer is repeated, separated by a space, until there are n.
// strings.Join(Pieces(text, n), "") is the message content of the answer, and
// a stream carries one content delta per piece. An empty text gives n empty
// pieces.
//
// For example Pieces("Hello from relaytest.", 8) is
// ["Hello" " from" " relaytest" "." " Hello" " from" " relaytest" "."].
func Pieces(text string, n int) []string {
	if n <= 0 {
		return nil
	}
	words := pieceRE.FindAllString(text, -1)
	out := make([]string, n)
	if len(words) == 0 {
		return out
	}
	for i := range out {
		w := words[i%len(words)]
		if i >= len(words) && i%len(words) == 0 && strings.TrimLeftFunc(w, unicode.IsSpace) == w {
			w = " " + w
		}
		out[i] = w
	}
	return out
}
