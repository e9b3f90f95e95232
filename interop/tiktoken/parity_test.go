package tiktoken

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	. "github.com/tokenrelay/relay/internal/bpe"
	"github.com/tokenrelay/relay/internal/corpus"
)

func checkParity(t *testing.T, inputs []string) {
	t.Helper()
	for _, e := range encodings() {
		ref := reference(t, e.Name())
		bad := 0
		for _, in := range inputs {
			want := len(ref.EncodeOrdinary(in))
			if got := e.Count(in); got != want {
				bad++
				if bad <= 10 {
					t.Errorf("%s: Count(%q) = %d, tiktoken-go = %d", e.Name(), in, got, want)
				}
			}
		}
		if bad > 0 {
			t.Errorf("%s: %d/%d mismatches", e.Name(), bad, len(inputs))
		}
	}
}

func TestParityHandWritten(t *testing.T) {
	checkParity(t, corpus.HandWritten)
}

func TestParityRandomStructured(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	inputs := make([]string, 3000)
	for i := range inputs {
		inputs[i] = corpus.Random(rng, 60)
	}
	checkParity(t, inputs)
}

func TestParityRandomBytes(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	inputs := make([]string, 1500)
	for i := range inputs {
		b := make([]byte, rng.IntN(40)+1)
		for j := range b {
			switch rng.IntN(3) {
			case 0:
				b[j] = byte(rng.IntN(256))
			case 1:
				b[j] = " \n\tabcAB'1.!\r/"[rng.IntN(14)]
			default:
				b[j] = byte(0x80 + rng.IntN(0x80))
			}
		}
		inputs[i] = string(b)
	}
	checkParity(t, inputs)
}

// Every single code point class, in context.
func TestParityAllRuneClasses(t *testing.T) {
	seen := map[uint8]bool{}
	var inputs []string
	for r := rune(0); r <= utf8.MaxRune; r++ {
		c := RuneClass(r)
		if r >= 0xD800 && r <= 0xDFFF {
			continue
		}
		key := c
		if r < 0x80 || !seen[key] {
			seen[key] = true
			for _, ctx := range []string{"%c", "a%c", "A%c", " %c", "%cb", "%cB", "%c's", "1%c2", "%c%c", "!%c", "\n%c", "%c \n"} {
				inputs = append(inputs, strings.ReplaceAll(fmt.Sprintf(ctx, r), "%!(EXTRA int32=", ""))
			}
		}
	}
	checkParity(t, inputs)
}

func TestParityLongerDocuments(t *testing.T) {
	doc := corpus.Mixed(6 << 10)
	var inputs []string
	for i := 0; i+512 <= len(doc); i += 700 {
		inputs = append(inputs, doc[i:i+512])
	}
	inputs = append(inputs, doc)
	checkParity(t, inputs)
}

// The benchmark corpora agree with tiktoken-go (the first 64 KiB of each,
// to keep the quadratic reference fast); the one-letter corpus, a single
// 256 KiB pre-token, agrees with the heap merge.
func TestParityCorpora(t *testing.T) {
	for _, c := range corpus.Bench(t) {
		if c.Quadratic {
			for _, e := range encodings() {
				if got, want := e.Count(c.Text), e.CountHeap(c.Text); got != want {
					t.Errorf("%s/%s: Count = %d, heap merge %d", c.Name, e.Name(), got, want)
				}
			}
			continue
		}
		checkParity(t, []string{corpus.CutRunes(c.Text, 64<<10)})
	}
}

func FuzzCountParity(f *testing.F) {
	for _, s := range corpus.HandWritten {
		f.Add(s)
	}
	f.Add(corpus.Mixed(1 << 10))
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
