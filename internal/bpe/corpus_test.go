package bpe

import (
	"math/rand/v2"
	"strings"
)

var corpusParts = []string{
	"The relay forwards requests to the upstream model provider and counts tokens on the way. ",
	"It's important that we'll never under-count; they'd notice the bill.\n\n",
	"func (r *Router) Route(ctx context.Context, req *Request) (*Response, error) {\n\tif req == nil {\n\t\treturn nil, errNilRequest\n\t}\n\treturn r.next.Do(ctx, req)\n}\n",
	`{"model":"gpt-4o","messages":[{"role":"user","content":"Summarize: 12345 items, 3.5% off"}],"max_tokens":256,"stream":true}` + "\n",
	"## Usage\n\n1. Install with `go get`.\n2. Run `relay serve --port 8080`.\n\n| key | value |\n|-----|-------|\n| a   | 1     |\n",
	"日本語の文章をトークン化します。これはテストです。", "Съешь же ещё этих мягких французских булок, да выпей чаю. ",
	"هذا نص عربي للاختبار. ", "यह एक परीक्षण वाक्य है। ", "นี่คือประโยคทดสอบภาษาไทย ", "👋 Hello 👨‍👩‍👧‍👦! Great job 👍🏽🎉\n",
	"    def compute(self, x):\r\n        return x ** 2  # square\r\n", "<|endoftext|>", "   \n\t\n",
}

// mixedCorpus deterministically generates about n bytes of mixed text.
func mixedCorpus(n int) string {
	rng := rand.New(rand.NewPCG(42, uint64(n)))
	var sb strings.Builder
	for sb.Len() < n {
		sb.WriteString(corpusParts[rng.IntN(len(corpusParts))])
	}
	s := sb.String()[:n]
	for len(s) > 0 && !isRuneStart(s[len(s)-1]) {
		s = s[:len(s)-1]
	}
	return s
}

func isRuneStart(b byte) bool { return b < 0x80 }
