package bpe

import "testing"

func FuzzCountParity(f *testing.F) {
	for _, s := range handCorpus {
		f.Add(s)
	}
	f.Add(mixedCorpus(1 << 10))
	cl, o := reference(f, "cl100k_base"), reference(f, "o200k_base")
	f.Fuzz(func(t *testing.T, s string) {
		if len(s) > 4<<10 {
			t.Skip("reference is quadratic on long inputs")
		}
		if got, want := CL100K().Count(s), len(cl.EncodeOrdinary(s)); got != want {
			t.Errorf("cl100k_base: Count(%q) = %d, tiktoken-go = %d", s, got, want)
		}
		if got, want := O200K().Count(s), len(o.EncodeOrdinary(s)); got != want {
			t.Errorf("o200k_base: Count(%q) = %d, tiktoken-go = %d", s, got, want)
		}
	})
}

// FuzzPrefixes holds Prefixes to countPiece on every prefix of a piece, in
// both encodings: when s[:m] is one pre-token, that is Count(s[:m]).
func FuzzPrefixes(f *testing.F) {
	for _, s := range handCorpus {
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
