package chunk

// The splitter as it was before it skipped the counts a segment's length
// makes needless: TestSplitMatchesReference compares the two.

import (
	"unicode"
	"unicode/utf8"

	"github.com/tokenrelay/relay/internal/tokens"
)

// refDefaultSize is the segment size Split uses when asked for size <= 0.
const refDefaultSize = 16

// refBoundFactor bounds how far Split looks for a sentence end: a segment
// holds at most refBoundFactor×size tokens unless it is cut hard.
const refBoundFactor = 4

// Split splits text into consecutive segments of at least size tokens
// (refDefaultSize when size <= 0), counted exactly with the encoding that
// bills model (o200k_base or cl100k_base, as for the router's counts), each
// ending at a sentence end. It is meant for batch chunking (embedding a long
// document sentence-aligned, splitting a prompt into cacheable pieces).
//
// Guarantees:
//
//   - strings.Join(Split(text, size, model), "") == text, byte for byte,
//     whatever text is (invalid UTF-8 included); no segment is empty.
//   - Empty text gives nil. Text with fewer than size tokens gives one
//     segment, the text itself.
//   - Every segment but the last has at least size tokens, counted on its
//     own. The last may have fewer: it is what remains after the previous
//     segment reached size.
//   - No cut falls inside a UTF-8 sequence: when text is valid UTF-8, so is
//     every segment.
//
// Sentence ends. A segment ends right after a sentence end:
//
//   - a run of terminators ('.', '?', '!', '…', the Arabic '؟' and '۔', the
//     Devanagari '।') followed by optional closing quotes or brackets
//     (" ' ” ’ » ) ] } 」 』 ） 】 》) and then by whitespace or the end of
//     the text, so "3.14" and "example.com" are not sentence ends;
//   - a run of the full-width terminators '。', '！', '？', '．', '｡' (with
//     optional closers), whatever follows, since CJK text has no spaces;
//   - a run of newlines ("\n", "\r\n"), which also ends a line of code or a
//     list item. Newlines right after a terminator belong to that sentence
//     end: "Done.\n\nNext" splits as "Done.\n\n" | "Next".
//
// Which sentence end. A segment that starts at s ends at the first sentence
// end (or the end of the text) at which it has at least size tokens,
// provided it then has at most the bound of 4×size tokens.
//
// Hard cuts. When that sentence end lies beyond the bound (a long sentence,
// a paragraph without punctuation, a 100 KB run of one letter, minified
// code), the segment is cut hard after about size tokens instead, and the
// next segment continues from there:
//
//   - at the first pre-token boundary (whitespace, or a letter followed by
//     punctuation; see internal/tokens) at which the segment
//     has at least size tokens; such boundaries are tried about every
//     2×size bytes, so the segment may hold somewhat more than size tokens;
//   - in a run with no such boundary, at the rune where the count of the
//     segment's prefix steps past size, found by a binary search on prefix
//     counts: the segment is the longest prefix with at most size tokens if
//     that one has exactly size tokens, else the shortest with more. Since
//     the counter gives counts, not token ids, this is where tiktoken would
//     start the (size+1)-th token of the prefix, which is a token boundary of
//     the whole text in practice but is not proven to be.
//
// Cost. The text is scanned once and cut into units (a sentence, or a piece
// of a long sentence ending at a pre-token boundary after at least
// B = min(max(2×size, 32), 4096) bytes, or at a rune boundary after 4×B
// bytes without one); each unit is counted once, O(n) in all. Segment token counts
// are sums of unit counts, exact where the units meet at pre-token
// boundaries; where they do not (CJK full stops followed by a letter, cuts
// inside long runs), the segment is counted again once its estimate nears
// size or the bound, which costs O(segment). A hard cut inside a run costs a
// galloping then binary search over the counts of the segment's prefixes,
// O(segment·log segment). Overall O(n) for prose and O(n log n) at worst;
// nothing is re-counted from the start of the text.
func splitRef(text string, size int, model string) []string {
	if text == "" {
		return nil
	}
	if size <= 0 {
		size = refDefaultSize
	}
	sh := refSplitter{text: text, enc: tokens.ForModel(model), size: size, bound: size * refBoundFactor}
	if size > (1<<31-1)/refBoundFactor {
		sh.bound = 1<<31 - 1
	}
	minB := min(max(2*size, 32), 4096)
	sh.units = refUnits(sh.enc, text, minB, refBoundFactor*minB)
	var out []string
	s, j := 0, 0
	for s < len(text) {
		c := sh.next(s, j)
		out = append(out, text[s:c])
		s = c
		for j < len(sh.units) && sh.units[j].end <= s {
			j++
		}
	}
	return out
}

