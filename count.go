package relay

import "github.com/tokenrelay/relay/internal/bpe"

// countTokens returns the number of tokens of s in enc, special tokens
// counted as plain text. It is exact (the same count as tiktoken) and linear
// in len(s), also on pathological input such as a megabyte of one letter.
func countTokens(enc encoding, s string) int {
	if enc == cl100k {
		return bpe.CL100K().Count(s)
	}
	return bpe.O200K().Count(s)
}
