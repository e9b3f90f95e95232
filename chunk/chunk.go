// Package chunk splits text into pieces of a given token count that end at
// sentence ends, for batch work such as embedding a long document
// sentence-aligned or cutting a prompt into cacheable pieces.
//
// Counts are exact, in the tiktoken encoding that bills the model (as the
// router counts prompts), and cuts never change them where the text allows
// a cut between pre-tokens.
package chunk

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/tokenrelay/relay/internal/tokens"
)

// DefaultSize is the segment size Split uses when asked for size <= 0.
const DefaultSize = 16

// boundFactor bounds how far Split looks for a sentence end: a segment
// holds at most boundFactor×size tokens unless it is cut hard.
const boundFactor = 4

// Split splits text into consecutive segments of at least size tokens
// (DefaultSize when size <= 0), counted exactly with the encoding that
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
//   - at the first pre-token boundary (whitespace, a letter followed by
//     punctuation, a letter next to a digit, every third digit of a run;
//     see cutAt and digitCut) at which the segment
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
// bytes without one); each unit is counted once, O(n) in all. Counts add
// across pre-token boundaries, so units are counted between the last
// boundaries they hold (their ends, or where their sentence ends'
// terminators start when the units do not meet at a boundary, as CJK
// sentences do: a full stop joins the letters after it), and a segment's
// count is the sum of those counts, exact, plus the count of its first
// unit from the segment's start. The end of a line before its indentation
// is such a boundary (tokens.SafeBeforeIndent), so the lines of indented
// code and pretty-printed JSON add up too. Where a unit holds no such
// boundary (a cut inside a long run), the sum is an estimate
// and the segment is counted again, from the last boundary counted, once
// its estimate nears size or the bound: O(segment). Not when the next
// sentence end is more than 128×bound bytes away (no token is longer than
// 128 bytes, so the segment could not end there within the bound): the
// segment is then cut hard at once. A hard cut inside a run costs a
// galloping then binary search over the counts of the segment's prefixes,
// O(segment·log segment). Overall O(n) for prose and O(n log n) at worst;
// nothing is re-counted from the start of the text. Runs without a
// boundary mostly repeat themselves (one letter, newlines, "=====", a digit
// pattern): the counts of their pieces and the hard cuts made in them
// depend only on the text they read, and are remembered by that text (a
// bounded memo per call, which turns itself off when a run does not
// repeat), so such a run is counted and searched a few times, not once per
// segment. In instructions (valgrind), splitting 1 MiB into 16-token
// segments costs 2.0× counting it on prose, 1.75× on CJK, 1.7× on code,
// 1.8× on indented JSON (also in 256- and 1024-token segments), 1.5× on
// random hex digits (a letter next to a digit is a boundary: cutAt), 2.4×
// on random digits (every third digit of a run is one: digitCut), and
// 0.2–2.4× on repeated runs (one letter, a long word, digits, newlines);
// in time (BenchmarkSplit1MiB, medians of three runs on a 2-core VM)
// 2.6× on prose (a sentence end every 19 bytes), 2.0× on code, 2.2× on
// CJK, 2.8× on the digit pattern. A run of letters without a space that
// does not repeat (random letters) has no boundary at all, and every
// segment in it is cut by a search; there the text from the segment's
// start is a single pre-token, whose prefixes are counted in one pass
// (tokens.Prefixes, see countSeg) instead of about nine merges from the
// start: 6× a count in instructions, 2.2–2.8× in time (the count of such
// a run misses the CPU caches at every byte, the pass less often). The
// pass needs the counter's tables for long runs, built once per process
// (100–300 ms, 10–20 MB): a process builds them for this only after its
// searches have spent about that long without them, so a Split of a few
// hundred KiB of such text may take that much longer once, and every
// later one is faster (BenchmarkFirstSplit).
func Split(text string, size int, model string) []string {
	if text == "" {
		return nil
	}
	if size <= 0 {
		size = DefaultSize
	}
	// Every cut is at a rune start, so the parts of valid UTF-8 are valid:
	// checked once here, not again by each count.
	sh := splitter{text: text, enc: tokens.ForModel(model), size: size, bound: size * boundFactor, validTo: validPrefix(text)}
	if size > (1<<31-1)/boundFactor {
		sh.bound = 1<<31 - 1
	}
	minB := min(max(2*size, 32), 4096)
	sh.units = units(&sh, minB, boundFactor*minB)
	n := 0 // about the text's count: the segments are about n/size
	for k := range sh.units {
		n += sh.units[k].tokens
	}
	out := make([]string, 0, n/size+1)
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
//
// A unit's cut is the last pre-token boundary the splitter knows in it: its
// end when that is one, else where its sentence end's terminators start
// when that is one (CJK sentences: a full stop joins the letters after it,
// so the units do not meet at a boundary, but each ends in one). Counts add
// across cuts, so a run of units whose cuts are known is counted exactly
// by the counts between consecutive cuts (links), which is what counting
// the whole text counts: of a segment of such units, only the first unit
// is counted again, from the segment's start to its cut.
type unit struct {
	end      int  // offset just past the unit
	sentence bool // end is a sentence end (or the end of the text)
	safe     bool // end is a pre-token boundary: counts add across it
	linked   bool // tokens counts from the previous unit's cut to cut
	cut      int  // see above; -1 when the unit has none
	// tokens is the count from the previous unit's cut (the text's start
	// for the first unit) to cut when linked, else of the unit on its own.
	tokens int
	tail   int // the count from cut to end (0 when cut is end or -1)
}

// growth is the count of a segment as it grows unit by unit: the text from
// the segment's start up to m.at holds m.n tokens, m.at being the start or
// a pre-token boundary, and pend is the count from m.at to the end of the
// last unit added, exact when exact, else an estimate.
type growth struct {
	m     mark
	pend  int
	exact bool
}

// mark is a point of a segment and the count from the segment's start to it.
type mark struct{ at, n int }

func (g *growth) est() int { return g.m.n + g.pend }

// begin starts the growth of a segment at s in units[j], counted exactly
// to the unit's end.
func (sh *splitter) begin(s, j int) growth {
	u := &sh.units[j]
	g := growth{m: mark{at: s}, exact: true}
	switch {
	case sh.unitStart(j) == s && !u.linked:
		g.pend = u.tokens
	case sh.unitStart(j) == s && sh.cutBefore(j) == s:
		g.m, g.pend = mark{u.cut, u.tokens}, u.tail
	case u.cut > s:
		g.m, g.pend = mark{u.cut, sh.count(s, u.cut)}, u.tail
	default: // s is inside the unit: after a hard cut, mostly in a run
		g.pend = sh.countRun(s, u.end, true)
	}
	return g
}

// add grows g by units[k], k after the segment's first unit.
func (sh *splitter) add(g *growth, k int) {
	p, u := &sh.units[k-1], &sh.units[k]
	if g.exact && p.cut > g.m.at { // the count is known up to p's cut
		g.m, g.pend = mark{p.cut, g.m.n + g.pend - p.tail}, p.tail
	}
	switch {
	case u.linked && g.exact && g.m.at == p.cut:
		g.m, g.pend = mark{u.cut, g.m.n + u.tokens}, u.tail
	case u.linked: // an estimate of the count from p's end to u's
		g.pend += max(u.tokens-p.tail+u.tail, 0)
		g.exact = false
	default:
		g.pend += u.tokens
		g.exact = g.exact && p.safe
	}
}

// countTo makes g's count up to the end of units[k], the last unit added,
// exact, counting from g.m on.
func (sh *splitter) countTo(g *growth, k int) {
	if !g.exact {
		g.pend, g.exact = sh.count(g.m.at, sh.units[k].end), true
	}
}

// countRunTo is countTo inside a run being cut hard, whose pieces repeat
// (see countRun).
func (sh *splitter) countRunTo(g *growth, k int) {
	if !g.exact {
		g.pend, g.exact = sh.countRun(g.m.at, sh.units[k].end, true), true
	}
}

// cutBefore is the cut of the unit before units[j] (0 for the first), -1
// when it has none.
func (sh *splitter) cutBefore(j int) int {
	if j == 0 {
		return 0
	}
	return sh.units[j-1].cut
}

type splitter struct {
	text        string
	enc         tokens.Encoding
	validTo     int // text[:validTo] is valid UTF-8
	size, bound int
	units       []unit
	sent        int // index of the first sentence-end unit at or after the current segment's
	// Inside runs without boundaries (see countRun and bisect): the counts
	// of their pieces and the hard cuts made in them, by their text.
	runs runMemo[string]
	cuts runMemo[cutKey]
	// The counts of the prefixes of the run from preAt-1 (preAt 0: none),
	// one pass for the searches of the segment that starts there.
	pre   tokens.Prefixes
	preAt int
}

// cutKey is what a hard cut depends on: the text from the segment's start
// to the end of the search, and where the search starts in it.
type cutKey struct {
	text string
	lo   int
}

// runMemo remembers what the splitter found inside runs without
// boundaries, by the text it depends on (exactly: the key holds the text,
// not a hash of it). It holds at most memoSize entries: when full it is
// emptied, and when the entries it held were found again fewer than
// memoSize/16 times (runs that do not repeat), it stops remembering.
type runMemo[K comparable] struct {
	m    map[K]int
	hits int
	off  bool
}

const memoSize = 1024

func (r *runMemo[K]) get(k K) (int, bool) {
	v, ok := r.m[k]
	if ok {
		r.hits++
	}
	return v, ok
}

func (r *runMemo[K]) put(k K, v int) {
	switch {
	case r.off:
		return
	case len(r.m) >= memoSize && r.hits < memoSize/16:
		r.m, r.off = nil, true
		return
	case len(r.m) >= memoSize:
		clear(r.m)
		r.hits = 0
	case r.m == nil:
		r.m = make(map[K]int)
	}
	r.m[k] = v
}

// countRun is count for text inside a run without a boundary: a unit of
// maxB bytes, or (seg) a segment being cut hard from a, counted by
// countSeg. Such runs mostly repeat (one letter, a digit pattern,
// newlines, a long word written again and again), so their equal pieces
// are counted once, and found by their text after that.
func (sh *splitter) countRun(a, b int, seg bool) int {
	t := sh.text[a:b]
	if n, ok := sh.runs.get(t); ok {
		return n
	}
	var n int
	if seg {
		n = sh.countSeg(a, b)
	} else {
		n = sh.count(a, b)
	}
	sh.runs.put(t, n)
	return n
}

// countSeg is count(s, m) for a segment being cut hard from s, which asks
// for the counts of several prefixes of a run: where the text from s to m
// is a single pre-token (a run of letters without a space has no pre-token
// boundary at all), its count is the byte-pair count of a prefix of the
// run, and the counts of all its prefixes come from one pass over it
// (tokens.Prefixes) instead of a merge of each from s (TestCountSegIsCount).
func (sh *splitter) countSeg(s, m int) int {
	if m > sh.validTo || m-s < 2 || !sh.enc.OnePiece(sh.text[s:m]) {
		return sh.count(s, m)
	}
	if sh.preAt != s+1 {
		sh.preAt = 0
		if !sh.enc.Prefixes(&sh.pre, sh.text[s:sh.validTo], m-s) {
			return sh.count(s, m)
		}
		sh.preAt = s + 1
	}
	return sh.pre.Count(m - s)
}

// maxTokenBytes is the longest token of both encodings, in bytes
// (TestMaxTokenBytes checks it). Every token of a text covers at most that
// many of its bytes (more when invalid bytes count as U+FFFD), so a text
// of more than maxTokenBytes×k bytes has more than k tokens.
const maxTokenBytes = 128

func (sh *splitter) count(a, b int) int {
	if b <= sh.validTo {
		if b-a == 1 { // valid, so ASCII: one token (a sentence's full stop)
			return 1
		}
		return sh.enc.CountValid(sh.text[a:b])
	}
	return sh.enc.Count(sh.text[a:b])
}

// validPrefix returns the length of the longest prefix of s that is valid
// UTF-8 and ends at a rune start (len(s) when s is valid). It checks blocks
// of about 4 KiB, cut at rune starts, with utf8.ValidString, and decodes
// rune by rune only the block that is not valid.
func validPrefix(s string) int {
	const block = 4 << 10
	i := 0
	for i < len(s) {
		j := min(i+block, len(s))
		for j < len(s) && j > i+1 && !utf8.RuneStart(s[j]) {
			j-- // a valid sequence is not cut; an invalid one is found below
		}
		if !utf8.ValidString(s[i:j]) {
			break
		}
		i = j
	}
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return len(s)
}

func (sh *splitter) unitStart(k int) int {
	if k == 0 {
		return 0
	}
	return sh.units[k-1].end
}

// next returns the end of the segment that starts at s; units[j] is the
// unit that holds s (or starts at s).
func (sh *splitter) next(s, j int) int {
	n := len(sh.text)
	// When the next sentence end is so far that the segment up to it has
	// more tokens than the bound by its length alone, it cannot end this
	// segment, and no sentence end comes before it: cut hard at once. The
	// walk below would come to the same hard cut, after counting the
	// segment up to the bound once more (see TestSplitMatchesReference).
	if sh.sent < j {
		sh.sent = j
	}
	for !sh.units[sh.sent].sentence {
		sh.sent++
	}
	if (sh.units[sh.sent].end-s)/maxTokenBytes > sh.bound {
		return sh.hardCut(s, j)
	}
	g := sh.begin(s, j)
	for k := j; k < len(sh.units); k++ {
		u := sh.units[k]
		if k > j {
			sh.add(&g, k)
		}
		e := u.end
		if u.sentence {
			if 2*g.est() >= sh.size {
				sh.countTo(&g, k)
			}
			if est := g.est(); est >= sh.size || e == n {
				if est <= sh.bound {
					return e
				}
				return sh.hardCut(s, j)
			}
		}
		if g.est() > sh.bound {
			sh.countTo(&g, k)
			if g.est() > sh.bound {
				return sh.hardCut(s, j)
			}
		}
	}
	return n // not reached: the last unit ends the text as a sentence end
}

// hardCut returns the end of a segment starting at s that is cut after
// about size tokens, at a pre-token boundary or, failing one, by bisect.
func (sh *splitter) hardCut(s, j int) int {
	g := sh.begin(s, j)
	prev := s
	for k := j; k < len(sh.units); k++ {
		u := sh.units[k]
		if k > j {
			sh.add(&g, k)
		}
		e := u.end
		if g.est() >= sh.size {
			sh.countRunTo(&g, k)
			if est := g.est(); est >= sh.size {
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
//
// The cut depends on text[s:hi] and lo-s alone, and the segments of a run
// that repeats (one letter, newlines, a digit pattern) meet the same ones
// again and again: cuts are remembered by them (runMemo), so such a run is
// searched a few times, not once per segment.
func (sh *splitter) bisect(s, lo, hi int) int {
	k := cutKey{sh.text[s:hi], lo - s}
	if c, ok := sh.cuts.get(k); ok {
		return s + c
	}
	c := sh.search(s, lo, hi)
	sh.cuts.put(k, c-s)
	return c
}

// search is bisect without its memo.
func (sh *splitter) search(s, lo, hi int) int {
	flo := 0
	if lo > s {
		if flo = sh.countSeg(s, lo); flo > sh.size {
			lo, flo = s, 0
		}
	}
	// Gallop: find b in (lo, hi] with count(s,b) > size, or hi itself.
	step := max(64, 4*sh.size)
	b := hi
	for {
		m := runeStartBefore(sh.text, lo+step, lo, hi)
		if m >= hi {
			b = hi
			break
		}
		f := sh.countSeg(s, m)
		if f > sh.size {
			b = m
			break
		}
		lo, flo = m, f
		step *= 2
	}
	if b == hi {
		if sh.countSeg(s, hi) <= sh.size {
			return hi
		}
	}
	for {
		m := runeStartBefore(sh.text, lo+(b-lo)/2, lo, b)
		if m <= lo || m >= b {
			break
		}
		if f := sh.countSeg(s, m); f <= sh.size {
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
func runeStartBefore(s string, m, lo, hi int) int {
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
func units(sh *splitter, minB, maxB int) []unit {
	text := sh.text
	// Sentence ends make units shorter than minB: prose, code and JSON have
	// one every 15 to 20 bytes. (Sized ahead up to 4 MiB of text; a longer
	// one grows the slice.)
	units := make([]unit, 0, min(len(text)/16, 1<<18)+1)
	start := 0
	prevCut := 0 // the cut of the last unit, -1 when it has none
	// emit adds the unit that ends at end (a sentence end whose terminators
	// start at cut, or 0), cut first into pieces of maxB bytes when longer.
	// digits tells that end is a boundary inside a run of numbers (see
	// digitCut).
	emit := func(end int, sentence bool, cut int, digits bool) {
		for {
			u := unit{end: end, sentence: sentence, cut: -1}
			if end-start > maxB { // long runs: newlines, "!!!!", unbroken words
				if c := runeStartBefore(text, start+maxB, start, end); c < end {
					u.end, u.sentence = c, false
				}
			}
			u.safe = u.end == len(text) || digits && u.end == end || safeAt(text, u.end)
			switch {
			case u.safe:
				u.cut = u.end
			case u.end == end && cut > start && safeAt(text, cut):
				u.cut, u.tail = cut, sh.count(cut, end)
			}
			if u.cut >= 0 && prevCut >= 0 {
				u.tokens, u.linked = sh.count(prevCut, u.cut), true
			} else if u.end-start >= maxB {
				u.tokens = sh.countRun(start, u.end, false)
			} else {
				u.tokens = sh.count(start, u.end)
			}
			units = append(units, u)
			start, prevCut = u.end, u.cut
			if u.end == end {
				return
			}
		}
	}
	prev, known := tokens.ClassNone, true // known: prev is the class of the rune before p
	// d is how many numbers (runes) end at p in a run of them, mod 3, -1
	// when not known; startD is the same at start. Both hold when known.
	d, startD := 0, 0
	for p := 0; p < len(text); {
		if p-start < minB && p < sh.validTo {
			// No cut within minB bytes of the unit's start: step over valid
			// runes by their lead bytes up to one that may start a sentence
			// end, without decoding or classifying them.
			lim := min(start+minB, sh.validTo)
			q := p
			for q < lim {
				// An ASCII byte steps by one, which the CPU can run ahead
				// of: q does not wait for the table to be read.
				n := skipStep[text[q]]
				if n == 1 {
					q++
					continue
				}
				if n == 0 {
					break
				}
				q += int(n)
			}
			if q > p {
				p, known = q, false
				continue
			}
		}
		c := text[p]
		if c == '.' || c == '\n' || c == '!' || c == '?' || c == '\r' || (c >= 0xD8 && terminatorAt(text, p)) {
			if q, ok := sentenceEndAt(text, p); ok {
				emit(q, true, p, false)
				prev, known = tokens.ClassBefore(text, q), true
				d, startD = 0, 0 // a sentence end ends in no number
				p = q
				continue
			}
		}
		if p-start < minB {
			// No cut within minB bytes of the unit's start: step over the
			// rune without classifying it.
			if c < utf8.RuneSelf {
				p++
			} else {
				_, n := tokens.DecodeRune(text, p)
				p += n
			}
			known = false
			continue
		}
		cur, n := tokens.ClassAt(text, p)
		if !known {
			prev, known = tokens.ClassBefore(text, p), true
			if d = 0; prev == tokens.ClassNumber {
				d = numbersBefore(text, start, p, startD)
			}
		}
		digits := digitCut(prev, cur, d)
		if p > start && (digits || cutAt(prev, cur)) {
			emit(p, false, 0, digits)
			startD = d
		} else if p-start >= maxB {
			emit(p, false, 0, false)
			startD = d
		}
		if cur != tokens.ClassNumber {
			d = 0
		} else if prev != tokens.ClassNumber {
			d = 1
		} else if d >= 0 {
			if d++; d == 3 {
				d = 0
			}
		}
		prev = cur
		p += n
	}
	if start < len(text) {
		emit(len(text), true, 0, false)
	}
	return units
}

// safeAt reports whether 0 < p < len(text) is a pre-token boundary the
// splitter knows: cutAt's rule between the runes around p, or the end of a
// line before its indentation (tokens.SafeBeforeIndent), which lets the
// lines of indented code and pretty-printed JSON be counted once each.
func safeAt(text string, p int) bool {
	if p <= 0 || p >= len(text) {
		return false
	}
	cur, _ := tokens.ClassAt(text, p)
	return cutAt(tokens.ClassBefore(text, p), cur) || tokens.SafeBeforeIndent(text, p)
}

// cutAt is the splitter's boundary rule between a rune of class prev and
// the next rune of class cur: tokens.SafeCut's, and a letter next to a
// number either way (\p{L} then \p{N}, or \p{N} then \p{L}). No
// alternative of either encoding's regex matches across that: a word's
// letters take no number, \p{N}{1,3} takes no letter, and the one rune a
// word may take before its letters is not a number. So a hex string, an ID
// or a base64 blob without spaces has boundaries every few bytes, and the
// splitter counts it once instead of cutting every segment of it by a
// search (TestSplitCutsAddUp). The router's sharder keeps SafeCut's rule
// alone: its shards, and so its affinity keys, stay as they are.
func cutAt(prev, cur tokens.Class) bool {
	return tokens.SafeCut(prev, cur) ||
		prev == tokens.ClassLetter && cur == tokens.ClassNumber ||
		prev == tokens.ClassNumber && cur == tokens.ClassLetter
}

// digitCut reports whether the offset between a rune of class prev and the
// next of class cur, with d numbers (runes) of the run before it (mod 3,
// see units), is a boundary inside a run of numbers: \p{N}{1,3} takes
// them three at a time from the run's first, which always starts a
// pre-token (no other alternative of either regex matches a number), so
// after every third number of a run the text splits the same on either
// side (TestDigitCutsAddUp). A run of digits without a space (an ID, a
// long number) then has a boundary every three bytes. Like cutAt's
// letter-number rule, the sharder does not use it.
func digitCut(prev, cur tokens.Class, d int) bool {
	return cur == tokens.ClassNumber && prev == tokens.ClassNumber && d == 0
}

// numbersBefore returns how many numbers (runes) end at p in a run of
// them, mod 3, scanning back no further than start; startD is that count
// at start (-1 when not known), for a run that began before it. The
// scan is at most the bytes units() stepped over since start, so it
// costs O(n) over the text.
func numbersBefore(text string, start, p, startD int) int {
	n := 0
	for q := p; q > start; n++ {
		_, size := utf8.DecodeLastRuneInString(text[start:q])
		if c, _ := tokens.ClassAt(text, q-size); c != tokens.ClassNumber {
			return n % 3
		}
		q -= size
	}
	if tokens.ClassBefore(text, start) != tokens.ClassNumber {
		return n % 3
	}
	if startD < 0 {
		return -1
	}
	return (startD + n) % 3
}

// skipStep is, for the first byte of a valid UTF-8 sequence, its length,
// and 0 for a byte that may start a sentence end (see Split): an ASCII
// terminator or newline, or the lead byte of a terminator above ASCII.
var skipStep = func() (t [256]uint8) {
	for c := range t {
		switch {
		case c < utf8.RuneSelf:
			t[c] = 1
		case c >= 0xF0:
			t[c] = 4
		case c >= 0xE0:
			t[c] = 3
		case c >= 0xC0:
			t[c] = 2
		default: // a continuation byte: never the first of a valid sequence
			t[c] = 1
		}
	}
	for _, c := range []byte{'.', '\n', '!', '?', '\r', 0xD8, 0xDB, 0xE0, 0xE2, 0xE3, 0xEF} {
		t[c] = 0
	}
	return t
}()

// terminatorAt reports whether a non-ASCII terminator (see Split) starts at
// text[p], by its UTF-8 bytes: text that is mostly non-ASCII (CJK) asks at
// every rune.
func terminatorAt(text string, p int) bool {
	t := text[p:]
	switch t[0] {
	case 0xD8: // ؟
		return strings.HasPrefix(t, "؟")
	case 0xDB: // ۔
		return strings.HasPrefix(t, "۔")
	case 0xE0: // ।
		return strings.HasPrefix(t, "।")
	case 0xE2: // …
		return strings.HasPrefix(t, "…")
	case 0xE3: // 。
		return strings.HasPrefix(t, "。")
	case 0xEF: // ！？．｡
		return strings.HasPrefix(t, "！") || strings.HasPrefix(t, "？") || strings.HasPrefix(t, "．") || strings.HasPrefix(t, "｡")
	}
	return false
}

// sentenceEndAt reports whether a sentence end starts at text[p:] (see
// Split) and, if so, the offset just past it.
func sentenceEndAt(text string, p int) (int, bool) {
	c := text[p]
	if c == '\n' || c == '\r' {
		return skipNewlines(text, p), true
	}
	if c != '.' && c != '?' && c != '!' && c < utf8.RuneSelf {
		return 0, false
	}
	q, wide, seen := p, false, false
run:
	for q < len(text) {
		r, n := tokens.DecodeRune(text, q)
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
		r, n := tokens.DecodeRune(text, q)
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
		return skipNewlines(text, q), true
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

func skipNewlines(text string, p int) int {
	for p < len(text) && (text[p] == '\n' || text[p] == '\r') {
		p++
	}
	return p
}
