//go:build !linux

package bpe

// allocTable returns zeroed memory for n values of type T.
func allocTable[T, O any](n int, owner *O) []T { return make([]T, n) }
