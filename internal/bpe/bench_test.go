package bpe

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"
	"unsafe"

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

// BenchmarkCorpusFullCache counts the prose and Go source corpora as a
// service that has run a while does: its piece cache full, every slot of
// every set taken by pieces of other texts (fullCacheFiller, counted
// first) that are never counted again. Each
// corpus is then counted three times before timing, so that the rows read
// how well a full cache makes room for the pieces now in use (relay, the
// corpus's own warm row in BenchmarkCorpus, is the same count with a
// cache that had room).
func BenchmarkCorpusFullCache(b *testing.B) {
	filler := fullCacheFiller()
	for _, c := range benchCorpora(b)[:2] {
		for _, enc := range []struct {
			name  string
			o200k bool
		}{{"o200k", true}, {"cl100k", false}} {
			b.Run(c.name+"/"+enc.name, func(b *testing.B) {
				e := mustLoad(enc.name+"_base", enc.o200k)
				e.Count(filler)
				want := e.Count(c.text)
				e.Count(c.text)
				e.Count(c.text)
				b.SetBytes(int64(len(c.text)))
				for b.Loop() {
					if e.Count(c.text) != want {
						b.Fatal("the count changed")
					}
				}
			})
		}
	}
}

// fullCacheFiller is 4 MiB of random lowercase words of 2 to 20 letters:
// counted first, its pieces fill every way of every set of the piece
// cache's tables of keys up to 8 and 24 bytes.
func fullCacheFiller() string {
	rng := rand.New(rand.NewPCG(21, 22))
	var sb strings.Builder
	for sb.Len() < 4<<20 {
		sb.WriteByte(' ')
		for range 2 + rng.IntN(19) {
			sb.WriteByte(byte('a' + rng.IntN(26)))
		}
	}
	return sb.String()
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

// promptTexts are the four contents of the chat request the router's
// BenchmarkOverhead sends (system, user, assistant, user: 1,400, 840, 700
// and 420 bytes of mixed prose, code, figures and accented and CJK text,
// in lines of 80 bytes that each start with a nine-digit number), as the
// API reads them: a cut through a multi-byte rune reads as U+FFFD, as
// encoding/json writes it.
func promptTexts() [][]byte {
	parts := []string{
		"The quick brown fox jumps over the lazy dog while the router counts every token. ",
		"func add(a, b int) int { return a + b } // adds two numbers; see issue 1234. ",
		"Revenue grew 17.5% to 4,321,000 USD in Q3 2026, up from 3,678,000 a year earlier. ",
		"Überprüfen Sie die Konfiguration: naïve café résumé, 東京 の 天気 は 晴れ です。 ",
	}
	var sb strings.Builder
	for i := 0; sb.Len() < 8<<10; i++ {
		sb.WriteString(parts[i%len(parts)])
	}
	text := sb.String()
	var out [][]byte
	for _, r := range [][2]int{{0, 1400}, {2000, 840}, {4000, 700}, {6000, 420}} {
		s := text[r[0] : r[0]+r[1]]
		var b []byte
		for len(s) >= 70 {
			b = append(b, "000000000 "...)
			b = append(b, strings.ToValidUTF8(s[:70], "\uFFFD")...)
			b = append(b, '\n')
			s = s[70:]
		}
		out = append(out, b)
	}
	return out
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
			texts := promptTexts()
			count := O200K().Count
			switch name {
			case "relay-full":
				e := mustLoad("o200k_base", true)
				e.Count(fullCacheFiller())
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
