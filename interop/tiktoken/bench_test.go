package tiktoken

import (
	"bytes"
	"testing"
	"unsafe"

	"github.com/tiktoken-go/tokenizer"

	. "github.com/tokenrelay/relay/internal/bpe"
	"github.com/tokenrelay/relay/internal/corpus"
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
			text := corpus.Mixed(size.n)
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
	for _, c := range corpus.Bench(b) {
		for _, enc := range []struct {
			name string
			e    *Encoding
			tk   tokenizer.Encoding
		}{{"o200k", O200K(), tokenizer.O200kBase}, {"cl100k", CL100K(), tokenizer.Cl100kBase}} {
			codec, err := tokenizer.Get(enc.tk)
			if err != nil {
				b.Fatal(err)
			}
			b.Run(c.Name+"/"+enc.name+"/relay", func(b *testing.B) {
				checkCorpusCount(b, c, enc.e, codec)
				b.SetBytes(int64(len(c.Text)))
				b.ReportAllocs()
				for b.Loop() {
					enc.e.Count(c.Text)
				}
			})
			b.Run(c.Name+"/"+enc.name+"/relay-cold", func(b *testing.B) {
				b.SetBytes(int64(len(c.Text)))
				b.ReportAllocs()
				for b.Loop() {
					b.StopTimer()
					enc.e.ResetCache()
					b.StartTimer()
					enc.e.Count(c.Text)
				}
			})
			b.Run(c.Name+"/"+enc.name+"/tokenizer", func(b *testing.B) {
				b.SetBytes(int64(len(c.Text)))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := codec.Count(c.Text); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// checkCorpusCount fails b unless e counts c exactly.
func checkCorpusCount(b *testing.B, c corpus.Corpus, e *Encoding, codec tokenizer.Codec) {
	got := e.Count(c.Text)
	if c.Quadratic {
		want, err := codec.Count(c.Text)
		if err != nil {
			b.Fatal(err)
		}
		if heap := e.CountHeap(c.Text); got != want || heap != want {
			b.Fatalf("%s/%s: Count = %d, heap merge %d, tokenizer %d", c.Name, e.Name(), got, heap, want)
		}
	} else if want := len(reference(b, e.Name()).EncodeOrdinary(c.Text)); got != want {
		b.Fatalf("%s/%s: Count = %d, tiktoken-go = %d", c.Name, e.Name(), got, want)
	}
}

// BenchmarkPromptCount counts a new chat prompt's contents (promptTexts,
// each line's number rewritten every iteration, so that no line was seen
// before while its words were: the piece cache warm, as in a router that
// has run a while) with relay's counter and with tiktoken-go's, the
// peer, in the same run: what counting costs the router per new request.
//
// relay-full is relay with its piece cache full first of other texts'
// pieces (fullCacheFiller), as a service's soon is: the prompt's pieces
// then sit in any way of their sets, and each lookup goes through more of
// them.
func BenchmarkPromptCount(b *testing.B) {
	ref := reference(b, "o200k_base")
	for _, name := range []string{"relay", "relay-full", "tiktoken-go"} {
		b.Run(name, func(b *testing.B) {
			texts := corpus.PromptTexts()
			count := O200K().Count
			switch name {
			case "relay-full":
				e := Load("o200k_base")
				e.Count(corpus.FullCacheFiller())
				count = e.Count
			case "tiktoken-go":
				count = func(s string) int { return len(ref.EncodeOrdinary(s)) }
			}
			n := uint64(0)
			renew := func() {
				n++
				for _, t := range texts {
					for at := 0; at+10 <= len(t); at += 10 + bytes.IndexByte(t[at+10:], '\n') + 1 {
						v := n
						for d := 8; d >= 0; d-- {
							t[at+d] = byte('0' + v%10)
							v /= 10
						}
					}
				}
			}
			for range 2000 { // the piece cache learns the words
				renew()
				for _, t := range texts {
					count(unsafe.String(unsafe.SliceData(t), len(t)))
				}
			}
			for b.Loop() {
				renew()
				for _, t := range texts {
					count(unsafe.String(unsafe.SliceData(t), len(t)))
				}
			}
		})
	}
}