// unit is a piece of text the splitter never cuts inside except for a
// hard cut; units tile the text.
type refUnit struct {
	end      int  // offset just past the unit
	tokens   int  // countTokens of the unit on its own
	sentence bool // end is a sentence end (or the end of the text)
	safe     bool // end is a pre-token boundary: counts add across it
}

type refSplitter struct {
	text        string
	enc         tokens.Encoding
	size, bound int
	units       []refUnit
}

func (sh *refSplitter) count(a, b int) int { return sh.enc.Count(sh.text[a:b]) }

func (sh *refSplitter) unitStart(k int) int {
	if k == 0 {
		return 0
	}
	return sh.units[k-1].end
}

// extend adds units[k] to the token estimate of the segment that starts at
// s in units[j]. The estimate is a sum of unit counts, exact while every
// cut between the units summed is a pre-token boundary.
func (sh *refSplitter) extend(s, j, k, est int, exact bool) (int, bool) {
	if k > j {
		return est + sh.units[k].tokens, exact && sh.units[k-1].safe
	}
	if sh.unitStart(k) < s { // after a hard cut inside the unit
		return sh.count(s, sh.units[k].end), exact
	}
	return sh.units[k].tokens, exact
}

// next returns the end of the segment that starts at s; units[j] is the
// unit that holds s (or starts at s).
func (sh *refSplitter) next(s, j int) int {
	n := len(sh.text)
	est, exact := 0, true
	for k := j; k < len(sh.units); k++ {
		u := sh.units[k]
		est, exact = sh.extend(s, j, k, est, exact)
		e := u.end
		if u.sentence {
			if !exact && 2*est >= sh.size {
				est, exact = sh.count(s, e), true
			}
			if est >= sh.size || e == n {
				if est <= sh.bound {
					return e
				}
				return sh.hardCut(s, j)
			}
		}
		if est > sh.bound {
			if !exact {
				est, exact = sh.count(s, e), true
			}
			if est > sh.bound {
				return sh.hardCut(s, j)
			}
		}
	}
	return n // not reached: the last unit ends the text as a sentence end
}

// hardCut returns the end of a segment starting at s that is cut after
// about size tokens, at a pre-token boundary or, failing one, by bisect.
func (sh *refSplitter) hardCut(s, j int) int {
	est, exact := 0, true
	prev := s
	for k := j; k < len(sh.units); k++ {
		u := sh.units[k]
		est, exact = sh.extend(s, j, k, est, exact)
		e := u.end
		if est >= sh.size {
			if !exact {
				est, exact = sh.count(s, e), true
			}
			if est >= sh.size {
				if u.safe && est <= sh.bound {
					return e
				}
				return sh.bisect(s, prev, e)
			}
		}
		prev = e
	}
	return len(sh.text)
}

// bisect cuts the segment starting at s inside (lo, hi], where the segment
// up to lo has probably fewer than size tokens and up to hi at least size.
// It gallops from lo so that it never counts much more than the segment,
// then bisects over rune boundaries for adjacent a < b with
// count(s,a) <= size < count(s,b), and cuts at a when count(s,a) == size,
// else at b.
func (sh *refSplitter) bisect(s, lo, hi int) int {
	flo := 0
	if lo > s {
		if flo = sh.count(s, lo); flo > sh.size {
			lo, flo = s, 0
		}
	}
	// Gallop: find b in (lo, hi] with count(s,b) > size, or hi itself.
	step := max(64, 4*sh.size)
	b := hi
	for {
		m := refRuneStartBefore(sh.text, lo+step, lo, hi)
		if m >= hi {
			b = hi
			break
		}
		f := sh.count(s, m)
		if f > sh.size {
			b = m
			break
		}
		lo, flo = m, f
		step *= 2
	}
	if b == hi {
		if sh.count(s, hi) <= sh.size {
			return hi
		}
	}
	for {
		m := refRuneStartBefore(sh.text, lo+(b-lo)/2, lo, b)
		if m <= lo || m >= b {
			break
		}
		if f := sh.count(s, m); f <= sh.size {
			lo, flo = m, f
		} else {
			b = m
		}
	}
	if lo > s && flo >= sh.size {
		return lo
	}
	return b
}

