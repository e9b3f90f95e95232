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
