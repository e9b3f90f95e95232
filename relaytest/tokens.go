package relaytest

import (
	"regexp"
	"strings"
	"unicode"

	"github.com/tidwall/gjson"

	"github.com/tokenrelay/relay/internal/bpe"
	"github.com/tokenrelay/relay/internal/prompt"
)

// countTokens returns the exact number of o200k_base tokens of text (the
// project's linear-time counter, built on tiktoken's embedded BPE ranks).
func countTokens(text string) int {
	return bpe.O200K().Count(text)
}

// promptTokens counts the prompt of a request body for an endpoint
// ("chat/completions", "responses", "completions", "embeddings") with the
// router's own formula (OpenAI's published chat formula: 3 tokens per
// message, the tokens of every string field of a message, 1 more per name,
// 3 for the reply priming, tool definitions by the cookbook's estimate), in
// o200k_base. Images count nothing.
func promptTokens(endpoint string, root gjson.Result) int {
	f := prompt.Fields{Messages: root.Get("messages"), Input: root.Get("input"), Prompt: root.Get("prompt"),
		Instructions: root.Get("instructions"), Tools: root.Get("tools")}
	return prompt.Tokens(o200kCounter{}, 0, endpoint, &f)
}

// PromptTokens returns the prompt tokens a Server reports for a request
// to endpoint ("chat/completions", "responses", "completions",
// "embeddings") whose body is body (see promptTokens); 0 for a body that is
// not JSON.
func PromptTokens(endpoint string, body []byte) int {
	if !gjson.ValidBytes(body) {
		return 0
	}
	return promptTokens(endpoint, gjson.ParseBytes(body))
}

// o200kCounter counts in o200k_base, without a memo.
type o200kCounter struct{}

func (o200kCounter) Text(s string) int { return countTokens(s) }

func (o200kCounter) Tools(tools gjson.Result) int { return prompt.ToolsTokens(countTokens, tools) }

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
