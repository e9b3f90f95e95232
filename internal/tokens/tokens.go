// Package tokens counts tokens the way OpenAI-compatible APIs bill them:
// which tiktoken encoding a model uses, the exact count of a text in it, and
// where a text may be cut without changing its count.
package tokens

import (
	"strings"
	"unicode/utf8"

	"github.com/tokenrelay/relay/internal/bpe"
)

// Encoding is a tiktoken encoding.
type Encoding uint8

// The encodings.
const (
	O200K Encoding = iota
	CL100K
)

func (e Encoding) String() string {
	if e == CL100K {
		return "cl100k_base"
	}
	return "o200k_base"
}

// Count returns the number of tokens of s in e, special tokens counted as
// plain text. It is exact (the same count as tiktoken) and linear in len(s),
// also on pathological input such as a megabyte of one letter.
func (e Encoding) Count(s string) int {
	switch s {
	case "":
		return 0
	case "system", "user", "assistant", "developer", "tool", "function":
		// The roles of chat messages, counted in every request: one token
		// each in both encodings (TestRoleTokens).
		return 1
	}
	return e.bpe().Count(s)
}

// CountValid is Count for s known to be valid UTF-8 (utf8.ValidString),
// which Count would check again: a caller that counts many parts of one
// checked text, cut at rune starts, checks it once.
func (e Encoding) CountValid(s string) int {
	if s == "" {
		return 0
	}
	return e.bpe().CountValid(s)
}

// A Piece is the end of a pre-token of a text and the sum of the counts of
// the pre-tokens up to it (see AppendPieces).
type Piece = bpe.Piece

// AppendPieces appends to dst, until it is full (len(dst) == cap(dst)) or
// the text ends, the pre-tokens of s that follow offset i (a pre-token
// end, or 0), with cum plus the sum of their counts; a caller continues
// from the last one's End and Cum. At a known boundary (SafeAt), every
// one of which is a pre-token end, the sum from 0 is the count of s up to
// it. s must be valid UTF-8 (Count reads an invalid byte as U+FFFD, which
// moves the offsets).
func (e Encoding) AppendPieces(dst []Piece, s string, i, cum int) []Piece {
	return e.bpe().AppendPieces(dst, s, i, cum)
}

// Prefixes counts every prefix of one pre-token in one pass (see
// bpe.Prefixes).
type Prefixes = bpe.Prefixes

// Prefixes starts p on the text s, to count its prefixes that are single
// pre-tokens (OnePiece): Count(s[:m]) is then p.Count(m). n is about how
// many bytes of s will be asked about; Prefixes refuses (and the caller
// counts) while the tables it needs are not built and the encoding's
// budget for merging long pre-tokens without them lasts.
func (e Encoding) Prefixes(p *Prefixes, s string, n int) bool {
	return e.bpe().Prefixes(p, s, n)
}

// OnePiece reports whether the valid UTF-8 text s is a single pre-token.
func (e Encoding) OnePiece(s string) bool { return e.bpe().OnePiece(s) }

// Warm builds the tables e counts long pre-tokens with (and Prefixes
// needs) now, instead of when e first needs them: see bpe.Encoding.Warm.
func (e Encoding) Warm() { e.bpe().Warm() }

// bpe returns the counter of e (its ranks loaded on first use).
func (e Encoding) bpe() *bpe.Encoding {
	if e == CL100K {
		return bpe.CL100K()
	}
	return bpe.O200K()
}

// ForModel returns the encoding that bills model: cl100k_base for gpt-4,
// gpt-3.5 and the text-embedding-3/ada-002 models, o200k_base for gpt-4o,
// gpt-4.1, gpt-5, the o-series and, as an estimate, every other vendor's
// model.
func ForModel(model string) Encoding {
	m := model
	if i := strings.LastIndexByte(m, '/'); i >= 0 {
		m = m[i+1:] // "openai/gpt-4" → "gpt-4"
	}
	m = strings.TrimPrefix(m, "ft:") // a fine-tuned model: "ft:gpt-3.5-turbo-0125:org::id" bills as its base
	switch {
	case strings.HasPrefix(m, "gpt-4o"), strings.HasPrefix(m, "gpt-4.1"), strings.HasPrefix(m, "gpt-4.5"):
		return O200K
	case strings.HasPrefix(m, "gpt-4"), strings.HasPrefix(m, "gpt-3.5"), strings.HasPrefix(m, "gpt-35"),
		strings.HasPrefix(m, "text-embedding-3"), strings.HasPrefix(m, "text-embedding-ada-002"):
		return CL100K
	}
	return O200K
}

