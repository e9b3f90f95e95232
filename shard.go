package relay

import (
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
	"unsafe"
)

// This file holds the prompt sharder (Shard), the prefix block hashes
// (PrefixBlocks) the router's affinity key is made of, and the
// prompt_cache_key injection helper.
//
// All three rest on one observation about tiktoken: the text is first split
// into pre-tokens by a regex, and every pre-token is byte-pair encoded on its
// own. A cut at a pre-token boundary therefore never changes the count:
// count(a+b) == count(a) + count(b). The token counter (internal/bpe) returns
// counts, not token ids, so this file finds such boundaries itself, with a
// conservative rule that holds for both cl100k_base and o200k_base (see
// safeCut): a position p is a pre-token boundary when
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
// a letter, in runs without whitespace) may or may not be boundaries; the
// code treats them as not known to be.

// DefaultShardSize is the segment size Shard uses when asked for size <= 0.
const DefaultShardSize = 16

// shardBoundFactor bounds how far Shard looks for a sentence end: a segment
// holds at most shardBoundFactor×size tokens unless it is cut hard.
const shardBoundFactor = 4

// Shard splits text into consecutive segments of at least size tokens
// (DefaultShardSize when size <= 0), counted exactly with the encoding that
// bills model (o200k_base or cl100k_base, as for the router's counts), each
// ending at a sentence end. It is meant for batch chunking (embedding a long
// document sentence-aligned, splitting a prompt into cacheable pieces).
//
// Guarantees:
//
//   - strings.Join(Shard(text, size, model), "") == text, byte for byte,
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
//     punctuation; see the rule at the top of shard.go) at which the segment
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
func Shard(text string, size int, model string) []string {
	if text == "" {
		return nil
	}
	if size <= 0 {
		size = DefaultShardSize
	}
	sh := sharder{text: text, enc: encodingFor(model), size: size, bound: size * shardBoundFactor}
	if size > (1<<31-1)/shardBoundFactor {
		sh.bound = 1<<31 - 1
	}
	minB := min(max(2*size, 32), 4096)
	sh.units = shardUnits(sh.enc, text, minB, shardBoundFactor*minB)
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

// shardUnit is a piece of text the sharder never cuts inside except for a
// hard cut; units tile the text.
type shardUnit struct {
	end      int  // offset just past the unit
	tokens   int  // countTokens of the unit on its own
	sentence bool // end is a sentence end (or the end of the text)
	safe     bool // end is a pre-token boundary: counts add across it
}

type sharder struct {
	text        string
	enc         encoding
	size, bound int
	units       []shardUnit
}

func (sh *sharder) count(a, b int) int { return countTokens(sh.enc, sh.text[a:b]) }

func (sh *sharder) unitStart(k int) int {
	if k == 0 {
		return 0
	}
	return sh.units[k-1].end
}

// extend adds units[k] to the token estimate of the segment that starts at
// s in units[j]. The estimate is a sum of unit counts, exact while every
// cut between the units summed is a pre-token boundary.
func (sh *sharder) extend(s, j, k, est int, exact bool) (int, bool) {
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
func (sh *sharder) next(s, j int) int {
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
func (sh *sharder) hardCut(s, j int) int {
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
func (sh *sharder) bisect(s, lo, hi int) int {
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
		m := runeStartBefore(sh.text, lo+step, lo, hi)
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
		m := runeStartBefore(sh.text, lo+(b-lo)/2, lo, b)
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

// shardUnits tiles text with units: sentences, cut further at a pre-token
// boundary once a unit has minB bytes, or at a rune start once it has maxB
// bytes. Each unit is counted once.
func shardUnits(enc encoding, text string, minB, maxB int) []shardUnit {
	units := make([]shardUnit, 0, len(text)/max(minB, 1)+1)
	start := 0
	emit := func(end int, sentence bool) {
		for end-start > maxB { // long runs: newlines, "!!!!", unbroken words
			c := runeStartBefore(text, start+maxB, start, end)
			if c >= end {
				break
			}
			units = append(units, shardUnit{end: c, tokens: countTokens(enc, text[start:c]), safe: safeAt(text, c)})
			start = c
		}
		units = append(units, shardUnit{end: end, tokens: countTokens(enc, text[start:end]), sentence: sentence, safe: end == len(text) || safeAt(text, end)})
		start = end
	}
	prev := classNone
	for p := 0; p < len(text); {
		c := text[p]
		if c == '.' || c == '\n' || c == '!' || c == '?' || c == '\r' || (c >= 0xD8 && mayStartTerminator(c)) {
			if q, ok := sentenceEndAt(text, p); ok {
				emit(q, true)
				prev = classBefore(text, q)
				p = q
				continue
			}
		}
		cur, n := classAt(text, p)
		if p > start && p-start >= minB && safeCut(prev, cur) {
			emit(p, false)
		} else if p-start >= maxB {
			emit(p, false)
		}
		prev = cur
		p += n
	}
	if start < len(text) {
		emit(len(text), true)
	}
	return units
}

// mayStartTerminator reports whether c is the first byte of a non-ASCII
// terminator's UTF-8 encoding.
func mayStartTerminator(c byte) bool {
	switch c {
	case 0xD8, 0xDB, 0xE0, 0xE2, 0xE3, 0xEF: // ؟ ۔ । … 。 ！？．｡
		return true
	}
	return false
}

// sentenceEndAt reports whether a sentence end starts at text[p:] (see
// Shard) and, if so, the offset just past it.
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

// Rune classes for the pre-token boundary rule.
const (
	classNone    uint8 = iota // start of text
	classOther                // punctuation, symbols, invalid bytes (tiktoken reads them as U+FFFD)
	classLetter               // \p{L}
	classNumber               // \p{N}
	classMark                 // \p{M}: part of a word for o200k_base, punctuation for cl100k_base
	classSpace                // \s other than \r and \n
	classNewline              // \r, \n
	classApos                 // ', which may start a contraction suffix ('s, 'll, ...)
	classSlash                // /, which o200k_base glues after punctuation and newlines
)

var asciiClass = func() (t [utf8.RuneSelf]uint8) {
	for c := range t {
		t[c] = classOf(rune(c), 1)
	}
	return t
}()

func classOf(r rune, size int) uint8 {
	switch {
	case r == '\n' || r == '\r':
		return classNewline
	case r == '\'':
		return classApos
	case r == '/':
		return classSlash
	case r == utf8.RuneError && size <= 1:
		return classOther
	case unicode.IsSpace(r):
		return classSpace
	case unicode.IsLetter(r):
		return classLetter
	case unicode.IsNumber(r):
		return classNumber
	case unicode.IsMark(r):
		return classMark
	}
	return classOther
}

// classAt returns the class of the rune at s[p:] and its length.
func classAt(s string, p int) (uint8, int) {
	if c := s[p]; c < utf8.RuneSelf {
		return asciiClass[c], 1
	}
	r, n := utf8.DecodeRuneInString(s[p:])
	return classOf(r, n), n
}

// classBefore returns the class of the rune that ends at s[:p].
func classBefore(s string, p int) uint8 {
	if p == 0 {
		return classNone
	}
	if c := s[p-1]; c < utf8.RuneSelf {
		return asciiClass[c]
	}
	r, n := utf8.DecodeLastRuneInString(s[:p])
	return classOf(r, n)
}

// safeAt reports whether 0 < p < len(s) is a known pre-token boundary.
func safeAt(s string, p int) bool {
	if p <= 0 || p >= len(s) {
		return false
	}
	cur, _ := classAt(s, p)
	return safeCut(classBefore(s, p), cur)
}

// safeCut is the pre-token boundary rule between a rune of class prev and
// the next rune of class cur; see the comment at the top of this file. It
// was checked against both tiktoken split regexes (cl100k_base:
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+, and o200k_base's
// variant with case-split words, contraction suffixes and [\r\n/]* after
// punctuation): no alternative matches across such a position, and since
// the regexes have no lookbehind, the text after it splits the same on its
// own.
func safeCut(prev, cur uint8) bool {
	switch prev {
	case classNone:
		return false
	case classSpace:
		return false
	case classNewline:
		return cur != classSpace && cur != classNewline && cur != classSlash
	}
	switch cur {
	case classSpace:
		return true
	case classNewline:
		return prev == classLetter || prev == classNumber
	case classOther, classSlash:
		return prev == classLetter
	}
	return false
}

// Prefix blocks.

const (
	// BlockTokens is the size of a prefix block in tokens; see PrefixBlocks.
	BlockTokens = 16
	// DefaultPrefixTokens is how many leading tokens of the canonical prompt
	// the affinity key covers.
	DefaultPrefixTokens = 256
	// prefixBytesPerToken caps the bytes of text PrefixBlocks reads: at most
	// prefixBytesPerToken×maxTokens, so a prompt of long tokens (or of no
	// boundaries at all) costs bounded time.
	prefixBytesPerToken = 16
	// blockWindow is how many bytes from a block's start key the memoized
	// block end; blocks longer than that are found again on every call.
	blockWindow = 256
	// Memo kinds for block ends: a window that stops short of the text's end,
	// and one that reaches it (the same bytes mean different things).
	kindBlock    uint8 = 0xB1
	kindBlockEnd uint8 = 0xB2
)

// PrefixBlocks returns the chained hashes of the prefix blocks of text, the
// definition the router's affinity key and relaytest's prefix-cache
// simulator share. It is deterministic and the same in every process and on
// every platform.
//
// Definition:
//
//  1. maxTokens <= 0 means DefaultPrefixTokens. The text considered, t, is
//     text cut to at most 16×maxTokens bytes: if text is longer, t =
//     text[:i] where i is the largest offset <= 16×maxTokens, and at least
//     16×maxTokens-3, whose byte is not a UTF-8 continuation byte (or
//     16×maxTokens if there is none).
//  2. Blocks tile t from its start. A block starting at offset a ends at the
//     first offset b with a < b < len(t) that is a pre-token boundary by the
//     rule at the top of shard.go and such that t[a:b] has at least
//     BlockTokens (16) tokens in model's encoding (encodingFor: o200k_base
//     or cl100k_base). Cuts at pre-token boundaries keep counts exact, so
//     t[a:b] has the same tokens alone as inside t; a block has 16 tokens or
//     a little more (a whole word or run is never split). If there is no
//     such b, the rest of t is not a full block.
//  3. Blocks are taken while the blocks before cover fewer than maxTokens
//     tokens, so they cover the first maxTokens tokens or a little more.
//  4. Let fnv1a(h, b) be FNV-1a 64 over the bytes b continued from the
//     state h (prime 1099511628211; the standard offset basis is
//     14695981039346656037), and mix the MurmurHash3 fmix64 finalizer.
//     H(-1) = mix(fnv1a(offset basis, "relay/prefix/v1/" + encoding
//     name)), and block i's hash H(i) = mix(fnv1a(H(i-1), the bytes of
//     block i)). Each hash thus covers the
//     encoding and all text up to the end of its block.
//  5. The result is H(0), H(1), ... for the full blocks. A text with no full
//     block (fewer than 16 tokens, or no boundary) gives one hash,
//     mix(fnv1a(H(-1), t)): a short prompt hashes what it has. Empty text
//     gives nil.
//
// Two texts share the first k hashes exactly when they share the bytes of
// the first k blocks (up to hash collisions). Cost: linear in the bytes of
// the blocks, about 10 µs per 1 KB of text for the counting, with no
// caching; the router memoizes block ends in its token memo.
func PrefixBlocks(text string, model string, maxTokens int) []uint64 {
	if maxTokens <= 0 {
		maxTokens = DefaultPrefixTokens
	}
	return prefixBlocks(nil, encodingFor(model), prefixCut(text, maxTokens), maxTokens, nil)
}

// prefixCut cuts text to the bytes PrefixBlocks reads (step 1).
func prefixCut(text string, maxTokens int) string {
	limit := prefixLimit(maxTokens)
	if len(text) <= limit {
		return text
	}
	for i := limit; i >= 0 && i > limit-utf8.UTFMax; i-- {
		if utf8.RuneStart(text[i]) {
			return text[:i]
		}
	}
	return text[:limit]
}

func prefixLimit(maxTokens int) int {
	if maxTokens > (1<<31-1)/prefixBytesPerToken {
		return 1<<31 - 1
	}
	return prefixBytesPerToken * maxTokens
}

const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

func fnv1a(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime64
	}
	return h
}

// fmix64 is MurmurHash3's fmix64 finalizer.
func fmix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

var prefixSeeds = [2]uint64{
	o200k:  fmix64(fnv1a(fnvOffset64, "relay/prefix/v1/"+o200k.String())),
	cl100k: fmix64(fnv1a(fnvOffset64, "relay/prefix/v1/"+cl100k.String())),
}

// prefixBlocks appends the block hashes of t (already cut by prefixCut) to
// dst. m, when not nil, memoizes block ends.
func prefixBlocks(m *memo, enc encoding, t string, maxTokens int, dst []uint64) []uint64 {
	if t == "" {
		return dst
	}
	seed := prefixSeeds[enc]
	h, start, covered, n0 := seed, 0, 0, len(dst)
	for covered < maxTokens {
		end, tokens, ok := nextBlock(m, enc, t, start)
		if !ok {
			break
		}
		h = fmix64(fnv1a(h, t[start:end]))
		dst = append(dst, h)
		start, covered = end, covered+tokens
	}
	if len(dst) == n0 {
		dst = append(dst, fmix64(fnv1a(seed, t)))
	}
	return dst
}

// nextBlock returns the end and token count of the block of t starting at
// start, looking it up in m first. A memo entry is keyed by the window of
// blockWindow bytes from start (or the rest of t, under another kind), and
// only stored when the window determines the answer.
func nextBlock(m *memo, enc encoding, t string, start int) (end, tokens int, ok bool) {
	w, kind := t[start:], kindBlockEnd
	if len(w) > blockWindow {
		w, kind = w[:blockWindow], kindBlock
	}
	if v, hit := m.get(enc, kind, w); hit {
		if v < 0 {
			return 0, 0, false
		}
		return start + v&0xFFFF, v >> 16, true
	}
	end, tokens, ok = scanBlock(enc, t, start)
	switch {
	case ok:
		if end < len(t) {
			if _, n := classAt(t, end); end+n <= start+len(w) {
				m.put(enc, kind, w, (end-start)|tokens<<16)
			}
		}
	case kind == kindBlockEnd:
		m.put(enc, kind, w, -1)
	}
	return end, tokens, ok
}

// scanBlock finds the block starting at start by counting the pieces
// between consecutive pre-token boundaries, whose counts add up exactly.
func scanBlock(enc encoding, t string, start int) (end, tokens int, ok bool) {
	sum, piece := 0, start
	prev := classNone
	for p := start; p < len(t); {
		cur, n := classAt(t, p)
		if p > start && safeCut(prev, cur) {
			sum += countTokens(enc, t[piece:p])
			piece = p
			if sum >= BlockTokens {
				return p, sum, true
			}
		}
		prev = cur
		p += n
	}
	return 0, 0, false
}

// Affinity key.

// affinityKey returns the request's affinity key: the hash of the last full
// prefix block (PrefixBlocks) of its canonical prompt, over its first
// DefaultPrefixTokens tokens, in the request's encoding; with no full block,
// the hash of the whole (short) canonical prompt. Requests whose canonical
// prompts share their first 256 tokens (or a little more, to the end of the
// block) share a key. It returns 0 when there is no prompt: a body that is
// not a JSON object, an unknown endpoint, an empty prompt.
//
// The canonical prompt is plain text built from the body, in this order,
// each piece followed by "\n":
//
//   - chat/completions: the leading system and developer messages, then
//     "tools\n" and the raw JSON of "tools" (if any), then the other
//     messages;
//   - responses: "system\n" and "instructions" (if any), then "tools\n" and
//     the raw JSON of "tools", then "input": a string as a user message, an
//     array as messages;
//   - completions and embeddings: the "prompt" or "input" string, or the
//     strings of an array joined by "\n" (token-id arrays contribute
//     nothing).
//
// A message is its role (or, for a Responses item without one, its type),
// "\n", then each of: the string content, or each text, input_text,
// output_text or refusal part's text ("<image>" for an image part), then
// name(arguments) for each tool call or function_call item, and the output
// of a function_call_output item, each followed by "\n". Strings are the
// decoded JSON strings; member names are matched as written (a name spelled
// with JSON escapes is not recognised).
//
// So a chat request with system message S and user message Q, and a
// Responses request with instructions S and input Q, have the same canonical
// prompt and the same key as long as they carry no tools (tool definitions
// are hashed as sent, and the two APIs shape them differently) and use the
// same roles ("developer" is not "system").
//
// Cost: only the first 16×256 bytes of canonical text are built, from a
// pooled buffer; with a warm token memo each block end is one memo lookup,
// so the key of a 4 KB chat prompt costs a few microseconds.
func (r *Router) affinityKey(c *classified) uint64 {
	if !c.json || c.req.Endpoint == "" {
		return 0
	}
	limit := prefixLimit(DefaultPrefixTokens)
	bp := canonPool.Get().(*[]byte)
	cb := canonBuilder{buf: (*bp)[:0], limit: limit + 1}
	cb.build(c.req.Endpoint, c.body)
	var key uint64
	if len(cb.buf) > 0 {
		t := prefixCut(unsafe.String(unsafe.SliceData(cb.buf), len(cb.buf)), DefaultPrefixTokens)
		var arr [DefaultPrefixTokens/BlockTokens + 2]uint64
		var m *memo
		if r.counter != nil {
			m = r.counter.memo
		}
		hs := prefixBlocks(m, c.enc, t, DefaultPrefixTokens, arr[:0])
		key = hs[len(hs)-1]
	}
	*bp = cb.buf[:0]
	canonPool.Put(bp)
	return key
}

var canonPool = sync.Pool{New: func() any {
	b := make([]byte, 0, prefixLimit(DefaultPrefixTokens)+64)
	return &b
}}

// canonBuilder appends the canonical prompt of a request to buf, stopping
// once it holds limit bytes. It walks the body with jsonEach, which skips
// strings with a vectorized search for quotes, so a 4 KB message costs a
// fraction of a microsecond to step over; only the prefix it keeps is
// decoded.
type canonBuilder struct {
	buf   []byte
	limit int
}

func (cb *canonBuilder) full() bool { return len(cb.buf) >= cb.limit }

func (cb *canonBuilder) str(s string) {
	if n := cb.limit - len(cb.buf); n > 0 {
		cb.buf = append(cb.buf, s[:min(n, len(s))]...)
	}
}

// jstr appends the decoded JSON string raw (a raw JSON value; nothing if it
// is not a string).
func (cb *canonBuilder) jstr(raw string) {
	if len(raw) >= 2 && raw[0] == '"' {
		cb.buf = appendUnescaped(cb.buf, raw[1:len(raw)-1], cb.limit)
	}
}

// isStr reports whether raw is a non-empty JSON string.
func isStr(raw string) bool { return len(raw) > 2 && raw[0] == '"' }

func (cb *canonBuilder) build(endpoint string, body string) {
	var msgs, tools, ins, input string
	jsonEach(body, 0, func(k, v string) bool {
		switch k {
		case "messages":
			msgs = v
		case "tools":
			tools = v
		case "instructions":
			ins = v
		case "input", "prompt":
			if (endpoint == EndpointCompletions) == (k == "prompt") {
				input = v
			}
		}
		return true
	})
	switch endpoint {
	case EndpointChat:
		leading := true
		jsonEach(msgs, 0, func(_, m string) bool {
			if leading {
				if role := jsonField(m, "role"); role != `"system"` && role != `"developer"` {
					leading = false
					cb.tools(tools)
				}
			}
			cb.message(m)
			return !cb.full()
		})
		if leading {
			cb.tools(tools)
		}
	case EndpointResponses:
		if isStr(ins) {
			cb.str("system\n")
			cb.jstr(ins)
			cb.str("\n")
		}
		cb.tools(tools)
		switch {
		case isStr(input):
			cb.str("user\n")
			cb.jstr(input)
			cb.str("\n")
		case strings.HasPrefix(input, "["):
			jsonEach(input, 0, func(_, m string) bool {
				cb.message(m)
				return !cb.full()
			})
		}
	case EndpointCompletions, EndpointEmbeddings:
		switch {
		case strings.HasPrefix(input, `"`):
			cb.jstr(input)
		case strings.HasPrefix(input, "["):
			first := true
			jsonEach(input, 0, func(_, v string) bool {
				if strings.HasPrefix(v, `"`) {
					if !first {
						cb.str("\n")
					}
					first = false
					cb.jstr(v)
				}
				return !cb.full()
			})
		}
	}
}

func (cb *canonBuilder) tools(tools string) {
	if strings.HasPrefix(tools, "[") && len(tools) > 2 && !cb.full() {
		cb.str("tools\n")
		cb.str(tools)
		cb.str("\n")
	}
}

func (cb *canonBuilder) message(m string) {
	if !strings.HasPrefix(m, "{") || cb.full() {
		return
	}
	var role, typ, content, calls, name, args, output string
	jsonEach(m, 0, func(k, v string) bool {
		switch k {
		case "role":
			role = v
		case "type":
			typ = v
		case "content":
			content = v
		case "tool_calls":
			calls = v
		case "name":
			name = v
		case "arguments":
			args = v
		case "output":
			output = v
		}
		return true
	})
	if strings.HasPrefix(role, `"`) {
		cb.jstr(role)
	} else {
		cb.jstr(typ)
	}
	cb.str("\n")
	switch {
	case strings.HasPrefix(content, `"`):
		cb.jstr(content)
		cb.str("\n")
	case strings.HasPrefix(content, "["):
		jsonEach(content, 0, func(_, part string) bool {
			switch jsonField(part, "type") {
			case `"text"`, `"input_text"`, `"output_text"`:
				cb.jstr(jsonField(part, "text"))
				cb.str("\n")
			case `"refusal"`:
				cb.jstr(jsonField(part, "refusal"))
				cb.str("\n")
			case `"image_url"`, `"input_image"`, `"image"`:
				cb.str("<image>\n")
			}
			return !cb.full()
		})
	}
	jsonEach(calls, 0, func(_, call string) bool {
		fn := jsonField(call, "function")
		cb.jstr(jsonField(fn, "name"))
		cb.str("(")
		cb.jstr(jsonField(fn, "arguments"))
		cb.str(")\n")
		return !cb.full()
	})
	if typ == `"function_call"` {
		cb.jstr(name)
		cb.str("(")
		cb.jstr(args)
		cb.str(")\n")
	}
	if strings.HasPrefix(output, `"`) {
		cb.jstr(output)
		cb.str("\n")
	}
}

// A minimal JSON walker over valid JSON (classify checked the body). It
// compares keys as they are written (keys with escapes do not match) and
// never panics on invalid input.

// jsonEach calls f with the key (raw, without quotes; "" in an array) and
// the raw value of each member of the object or array at s[i:], until f
// returns false. It does nothing if s[i:] is neither.
func jsonEach(s string, i int, f func(key, val string) bool) {
	i = jsonWS(s, i)
	if i >= len(s) || (s[i] != '{' && s[i] != '[') {
		return
	}
	obj := s[i] == '{'
	i++
	for {
		i = jsonWS(s, i)
		if i >= len(s) || s[i] == '}' || s[i] == ']' {
			return
		}
		if s[i] == ',' {
			i++
			continue
		}
		key := ""
		if obj {
			if s[i] != '"' {
				return
			}
			e := jsonSkipString(s, i)
			key = s[i+1 : max(i+1, e-1)]
			i = jsonWS(s, e)
			if i >= len(s) || s[i] != ':' {
				return
			}
			i = jsonWS(s, i+1)
			if i >= len(s) {
				return
			}
		}
		e := jsonSkipValue(s, i)
		if e <= i || !f(key, s[i:e]) {
			return
		}
		i = e
	}
}

// jsonField returns the raw value of the member key of the object s, or "".
func jsonField(s, key string) string {
	var out string
	jsonEach(s, 0, func(k, v string) bool {
		if k == key {
			out = v
			return false
		}
		return true
	})
	return out
}

func jsonWS(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}

// jsonSkipString returns the offset just past the string at s[i] == '"'.
func jsonSkipString(s string, i int) int {
	i++
	for i < len(s) {
		j := strings.IndexByte(s[i:], '"')
		if j < 0 {
			return len(s)
		}
		j += i
		k := j
		for k > i && s[k-1] == '\\' {
			k--
		}
		if (j-k)%2 == 0 {
			return j + 1
		}
		i = j + 1
	}
	return len(s)
}

// jsonSkipValue returns the offset just past the value at s[i:].
func jsonSkipValue(s string, i int) int {
	switch s[i] {
	case '"':
		return jsonSkipString(s, i)
	case '{', '[':
		depth := 0
		for i < len(s) {
			switch s[i] {
			case '"':
				i = jsonSkipString(s, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return len(s)
	}
	for i < len(s) {
		switch s[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
		i++
	}
	return i
}

// appendUnescaped appends the decoded JSON string body raw (without its
// quotes) to dst, stopping once dst holds limit bytes. Invalid escapes are
// copied as they are; lone surrogates become U+FFFD.
func appendUnescaped(dst []byte, raw string, limit int) []byte {
	for i := 0; i < len(raw) && len(dst) < limit; {
		j := strings.IndexByte(raw[i:], '\\')
		if j < 0 {
			j = len(raw)
		} else {
			j += i
		}
		if j > i {
			dst = append(dst, raw[i:min(j, i+limit-len(dst))]...)
			i = j
			continue
		}
		if i+1 >= len(raw) {
			dst = append(dst, '\\')
			break
		}
		switch c := raw[i+1]; c {
		case '"', '\\', '/':
			dst = append(dst, c)
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r, ok := hex4(raw, i+2)
			if !ok {
				dst = append(dst, raw[i:i+2]...)
				break
			}
			i += 6
			if utf16IsSurrogate(r) {
				r2, ok2 := rune(0), false
				if i+1 < len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
					r2, ok2 = hex4(raw, i+2)
				}
				if ok2 && r >= 0xD800 && r < 0xDC00 && r2 >= 0xDC00 && r2 < 0xE000 {
					r = (r-0xD800)<<10 | (r2 - 0xDC00) + 0x10000
					i += 6
				} else {
					r = utf8.RuneError
				}
			}
			dst = utf8.AppendRune(dst, r)
			continue
		default:
			dst = append(dst, raw[i:i+2]...)
		}
		i += 2
	}
	if len(dst) > limit {
		dst = dst[:limit]
	}
	return dst
}

func utf16IsSurrogate(r rune) bool { return r >= 0xD800 && r < 0xE000 }

func hex4(s string, i int) (rune, bool) {
	if i+4 > len(s) {
		return 0, false
	}
	v, err := strconv.ParseUint(s[i:i+4], 16, 32)
	if err != nil {
		return 0, false
	}
	return rune(v), true
}

// prompt_cache_key injection.

// cacheKeyString renders an affinity key as a prompt_cache_key value.
func cacheKeyString(key uint64) string {
	var b [22]byte
	copy(b[:], "relay-")
	const hexd = "0123456789abcdef"
	for i := 0; i < 16; i++ {
		b[6+i] = hexd[key>>(60-4*i)&0xF]
	}
	return string(b[:])
}
