package bpe

import (
	"encoding/binary"
	"math/bits"
	"unsafe"
)

// This file holds the ASCII fast paths of the pre-tokenizers. They decide
// a pre-token from ASCII bytes alone and give up (ok == false) as soon as
// the decision depends on a byte >= 0x80, which the general scanners then
// handle from the same position. For ASCII, [U] is [A-Z], [W] is [a-z],
// \p{L} is [A-Za-z], \p{N} is [0-9] and \s is [\t\n\v\f\r ].

// ASCII byte classes.
const (
	aUpper  uint8 = 1 << iota // [A-Z]
	aLower                    // [a-z]
	aDigit                    // [0-9]
	aSpace                    // [\t\n\v\f\r ]
	aNL                       // [\r\n]
	aPunct                    // any other ASCII byte: [^\s\p{L}\p{N}]
	aHigh                     // a byte >= 0x80
	aLetter = aUpper | aLower
)

var asciiClass = func() (t [256]uint8) {
	for b := range 256 {
		switch {
		case b >= 0x80:
			t[b] = aHigh
		case 'A' <= b && b <= 'Z':
			t[b] = aUpper
		case 'a' <= b && b <= 'z':
			t[b] = aLower
		case '0' <= b && b <= '9':
			t[b] = aDigit
		case b == '\r' || b == '\n':
			t[b] = aSpace | aNL
		case b == ' ' || b == '\t' || b == '\v' || b == '\f':
			t[b] = aSpace
		default:
			t[b] = aPunct
		}
	}
	return t
}()

// classAt returns the ASCII class of s[i], or 0 past the end.
func classAt(s string, i int) uint8 {
	if i < len(s) {
		return asciiClass[s[i]]
	}
	return 0
}

// skipClass advances over bytes of class mask.
func skipClass(s string, i int, mask uint8) int {
	for i < len(s) && asciiClass[s[i]]&mask != 0 {
		i++
	}
	return i
}

// SWAR (eight bytes at a time) letter runs. For a byte b < 0x80, b+0x80-lo
// has its top bit set iff b >= lo; bytes >= 0x80 are masked out.
const (
	swarLow7 = 0x7F7F7F7F7F7F7F7F
	swarHigh = 0x8080808080808080
	swarOnes = 0x0101010101010101
)

// inRange returns 0x80 in each byte of x that lies in [lo, hi] (ASCII).
func inRange(x uint64, lo, hi byte) uint64 {
	y := x & swarLow7
	return (y + (0x80-uint64(lo))*swarOnes) &^ (y + (0x80-uint64(hi)-1)*swarOnes) &^ x & swarHigh
}

// skipRange advances over ASCII bytes in [lo, hi].
func skipRange(s string, i int, lo, hi byte) int {
	b := unsafe.Slice(unsafe.StringData(s), len(s))
	for i+8 <= len(b) {
		if m := ^inRange(binary.LittleEndian.Uint64(b[i:]), lo, hi) & swarHigh; m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
		i += 8
	}
	for i < len(b) && lo <= b[i] && b[i] <= hi {
		i++
	}
	return i
}

// skipUpperLower advances over [A-Z]*[a-z]*.
func skipUpperLower(s string, i int) int {
	b := unsafe.Slice(unsafe.StringData(s), len(s))
	for i+8 <= len(b) {
		x := binary.LittleEndian.Uint64(b[i:])
		notUpper := ^inRange(x, 'A', 'Z') & swarHigh
		if notUpper == 0 {
			i += 8
			continue
		}
		from := ^uint64(0) << (bits.TrailingZeros64(notUpper) &^ 7)
		if notLower := ^inRange(x, 'a', 'z') & swarHigh & from; notLower != 0 {
			return i + bits.TrailingZeros64(notLower)>>3
		}
		return skipRange(s, i+8, 'a', 'z')
	}
	return skipRange(s, skipRange(s, i, 'A', 'Z'), 'a', 'z')
}

// skipLetters advances over [A-Za-z].
func skipLetters(s string, i int) int {
	b := unsafe.Slice(unsafe.StringData(s), len(s))
	for i+8 <= len(b) {
		x := binary.LittleEndian.Uint64(b[i:])
		if m := ^inRange(x&^(0x20*swarOnes), 'A', 'Z') & swarHigh; m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
		i += 8
	}
	for i < len(b) && asciiClass[b[i]]&aLetter != 0 {
		i++
	}
	return i
}

