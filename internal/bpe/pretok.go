package bpe

// This file holds hand-written equivalents of the two tiktoken split
// regexes, evaluated with the leftmost-alternative, greedy-with-backtracking
// semantics of a backtracking engine (regexp2), on valid UTF-8 input.

// contraction reports the length of (?i:'s|'t|'re|'ve|'m|'ll|'d) at s[i:]
// (which starts with the apostrophe), or 0.
func contraction(s string, i int) int {
	if i+1 >= len(s) || s[i] != '\'' {
		return 0
	}
	switch s[i+1] | 0x20 {
	case 's', 't', 'm', 'd':
		return 2
	case 'r', 'v':
		if i+2 < len(s) && s[i+2]|0x20 == 'e' {
			return 3
		}
	case 'l':
		if i+2 < len(s) && s[i+2]|0x20 == 'l' {
			return 3
		}
	}
	return 0
}

// scan advances over runes whose class intersects mask.
func (c classifier) scan(s string, i int, mask uint8) int {
	for i < len(s) {
		b := s[i]
		if b < 0x80 {
			if c.t[b]&mask == 0 {
				return i
			}
			i++
			continue
		}
		k, n := c.atSlow(s, i)
		if k&mask == 0 {
			return i
		}
		i += n
	}
	return i
}

// scanPunct advances over [^\s\p{L}\p{N}].
func (c classifier) scanPunct(s string, i int) int {
	for i < len(s) {
		k, n := c.at(s, i)
		if k&(cL|cN|cS) != 0 {
			return i
		}
		i += n
	}
	return i
}

// whitespace matches \s*[\r\n]+|\s+(?!\S)|\s+ at s[i:], which starts with a
// whitespace rune.
func (c classifier) whitespace(s string, i int) int {
	lastNL, last, p := -1, i, i
	for p < len(s) {
		k, n := c.at(s, p)
		if k&cS == 0 {
			break
		}
		if k&cNL != 0 {
			lastNL = p + n
		}
		last = p
		p += n
	}
	switch {
	case lastNL >= 0: // \s*[\r\n]+ : up to the last newline of the run
		return lastNL
	case p == len(s): // \s+(?!\S) at end of text
		return p
	case last > i: // \s+(?!\S) : the run minus its last rune
		return last
	default: // \s+
		return p
	}
}

// nextCL100KGeneral returns the end of the cl100k_base pre-token starting
// at i, for any valid UTF-8 (nextCL100KASCII is the fast path the
// counting loops try first):
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//	 ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
func (c classifier) nextCL100KGeneral(s string, i int) int {
	b := s[i]
	k, n := c.at(s, i)
	j := i + n
	if b == '\'' {
		if m := contraction(s, i); m > 0 {
			return i + m
		}
	}
	if k&cL != 0 {
		return c.scan(s, j, cL)
	}
	if k&(cN|cNL) == 0 && j < len(s) {
		if k2, n2 := c.at(s, j); k2&cL != 0 {
			return c.scan(s, j+n2, cL)
		}
	}
	return c.tail(s, i, j, k, false)
}

// tail matches what the two patterns share after their letter rules, for
// the pre-token starting at i whose first rune (class k) ends at j:
// \p{N}{1,3}, then ` ?[^\s\p{L}\p{N}]+` followed by [\r\n]* (o200k, with
// slash: [\r\n/]*), then the whitespace rules.
func (c classifier) tail(s string, i, j int, k uint8, slash bool) int {
	if k&cN != 0 {
		for d := 1; d < 3 && j < len(s); d++ {
			k2, n2 := c.at(s, j)
			if k2&cN == 0 {
				break
			}
			j += n2
		}
		return j
	}
	e := -1
	if s[i] == ' ' && j < len(s) {
		if k2, n2 := c.at(s, j); k2&(cL|cN|cS) == 0 {
			e = c.scanPunct(s, j+n2)
		}
	}
	if e < 0 && k&(cL|cN|cS) == 0 {
		e = c.scanPunct(s, j)
	}
	if e < 0 {
		return c.whitespace(s, i)
	}
	for e < len(s) && (s[e] == '\r' || s[e] == '\n' || (slash && s[e] == '/')) {
		e++
	}
	return e
}

// upperLower matches [U]*[W]+ at s[p:] (U = \p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M},
// W = \p{Ll}\p{Lm}\p{Lo}\p{M}) with backtracking semantics.
func (c classifier) upperLower(s string, p int) (int, bool) {
	lastW := -1
	q := p
	for q < len(s) {
		k, n := c.at(s, q)
		if k&cU == 0 {
			if k&cW != 0 { // U* maximal, W+ continues from here
				return c.scan(s, q+n, cW), true
			}
			break
		}
		if k&cW != 0 {
			lastW = q + n
		}
		q += n
	}
	if lastW >= 0 { // backtrack U* to the last rune that is also in W
		return lastW, true
	}
	return 0, false
}

// upperThenLower matches [U]+[W]* at s[p:].
func (c classifier) upperThenLower(s string, p int) (int, bool) {
	if p >= len(s) {
		return 0, false
	}
	k, n := c.at(s, p)
	if k&cU == 0 {
		return 0, false
	}
	q := c.scan(s, p+n, cU)
	return c.scan(s, q, cW), true
}

// nextO200KGeneral returns the end of the o200k_base pre-token starting at
// i, for any valid UTF-8 (nextO200KASCII is the fast path the counting
// loops try first):
//
//	[^\r\n\p{L}\p{N}]?[U]*[W]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
//	[^\r\n\p{L}\p{N}]?[U]+[W]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
//	\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
func (c classifier) nextO200KGeneral(s string, i int) int {
	k, n := c.at(s, i)
	j := i + n
	if pre := k&(cL|cN|cNL) == 0; pre || k&(cU|cW) != 0 {
		// Word alternatives, first with the optional prefix rune taken.
		e, ok := 0, false
		if pre {
			e, ok = c.upperLower(s, j)
		}
		if !ok {
			e, ok = c.upperLower(s, i)
		}
		if !ok && pre {
			e, ok = c.upperThenLower(s, j)
		}
		if !ok {
			e, ok = c.upperThenLower(s, i)
		}
		if ok {
			if e < len(s) && s[e] == '\'' {
				e += contraction(s, e)
			}
			return e
		}
	}
	return c.tail(s, i, j, k, true)
}
