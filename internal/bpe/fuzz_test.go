package bpe

import (
	"testing"

	"github.com/tokenrelay/relay/internal/corpus"
)

// FuzzPrefixes holds Prefixes to countPiece on every prefix of a piece, in
// both encodings: when s[:m] is one pre-token, that is Count(s[:m]).
func FuzzPrefixes(f *testing.F) {
	for _, s := range corpus.HandWritten {
		f.Add(s)
	}
	f.Add("xqzvbnmlkjhgfdsapoiuytrewq")
	for _, e := range encodings() {
		e.Warm()
	}
	f.Fuzz(func(t *testing.T, s string) {
		if s == "" || len(s) > 1<<10 {
			t.Skip()
		}
		sc := new(scratch)
		for _, e := range encodings() {
			var p Prefixes
			if !e.Prefixes(&p, s, len(s)) {
				t.Fatalf("%s: Prefixes refused with the tables built", e.Name())
			}
			for m := 1; m <= len(s); m++ {
				if got, want := p.Count(m), e.countPiece(s[:m], sc); got != want {
					t.Fatalf("%s: %q: prefix of %d bytes counts %d, want %d", e.Name(), s, m, got, want)
				}
			}
		}
	})
}