// runeStartBefore returns a rune start in (lo, hi) at or before m, or after
// m when there is none before it, or hi when (lo, hi) holds none. A rune
// start is an offset whose byte is not a UTF-8 continuation byte; cutting
// there never splits a valid sequence.
func refRuneStartBefore(s string, m, lo, hi int) int {
	if m >= hi {
		return hi
	}
	for p := m; p > lo; p-- {
		if !utf8.RuneStart(s[p]) {
			continue
		}
		return p
	}
	for p := m + 1; p < hi; p++ {
		if utf8.RuneStart(s[p]) {
			return p
		}
	}
	return hi
}

// units tiles text with units: sentences, cut further at a pre-token
// boundary once a unit has minB bytes, or at a rune start once it has maxB
// bytes. Each unit is counted once.
func refUnits(enc tokens.Encoding, text string, minB, maxB int) []refUnit {
	units := make([]refUnit, 0, len(text)/max(minB, 1)+1)
	start := 0
	emit := func(end int, sentence, digits bool) {
		for end-start > maxB { // long runs: newlines, "!!!!", unbroken words
			c := refRuneStartBefore(text, start+maxB, start, end)
			if c >= end {
				break
			}
			units = append(units, refUnit{end: c, tokens: enc.Count(text[start:c]), safe: safeAt(text, c)})
			start = c
		}
		units = append(units, refUnit{end: end, tokens: enc.Count(text[start:end]), sentence: sentence, safe: end == len(text) || digits || safeAt(text, end)})
		start = end
	}
	prev := tokens.ClassNone
	run := 0 // numbers (runes) in the run that ends at p
	for p := 0; p < len(text); {
		c := text[p]
		if c == '.' || c == '\n' || c == '!' || c == '?' || c == '\r' || (c >= 0xD8 && refMayStartTerminator(c)) {
			if q, ok := refSentenceEndAt(text, p); ok {
				emit(q, true, false)
				prev, run = tokens.ClassBefore(text, q), 0
				p = q
				continue
			}
		}
		cur, n := tokens.ClassAt(text, p)
		// Inside a run of numbers, after every third one from its start.
		digits := cur == tokens.ClassNumber && run > 0 && run%3 == 0
		if p > start && p-start >= minB && (digits || cutAt(prev, cur)) {
			emit(p, false, digits)
		} else if p-start >= maxB {
			emit(p, false, false)
		}
		if cur == tokens.ClassNumber {
			run++
		} else {
			run = 0
		}
		prev = cur
		p += n
	}
	if start < len(text) {
		emit(len(text), true, false)
	}
	return units
}

// mayStartTerminator reports whether c is the first byte of a non-ASCII
// terminator's UTF-8 encoding.
func refMayStartTerminator(c byte) bool {
	switch c {
	case 0xD8, 0xDB, 0xE0, 0xE2, 0xE3, 0xEF: // ؟ ۔ । … 。 ！？．｡
		return true
	}
	return false
}

// sentenceEndAt reports whether a sentence end starts at text[p:] (see
// Split) and, if so, the offset just past it.
func refSentenceEndAt(text string, p int) (int, bool) {
	c := text[p]
	if c == '\n' || c == '\r' {
		return refSkipNewlines(text, p), true
	}
	if c != '.' && c != '?' && c != '!' && c < utf8.RuneSelf {
		return 0, false
	}
	q, wide, seen := p, false, false
run:
	for q < len(text) {
		r, n := utf8.DecodeRuneInString(text[q:])
		switch r {
		case '.', '?', '!', '…', '؟', '۔', '।':
		case '。', '！', '？', '．', '｡':
			wide = true
		default:
			break run
		}
		seen = true
		q += n
	}
	if !seen {
		return 0, false
	}
closers:
	for q < len(text) {
		r, n := utf8.DecodeRuneInString(text[q:])
		switch r {
		case '"', '\'', '”', '’', '»', ')', ']', '}', '」', '』', '）', '】', '》':
			q += n
		default:
			break closers
		}
	}
	if q == len(text) {
		return q, true
	}
	if text[q] == '\n' || text[q] == '\r' {
		return refSkipNewlines(text, q), true
	}
	if wide {
		return q, true
	}
	r, _ := utf8.DecodeRuneInString(text[q:])
	if unicode.IsSpace(r) {
		return q, true
	}
	return 0, false
}

func refSkipNewlines(text string, p int) int {
	for p < len(text) && (text[p] == '\n' || text[p] == '\r') {
		p++
	}
	return p
}