// Where a text may be cut.
//
// tiktoken first splits a text into pre-tokens by a regex, and byte-pair
// encodes every pre-token on its own. A cut at a pre-token boundary
// therefore never changes the count: Count(a+b) == Count(a) + Count(b). The
// counter returns counts, not token ids, so this package finds such
// boundaries itself, with a conservative rule that holds for both
// cl100k_base and o200k_base (see SafeCut): a position p is a pre-token
// boundary when
//
//   - the rune before p is not whitespace and the rune at p is whitespace
//     other than \r and \n ("word| next");
//   - the rune before p is a letter or a digit and the rune at p is \r or \n
//     ("word|\n");
//   - the rune before p is \r or \n and the rune at p is neither whitespace
//     nor '/' ("\n|next");
//   - the rune before p is a letter and the rune at p is punctuation or a
//     symbol other than the apostrophe ("word|, next", "你好|，世界").
//
// Positions the rule does not cover (inside words, between punctuation and
// a letter, in runs without whitespace) may or may not be boundaries; they
// are treated as not known to be.

// Class is the class of a rune for the boundary rule.
type Class uint8

// Rune classes.
const (
	ClassNone    Class = iota // start of text
	ClassOther                // punctuation, symbols, invalid bytes (tiktoken reads them as U+FFFD)
	ClassLetter               // \p{L}
	ClassNumber               // \p{N}
	ClassMark                 // \p{M}: part of a word for o200k_base, punctuation for cl100k_base
	ClassSpace                // \s other than \r and \n
	ClassNewline              // \r, \n
	ClassApos                 // ', which may start a contraction suffix ('s, 'll, ...)
	ClassSlash                // /, which o200k_base glues after punctuation and newlines
)

var asciiClass = func() (t [utf8.RuneSelf]Class) {
	for c := range t {
		t[c] = classOf(rune(c), 1)
	}
	return t
}()

// safeASCII has, for each ASCII byte, the bit of each class c such that
// SafeCut(the byte's class, c): SafeAt between two ASCII bytes is one
// lookup.
var safeASCII = func() (t [256]uint16) {
	for a := range utf8.RuneSelf {
		for c := ClassNone; c <= ClassSlash; c++ {
			if SafeCut(asciiClass[a], c) {
				t[a] |= 1 << c
			}
		}
	}
	return t
}()

// asciiClass8 is asciiClass indexed by any byte (0 above ASCII), so that
// SafeAt's lookups need no bounds check.
var asciiClass8 = func() (t [256]uint8) {
	for c := range utf8.RuneSelf {
		t[c] = uint8(asciiClass[c])
	}
	return t
}()

func classOf(r rune, size int) Class {
	switch {
	case 0x4E00 <= r && r <= 0x9FFF, 0xAC00 <= r && r <= 0xD7A3, 0x3041 <= r && r <= 0x3096, 0x30A1 <= r && r <= 0x30FA:
		// CJK Unified Ideographs, Hangul syllables, hiragana and katakana:
		// letters, all of them (TestClassOfFastRanges), found without a
		// table search.
		return ClassLetter
	case r == '\n' || r == '\r':
		return ClassNewline
	case r == '\'':
		return ClassApos
	case r == '/':
		return ClassSlash
	case r == utf8.RuneError && size <= 1:
		return ClassOther
	case r >= utf8.RuneSelf:
		// The pre-tokenizers' table: one lookup for what the unicode
		// package finds with up to four table searches (TestClassOfAll
		// checks both ways agree).
		return kindClass[bpe.RuneKind(r)]
	case r == ' ' || '\t' <= r && r <= '\f':
		return ClassSpace
	case 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z':
		return ClassLetter
	case '0' <= r && r <= '9':
		return ClassNumber
	}
	return ClassOther
}

// kindClass is the Class of each bpe rune kind.
var kindClass = [...]Class{bpe.KindOther: ClassOther, bpe.KindLetter: ClassLetter, bpe.KindNumber: ClassNumber,
	bpe.KindMark: ClassMark, bpe.KindSpace: ClassSpace}

// ClassAt returns the class of the rune at s[p:] and its length.
func ClassAt(s string, p int) (Class, int) {
	if c := s[p]; c < utf8.RuneSelf {
		return asciiClass[c], 1
	}
	r, n := DecodeRune(s, p)
	return classOf(r, n), n
}

