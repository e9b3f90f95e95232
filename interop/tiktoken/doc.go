// Package tiktoken holds the tests that hold relay's token counter
// (internal/bpe) to github.com/pkoukk/tiktoken-go, count for count, and to
// the vocabularies of github.com/pkoukk/tiktoken-go-loader, and the
// benchmarks that put it beside tiktoken-go and
// github.com/tiktoken-go/tokenizer. It has no code of its own.
package tiktoken
