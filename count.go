package relay

import (
	"sync"

	"github.com/pkoukk/tiktoken-go"
	tiktoken_loader "github.com/pkoukk/tiktoken-go-loader"
)

// countTokens returns the number of tokens of s in enc, special tokens
// counted as plain text.
func countTokens(enc encoding, s string) int {
	t := encodings()[enc]
	if t == nil {
		return (len(s) + 3) / 4
	}
	return len(t.EncodeOrdinary(s))
}

var encodings = sync.OnceValue(func() [2]*tiktoken.Tiktoken {
	tiktoken.SetBpeLoader(tiktoken_loader.NewOfflineLoader())
	var e [2]*tiktoken.Tiktoken
	e[o200k], _ = tiktoken.GetEncoding("o200k_base")
	e[cl100k], _ = tiktoken.GetEncoding("cl100k_base")
	return e
})
