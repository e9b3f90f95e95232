package bpe

import (
	"sync"
	"unicode"
	"unicode/utf8"
)

// Character class bits. They mirror what github.com/dlclark/regexp2 (the
// engine used by tiktoken-go) evaluates: \s is unicode.IsSpace and \p{..}
// are the tables of the standard unicode package.
const (
	cL  uint8 = 1 << iota // \p{L}
	cN                    // \p{N}
	cS                    // \s
	cU                    // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
	cW                    // [\p{Ll}\p{Lm}\p{Lo}\p{M}]
	cNL                   // [\r\n]
)

// tableLimit is the number of code points whose class is precomputed (the
// BMP plus the supplementary planes holding emoji and CJK extensions).
const tableLimit = 0x30000

var classTable = sync.OnceValue(func() *[tableLimit]uint8 {
	t := new([tableLimit]uint8)
	set := func(rt *unicode.RangeTable, bit uint8) {
		for _, r := range rt.R16 {
			for c := int(r.Lo); c <= int(r.Hi) && c < tableLimit; c += int(r.Stride) {
				t[c] |= bit
			}
		}
		for _, r := range rt.R32 {
			for c := int(r.Lo); c <= int(r.Hi) && c < tableLimit; c += int(r.Stride) {
				t[c] |= bit
			}
		}
	}
	set(unicode.L, cL)
	set(unicode.N, cN)
	for _, rt := range []*unicode.RangeTable{unicode.Lu, unicode.Lt, unicode.Lm, unicode.Lo, unicode.M} {
		set(rt, cU)
	}
	for _, rt := range []*unicode.RangeTable{unicode.Ll, unicode.Lm, unicode.Lo, unicode.M} {
		set(rt, cW)
	}
	set(unicode.White_Space, cS) // unicode.IsSpace, in table form
	t['\r'] |= cNL
	t['\n'] |= cNL
	return t
})

// Rune kinds, as RuneKind tells them.
const (
	KindOther  = iota
	KindLetter // \p{L}
	KindNumber // \p{N}, not a letter
	KindMark   // \p{M}
	KindSpace  // \s (unicode.IsSpace)
)

// RuneKind returns the first of space, letter, number and mark that r is,
// from the pre-tokenizers' table (built on first use), or KindOther.
func RuneKind(r rune) int {
	var c uint8
	if r >= 0 && r < tableLimit {
		c = classTable()[r]
	} else {
		c = slowClass(r)
	}
	switch {
	case c&cS != 0:
		return KindSpace
	case c&cL != 0:
		return KindLetter
	case c&cN != 0:
		return KindNumber
	case c&cU != 0: // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and not a letter
		return KindMark
	}
	return KindOther
}

// slowClass classifies runes outside the precomputed table.
func slowClass(r rune) uint8 {
	var c uint8
	if unicode.IsLetter(r) {
		c |= cL
	}
	if unicode.IsNumber(r) {
		c |= cN
	}
	if unicode.IsSpace(r) {
		c |= cS
	}
	if unicode.In(r, unicode.Lu, unicode.Lt, unicode.Lm, unicode.Lo, unicode.M) {
		c |= cU
	}
	if unicode.In(r, unicode.Ll, unicode.Lm, unicode.Lo, unicode.M) {
		c |= cW
	}
	return c
}

// classifier decodes and classifies the rune at a byte offset of valid UTF-8.
type classifier struct {
	t *[tableLimit]uint8
}

// at returns the class of the rune starting at s[i] and its byte length.
// s must be valid UTF-8 and i < len(s).
func (c classifier) at(s string, i int) (uint8, int) {
	b := s[i]
	if b < utf8.RuneSelf {
		return c.t[b], 1
	}
	return c.atSlow(s, i)
}

func (c classifier) atSlow(s string, i int) (uint8, int) {
	b := s[i]
	if b < 0xE0 && i+1 < len(s) { // 2-byte sequence (input is valid UTF-8)
		r := rune(b&0x1F)<<6 | rune(s[i+1]&0x3F)
		return c.t[r], 2
	}
	if b < 0xF0 && i+2 < len(s) { // 3-byte: the rest of the BMP, CJK and kana among it
		r := rune(b&0x0F)<<12 | rune(s[i+1]&0x3F)<<6 | rune(s[i+2]&0x3F)
		return c.t[r], 3
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	if r < tableLimit {
		return c.t[r], n
	}
	return slowClass(r), n
}
