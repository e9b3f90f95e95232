//go:build !linux

package bpe

// allocTable returns a zeroed slice of n values of type T.
func allocTable[T any](n int) []T { return make([]T, n) }
