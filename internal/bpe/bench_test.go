package bpe

import (
	"strings"
	"testing"

	"github.com/tokenrelay/relay/internal/corpus"
)

// BenchmarkWorstCase measures single 1 MiB pre-tokens (one piece each), which
// exercise the O(n log n) merge path.
func BenchmarkWorstCase(b *testing.B) {
	const n = 1 << 20
	cases := []struct{ name, text string }{
		{"letter", strings.Repeat("a", n)},
		{"spaces", strings.Repeat(" ", n)},
		{"newlines", strings.Repeat("\n", n)},
		{"emoji", strings.Repeat("😀", n/4)},
	}
	for _, c := range cases {
		for _, e := range encodings() {
			b.Run(c.name+"/"+e.Name(), func(b *testing.B) {
				e.Count(c.text) // warm up: lazy tables and pooled buffers
				b.SetBytes(int64(len(c.text)))
				b.ReportAllocs()
				for b.Loop() {
					e.Count(c.text)
				}
			})
		}
	}
}

// BenchmarkCorpusFullCache counts the prose and Go source corpora as a
// service that has run a while does: its piece cache full, every slot of
// every set taken by pieces of other texts (corpus.FullCacheFiller, counted
// first) that are never counted again. Each
// corpus is then counted three times before timing, so that the rows read
// how well a full cache makes room for the pieces now in use (relay, the
// corpus's own warm row in BenchmarkCorpus (module interop), is the same count with a
// cache that had room).
func BenchmarkCorpusFullCache(b *testing.B) {
	filler := corpus.FullCacheFiller()
	for _, c := range corpus.Bench(b)[:2] {
		for _, enc := range []struct {
			name  string
			o200k bool
		}{{"o200k", true}, {"cl100k", false}} {
			b.Run(c.Name+"/"+enc.name, func(b *testing.B) {
				e := mustLoad(enc.name+"_base", enc.o200k)
				e.Count(filler)
				want := e.Count(c.Text)
				e.Count(c.Text)
				e.Count(c.Text)
				b.SetBytes(int64(len(c.Text)))
				for b.Loop() {
					if e.Count(c.Text) != want {
						b.Fatal("the count changed")
					}
				}
			})
		}
	}
}
