package bpe

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tokenrelay/relay/internal/corpus"
)

// The ASCII fast paths agree with the general scanners at every position
// where they decide.
func TestASCIIFastPathsAgree(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const alphabet = " \t\n\r\v\f aAzZ09'sStTlLdDmMrReEvV.,!?/-_\"(){}<>|\\@#"
	inputs := append([]string{}, corpus.HandWritten...)
	for range 20000 {
		var sb strings.Builder
		for range 1 + rng.IntN(24) {
			if rng.IntN(8) == 0 {
				sb.WriteRune(corpus.RunePool[rng.IntN(len(corpus.RunePool))])
			} else {
				sb.WriteByte(alphabet[rng.IntN(len(alphabet))])
			}
		}
		inputs = append(inputs, sb.String())
	}
	c := classifier{t: classTable()}
	decided := 0
	for _, in := range inputs {
		if !utf8.ValidString(in) {
			continue
		}
		for i := 0; i < len(in); i++ {
			if !utf8.RuneStart(in[i]) {
				continue
			}
			if j, ok := c.nextO200KASCII(in, i); ok {
				decided++
				if want := c.nextO200KGeneral(in, i); j != want {
					t.Fatalf("o200k %q at %d: fast path %d, general %d", in, i, j, want)
				}
			}
			if j, ok := c.nextCL100KASCII(in, i); ok {
				decided++
				if want := c.nextCL100KGeneral(in, i); j != want {
					t.Fatalf("cl100k %q at %d: fast path %d, general %d", in, i, j, want)
				}
			}
		}
	}
	if decided == 0 {
		t.Fatal("the fast paths decided nothing")
	}
}

func TestSWARSkips(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for range 100000 {
		b := make([]byte, rng.IntN(20))
		for i := range b {
			b[i] = "aZ.\x80"[rng.IntN(4)]
			if rng.IntN(2) == 0 {
				b[i] = byte(rng.IntN(256))
			}
		}
		s := string(b)
		for i := 0; i <= len(s); i++ {
			want := skipClass(s, skipClass(s, i, aUpper), aLower)
			if got := skipUpperLower(s, i); got != want {
				t.Fatalf("skipUpperLower(%q, %d) = %d, want %d", s, i, got, want)
			}
		}
	}
	for b := range 256 {
		for pos := range 12 {
			s := strings.Repeat("q", pos) + string([]byte{byte(b)}) + strings.Repeat("Q", 12-pos)
			lower, letters := skipRange(s, 0, 'a', 'z'), skipLetters(s, 0)
			wantLower, wantLetters := pos, pos
			if 'a' <= b && b <= 'z' {
				wantLower = pos + 1
			}
			if asciiClass[b]&aLetter != 0 {
				wantLetters = len(s)
			}
			if lower != wantLower || letters != wantLetters {
				t.Fatalf("%q: skipRange %d (want %d), skipLetters %d (want %d)", s, lower, wantLower, letters, wantLetters)
			}
		}
	}
}