// DecodeRune is utf8.DecodeRuneInString(s[p:]), with the common 3-byte
// sequences (CJK, kana, Hangul, most symbols) decoded inline.
func DecodeRune(s string, p int) (rune, int) {
	if c := s[p]; c >= 0xE1 && c <= 0xEF && c != 0xED && p+2 < len(s) {
		// After E1–EC and EE–EF, any two continuation bytes make a valid
		// sequence (E0 and ED restrict the second byte: left to utf8).
		if b1, b2 := s[p+1], s[p+2]; b1&0xC0 == 0x80 && b2&0xC0 == 0x80 {
			return rune(c&0x0F)<<12 | rune(b1&0x3F)<<6 | rune(b2&0x3F), 3
		}
	}
	return utf8.DecodeRuneInString(s[p:])
}

// ClassBefore returns the class of the rune that ends at s[:p].
func ClassBefore(s string, p int) Class {
	if p == 0 {
		return ClassNone
	}
	if c := s[p-1]; c < utf8.RuneSelf {
		return asciiClass[c]
	}
	if p >= 3 {
		// A 3-byte sequence that DecodeRune decodes inline ends here: it
		// is the last rune (its lead is not a continuation byte).
		if c := s[p-3]; c >= 0xE1 && c <= 0xEF && c != 0xED && s[p-2]&0xC0 == 0x80 && s[p-1]&0xC0 == 0x80 {
			return classOf(rune(c&0x0F)<<12|rune(s[p-2]&0x3F)<<6|rune(s[p-1]&0x3F), 3)
		}
	}
	r, n := utf8.DecodeLastRuneInString(s[:p])
	return classOf(r, n)
}

// SafeAt reports whether 0 < p < len(s) is a known pre-token boundary.
func SafeAt(s string, p int) bool {
	if p <= 0 || p >= len(s) {
		return false
	}
	if a, b := s[p-1], s[p]; a|b < utf8.RuneSelf {
		return SafeASCII(a, b)
	}
	return safeAtRunes(s, p)
}

// SafeASCII is SafeAt between two ASCII bytes a and b: one lookup.
func SafeASCII(a, b byte) bool { return safeASCII[a]>>asciiClass8[b]&1 != 0 }

// safeAtRunes is SafeAt where a rune around p is not ASCII.
func safeAtRunes(s string, p int) bool {
	cur, _ := ClassAt(s, p)
	return SafeCut(ClassBefore(s, p), cur)
}

// SafeBeforeIndent reports whether 0 < p < len(s), right after a newline
// and before white space, is a pre-token boundary, which SafeAt does not
// know: it is when the white space from p holds no newline (the
// indentation of a line of code or of pretty-printed JSON). Both regexes
// (see SafeCut) match a newline only with \s*[\r\n]+ or at the end of
// ?[^\s\p{L}\p{N}]+[\r\n]* ([\r\n/]* for o200k_base): \s*[\r\n]+, tried
// before \s+(?!\S) and \s+ at the start of the white space that holds
// the newline, ends at the last newline of that white space, and the
// punctuation alternative ends at the last newline of its run; either way
// at p. The white space after p then splits the same on its own (the
// regexes have no lookbehind). It scans the white space from p, so a
// caller asking at every offset of a long run of it would be quadratic:
// the splitter asks only where its units end.
func SafeBeforeIndent(s string, p int) bool {
	if p <= 0 || p >= len(s) || (s[p-1] != '\n' && s[p-1] != '\r') {
		return false
	}
	for q := p; q < len(s); {
		c, n := ClassAt(s, q)
		switch c {
		case ClassSpace:
			q += n
		case ClassNewline:
			return false
		default:
			return q > p
		}
	}
	return true // white space to the end of the text
}

// SafeCut is the pre-token boundary rule between a rune of class prev and
// the next rune of class cur. It was checked against both tiktoken split
// regexes (cl100k_base:
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+, and o200k_base's
// variant with case-split words, contraction suffixes and [\r\n/]* after
// punctuation): no alternative matches across such a position, and since
// the regexes have no lookbehind, the text after it splits the same on its
// own.
func SafeCut(prev, cur Class) bool {
	switch prev {
	case ClassNone:
		return false
	case ClassSpace:
		return false
	case ClassNewline:
		return cur != ClassSpace && cur != ClassNewline && cur != ClassSlash
	}
	switch cur {
	case ClassSpace:
		return true
	case ClassNewline:
		return prev == ClassLetter || prev == ClassNumber
	case ClassOther, ClassSlash:
		return prev == ClassLetter
	}
	return false
}
