package tokens

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestForModel(t *testing.T) {
	for model, want := range map[string]Encoding{
		"gpt-4o": O200K, "gpt-4.1": O200K, "gpt-5": O200K, "o3-mini": O200K, "claude-sonnet-4.5": O200K, "": O200K,
		"gpt-4": CL100K, "gpt-4-turbo": CL100K, "gpt-3.5-turbo": CL100K, "text-embedding-3-small": CL100K, "openai/gpt-4": CL100K,
		// Fine-tuned models bill as their base (tiktoken's "ft:" prefixes).
		"ft:gpt-3.5-turbo-0125:org::abc123": CL100K, "ft:gpt-4-0613:org::x": CL100K, "ft:gpt-4o-mini-2024-07-18:org::y": O200K,
	} {
		assert.Equal(t, want, ForModel(model), model)
	}
	assert.Equal(t, "o200k_base", O200K.String())
	assert.Equal(t, "cl100k_base", CL100K.String())
}

// TestSafeCutsAddUp: cutting at every position the rule accepts keeps the
// count, in both encodings.
func TestSafeCutsAddUp(t *testing.T) {
	for _, text := range []string{
		"The quick brown fox, again. And again!\n\nNew paragraph: 3.14 and example.com/path",
		"你好，世界。東京は晴れです。 mixed words 123 456",
		"func add(a, b int) int {\n\treturn a + b // adds\n}\n",
		"don't won't I'll  spaced   out\r\n\r\nend",
	} {
		for _, enc := range []Encoding{O200K, CL100K} {
			sum, last := 0, 0
			for p := 1; p < len(text); p++ {
				if SafeAt(text, p) {
					sum += enc.Count(text[last:p])
					last = p
				}
			}
			sum += enc.Count(text[last:])
			assert.Equal(t, enc.Count(text), sum, "%s %q", enc, text)
		}
	}
	assert.Zero(t, O200K.Count(""))
}