// digitsASCII matches \p{N}{1,3} at s[i:], which starts with an ASCII digit.
func digitsASCII(s string, i int) (int, bool) {
	j := i + 1
	for ; j < i+3; j++ {
		k := classAt(s, j)
		if k&aHigh != 0 {
			return 0, false
		}
		if k&aDigit == 0 {
			break
		}
	}
	return j, true
}

// punctASCII matches ` ?[^\s\p{L}\p{N}]+` followed by [\r\n]* (with slash:
// [\r\n/]*) at s[i:] when s[i] is ASCII; ok is false if the rule does not
// apply or depends on a non-ASCII byte.
func (c classifier) punctASCII(s string, i int, slash bool) (int, bool) {
	j := i
	if s[i] == ' ' {
		j++
	}
	k := classAt(s, j)
	if k&aHigh != 0 {
		return 0, false
	}
	if k&aPunct == 0 {
		return 0, false
	}
	e := skipClass(s, j+1, aPunct)
	if e < len(s) && s[e] >= 0x80 {
		e = c.scanPunct(s, e)
	}
	for e < len(s) && (s[e] == '\r' || s[e] == '\n' || (slash && s[e] == '/')) {
		e++
	}
	return e, true
}

// nextO200KASCII is nextO200KGeneral when the decision needs only ASCII
// bytes; ok is false when it needs more.
func (c classifier) nextO200KASCII(s string, i int) (int, bool) {
	k := asciiClass[s[i]]
	j := i
	switch {
	case k&aHigh != 0:
		return 0, false
	case k&aLetter != 0:
	case k&(aPunct|aSpace) != 0 && k&aNL == 0: // [^\r\n\p{L}\p{N}]? prefix
		k2 := classAt(s, i+1)
		if k2&aHigh != 0 {
			return 0, false
		}
		if k2&aLetter == 0 {
			if e, ok := c.punctASCII(s, i, true); ok {
				return e, true
			}
			return c.whitespaceASCII(s, i, k)
		}
		j = i + 1
	case k&aDigit != 0:
		return digitsASCII(s, i)
	default: // \r or \n
		return c.whitespace(s, i), true
	}
	// [U]*[W]+ or [U]+[W]*: uppercase run, then lowercase run. A word that
	// ends within the eight bytes at j is found here (skipUpperLower's
	// first step, written out: a call less per word); longer ones, or
	// near the end of s, by skipUpperLower.
	e := -1
	if j+8 <= len(s) {
		x := binary.LittleEndian.Uint64(unsafe.Slice(unsafe.StringData(s[j:]), 8))
		if notUpper := ^inRange(x, 'A', 'Z') & swarHigh; notUpper != 0 {
			if notLower := ^inRange(x, 'a', 'z') & swarHigh & (^uint64(0) << (bits.TrailingZeros64(notUpper) &^ 7)); notLower != 0 {
				e = j + bits.TrailingZeros64(notLower)>>3
			}
		}
	}
	if e < 0 {
		e = skipUpperLower(s, j)
	}
	if e < len(s) {
		if s[e] >= 0x80 {
			return 0, false
		}
		if s[e] == '\'' {
			e += contraction(s, e)
		}
	}
	return e, true
}

// nextCL100KASCII is nextCL100KGeneral when the decision needs only ASCII
// bytes; ok is false when it needs more.
func (c classifier) nextCL100KASCII(s string, i int) (int, bool) {
	k := asciiClass[s[i]]
	j := i
	switch {
	case k&aHigh != 0:
		return 0, false
	case k&aLetter != 0:
	case k&(aPunct|aSpace) != 0 && k&aNL == 0: // [^\r\n\p{L}\p{N}]? prefix
		if s[i] == '\'' {
			if m := contraction(s, i); m > 0 {
				return i + m, true
			}
		}
		k2 := classAt(s, i+1)
		if k2&aHigh != 0 {
			return 0, false
		}
		if k2&aLetter == 0 {
			if e, ok := c.punctASCII(s, i, false); ok {
				return e, true
			}
			return c.whitespaceASCII(s, i, k)
		}
		j = i + 1
	case k&aDigit != 0:
		return digitsASCII(s, i)
	default: // \r or \n
		return c.whitespace(s, i), true
	}
	e := skipLetters(s, j)
	if e < len(s) && s[e] >= 0x80 {
		return 0, false
	}
	return e, true
}

// whitespaceASCII applies the whitespace rules at s[i:] when s[i] (class k)
// is whitespace, and gives up otherwise.
func (c classifier) whitespaceASCII(s string, i int, k uint8) (int, bool) {
	if k&aSpace == 0 {
		return 0, false
	}
	return c.whitespace(s, i), true
}
