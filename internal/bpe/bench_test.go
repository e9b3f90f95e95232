package bpe

import (
	"strings"
	"testing"

	"github.com/tiktoken-go/tokenizer"
)

var benchSizes = []struct {
	name string
	n    int
}{{"1KB", 1 << 10}, {"16KB", 16 << 10}, {"128KB", 128 << 10}}

func BenchmarkCount(b *testing.B) {
	for _, enc := range []struct {
		name string
		e    *Encoding
		tk   tokenizer.Encoding
	}{{"cl100k", CL100K(), tokenizer.Cl100kBase}, {"o200k", O200K(), tokenizer.O200kBase}} {
		ref := reference(b, enc.e.Name())
		codec, err := tokenizer.Get(enc.tk)
		if err != nil {
			b.Fatal(err)
		}
		for _, size := range benchSizes {
			text := mixedCorpus(size.n)
			want := len(ref.EncodeOrdinary(text))
			if got := enc.e.Count(text); got != want {
				b.Fatalf("%s/%s: Count = %d, tiktoken-go = %d", enc.name, size.name, got, want)
			}
			b.Run(enc.name+"/"+size.name+"/relay", func(b *testing.B) {
				enc.e.Count(text)
				b.SetBytes(int64(len(text)))
				b.ReportAllocs()
				for b.Loop() {
					enc.e.Count(text)
				}
			})
			b.Run(enc.name+"/"+size.name+"/tiktoken-go", func(b *testing.B) {
				b.SetBytes(int64(len(text)))
				b.ReportAllocs()
				for b.Loop() {
					ref.EncodeOrdinary(text)
				}
			})
			b.Run(enc.name+"/"+size.name+"/tokenizer", func(b *testing.B) {
				b.SetBytes(int64(len(text)))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := codec.Count(text); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

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

// BenchmarkCorpus counts the four corpora of benchCorpora with relay and
// with github.com/tiktoken-go/tokenizer, side by side:
//
//   - prose: 1 MiB of English prose (natural-language prompts; words
//     repeat with Zipf frequencies);
//   - gosource: 1 MiB of Go source from GOROOT (code in prompts);
//   - cjkemoji: 256 KiB of Chinese, Japanese and Korean with emoji (East
//     Asian chat; long pre-tokens of whole clauses);
//   - letter: 256 KiB of one letter (a single pre-token: the linear
//     long-piece path, and the worst case of naive byte-pair merging).
//
// relay counts with its piece cache as it is after the first count of the
// text (a text counted again: a system prompt, a chat history), relay-cold
// with the cache emptied before each count (a text seen for the first
// time; pre-tokens that repeat within it still hit). Counts are checked
// against tiktoken-go first (for letter, whose reference is quadratic,
// against tokenizer and the heap merge).
func BenchmarkCorpus(b *testing.B) {
	for _, c := range benchCorpora(b) {
		for _, enc := range []struct {
			name string
			e    *Encoding
			tk   tokenizer.Encoding
		}{{"o200k", O200K(), tokenizer.O200kBase}, {"cl100k", CL100K(), tokenizer.Cl100kBase}} {
			codec, err := tokenizer.Get(enc.tk)
			if err != nil {
				b.Fatal(err)
			}
			b.Run(c.name+"/"+enc.name+"/relay", func(b *testing.B) {
				checkCorpusCount(b, c, enc.e, codec)
				b.SetBytes(int64(len(c.text)))
				b.ReportAllocs()
				for b.Loop() {
					enc.e.Count(c.text)
				}
			})
			b.Run(c.name+"/"+enc.name+"/relay-cold", func(b *testing.B) {
				b.SetBytes(int64(len(c.text)))
				b.ReportAllocs()
				for b.Loop() {
					b.StopTimer()
					enc.e.cache.reset()
					b.StartTimer()
					enc.e.Count(c.text)
				}
			})
			b.Run(c.name+"/"+enc.name+"/tokenizer", func(b *testing.B) {
				b.SetBytes(int64(len(c.text)))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := codec.Count(c.text); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// checkCorpusCount fails b unless e counts c exactly.
func checkCorpusCount(b *testing.B, c benchCorpus, e *Encoding, codec tokenizer.Codec) {
	got := e.Count(c.text)
	if c.quadratic {
		want, err := codec.Count(c.text)
		if err != nil {
			b.Fatal(err)
		}
		if heap := e.mergeHeap(c.text, new(scratch)); got != want || heap != want {
			b.Fatalf("%s/%s: Count = %d, heap merge %d, tokenizer %d", c.name, e.Name(), got, heap, want)
		}
	} else if want := len(reference(b, e.Name()).EncodeOrdinary(c.text)); got != want {
		b.Fatalf("%s/%s: Count = %d, tiktoken-go = %d", c.name, e.Name(), got, want)
	}
}