// TestSafeBeforeIndentAddsUp: cutting at every position SafeAt or
// SafeBeforeIndent accepts keeps the count, in both encodings, on indented
// code and JSON, white space of every kind around newlines, and random
// mixes of them.
func TestSafeBeforeIndentAddsUp(t *testing.T) {
	texts := []string{
		"{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": {\n\t\t\"c\": \"d\"\n  }\n}\n",
		"func f() {\n\tif x {\n\t\treturn\n\t}\n}\n  \n   \n\n    end",
		"a.\n  /b\n \u00a0\u3000x\r\n\t\ty\r  z\n\x0b\x0cw\n\u0085\u2028v\n   ",
		"x\n \n  \n\n\t\n\r\n \r\n  'll\n  's\n  123\n  \u0301\n  !!\n",
	}
	pieces := []string{"\n", "\r", "\r\n", " ", "  ", "\t", "\u00a0", "\u3000", "\u0085", "x", "Ab", "12", "1234", "!", ".", "/", "'s", "'", "\u0301", "你", "{", "\""}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 3000 {
		var b strings.Builder
		for range 1 + rng.IntN(24) {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		texts = append(texts, b.String())
	}
	cuts := 0
	for _, text := range texts {
		for _, enc := range []Encoding{O200K, CL100K} {
			sum, last := 0, 0
			for p := 1; p < len(text); p++ {
				if SafeAt(text, p) || SafeBeforeIndent(text, p) {
					if SafeBeforeIndent(text, p) {
						cuts++
					}
					sum += enc.Count(text[last:p])
					last = p
				}
			}
			sum += enc.Count(text[last:])
			require.Equal(t, enc.Count(text), sum, "%s %q", enc, text)
		}
	}
	assert.Greater(t, cuts, 1000, "the rule was tried at few positions")
	assert.True(t, SafeBeforeIndent("a\n  b", 2))
	assert.False(t, SafeBeforeIndent("a\n  \nb", 2), "a newline later in the white space takes it")
	assert.False(t, SafeBeforeIndent("a\r\n b", 2), "inside \\r\\n")
	assert.False(t, SafeBeforeIndent("a\nb", 2), "no white space after the newline: SafeAt's rule")
}

// TestDecodeRuneMatchesUTF8: DecodeRune agrees with
// utf8.DecodeRuneInString on every 3-byte sequence led by E0–EF, valid or
// not, and on the same sequences cut short.
func TestDecodeRuneMatchesUTF8(t *testing.T) {
	buf := make([]byte, 3)
	for c := 0xE0; c <= 0xEF; c++ {
		for b1 := range 256 {
			for b2 := range 256 {
				buf[0], buf[1], buf[2] = byte(c), byte(b1), byte(b2)
				for n := 1; n <= 3; n++ {
					s := string(buf[:n])
					r, size := DecodeRune(s, 0)
					wr, wsize := utf8.DecodeRuneInString(s)
					if r != wr || size != wsize {
						t.Fatalf("% x: DecodeRune = %U, %d; utf8 = %U, %d", buf[:n], r, size, wr, wsize)
					}
				}
			}
		}
	}
}

// TestClassBeforeMatchesUTF8: ClassBefore classifies the rune that
// utf8.DecodeLastRuneInString finds, after any byte and before any 3-byte
// sequence led by E0–EF, valid or not.
func TestClassBeforeMatchesUTF8(t *testing.T) {
	buf := make([]byte, 4)
	for _, prev := range []byte{'a', 0x80, 0xE3, 0xC3} {
		buf[0] = prev
		for c := 0xE0; c <= 0xEF; c++ {
			for b1 := range 256 {
				for b2 := range 256 {
					buf[1], buf[2], buf[3] = byte(c), byte(b1), byte(b2)
					s := string(buf)
					r, n := utf8.DecodeLastRuneInString(s)
					if got, want := ClassBefore(s, len(s)), classOf(r, n); got != want {
						t.Fatalf("% x: ClassBefore = %v, want %v", buf, got, want)
					}
				}
			}
		}
	}
}

// TestClassOfFastRanges: the ranges classOf answers without a table search
// are letters by the unicode tables, every code point of them.
func TestClassOfFastRanges(t *testing.T) {
	for _, rg := range [][2]rune{{0x4E00, 0x9FFF}, {0xAC00, 0xD7A3}, {0x3041, 0x3096}, {0x30A1, 0x30FA}} {
		for r := rg[0]; r <= rg[1]; r++ {
			if !unicode.IsLetter(r) || unicode.IsSpace(r) || unicode.IsNumber(r) || unicode.IsMark(r) {
				t.Fatalf("%U is not only a letter", r)
			}
		}
	}
}

// TestClassOfAll checks classOf against its definition in the unicode
// package for every code point and invalid byte: the first of space,
// letter, number and mark, after the runes the pre-tokenizers single out.
func TestClassOfAll(t *testing.T) {
	special := map[rune]Class{'\n': ClassNewline, '\r': ClassNewline, '\'': ClassApos, '/': ClassSlash}
	def := func(r rune, size int) Class {
		if c, ok := special[r]; ok {
			return c
		}
		if r == utf8.RuneError && size <= 1 {
			return ClassOther
		}
		for _, k := range []struct {
			is func(rune) bool
			c  Class
		}{{unicode.IsSpace, ClassSpace}, {unicode.IsLetter, ClassLetter}, {unicode.IsNumber, ClassNumber}, {unicode.IsMark, ClassMark}} {
			if k.is(r) {
				return k.c
			}
		}
		return ClassOther
	}
	for r := rune(0); r <= unicode.MaxRune; r++ {
		size := utf8.RuneLen(r)
		if size < 0 {
			size = 1 // a surrogate: not a rune a decoder gives
		}
		if got, want := classOf(r, size), def(r, size); got != want {
			t.Fatalf("classOf(%U) = %d, want %d", r, got, want)
		}
	}
	if got := classOf(utf8.RuneError, 1); got != ClassOther {
		t.Fatalf("an invalid byte is class %d", got)
	}
	if got := classOf(utf8.RuneError, 3); got != def(utf8.RuneError, 3) {
		t.Fatalf("U+FFFD written out is class %d", got)
	}
}

func TestCountValid(t *testing.T) {
	for _, s := range []string{"", "x", "Hello, world!", "東京 の 天気 は 晴れ です。", "  \n\n\t y's 'LL", "👨‍👩‍👧‍👦 1️⃣ 12345678"} {
		for _, enc := range []Encoding{O200K, CL100K} {
			assert.Equal(t, enc.Count(s), enc.CountValid(s), "%s %q", enc, s)
		}
	}
}

// TestRoleTokens holds Count's shortcut for chat roles to the counter.
func TestRoleTokens(t *testing.T) {
	for _, s := range []string{"system", "user", "assistant", "developer", "tool", "function"} {
		for _, enc := range []Encoding{O200K, CL100K} {
			assert.Equal(t, enc.bpe().Count(s), enc.Count(s), "%s %q", enc, s)
			assert.Equal(t, enc.bpe().Count(s+"x"), enc.Count(s+"x"), "%s %q", enc, s+"x")
		}
	}
}

// TestSafeAtASCIIPairs holds SafeAt's one-lookup path between two ASCII
// bytes to SafeCut of the classes ClassBefore and ClassAt give, for every
// pair, at the start, middle and end of a text.
func TestSafeAtASCIIPairs(t *testing.T) {
	for a := range 128 {
		for b := range 128 {
			s := string([]byte{'x', byte(a), byte(b), 'y'})
			cur, _ := ClassAt(s, 2)
			want := SafeCut(ClassBefore(s, 2), cur)
			if got := SafeAt(s, 2); got != want {
				t.Fatalf("SafeAt(%q, 2) = %v, SafeCut %v", s, got, want)
			}
			if SafeAt(s[1:3], 2) || SafeAt(s[1:3], 0) {
				t.Fatalf("SafeAt at the ends of %q", s[1:3])
			}
		}
	}
}
