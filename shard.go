package relay

import (
	"encoding/binary"
	"math/bits"
	"sync"
	"unicode/utf8"
	"unsafe"

	"github.com/tokenrelay/relay/internal/prompt"
	"github.com/tokenrelay/relay/internal/tokens"
)

// The prompt sharder: a request's canonical prompt (internal/prompt) is cut
// into shards of 16 tokens over its first 256 tokens, each shard's hash
// chained to the one before; the last full shard's hash is the request's
// affinity key. Requests that share a long prefix (a system prompt, a tool
// set, a document) share a key, and so a home upstream. A conversation past
// its first turn is keyed on its first turn as well (step 6), so that each
// conversation has a home of its own instead of every conversation behind
// one long system prompt sharing one.
//
// Definition, for a text and an encoding:
//
//  1. The text considered, t, is the text cut to at most 16×256 bytes: if
//     it is longer, t = text[:i] where i is the largest offset <= 16×256,
//     and at least 16×256-3, whose byte is not a UTF-8 continuation byte
//     (or 16×256 if there is none).
//  2. Shards tile t from its start. A shard starting at offset a ends at
//     the first offset b with a < b < len(t) that is a pre-token boundary
//     (tokens.SafeAt) and such that t[a:b] has at least 16 tokens. Cuts at
//     pre-token boundaries keep counts exact, so t[a:b] has the same tokens
//     alone as inside t; a shard has 16 tokens or a little more (a whole
//     word or run is never split). If there is no such b, the rest of t is
//     not a full shard.
//  3. Shards are taken while the shards before cover fewer than 256
//     tokens, so they cover the first 256 tokens or a little more.
//  4. Let fnv1a(h, b) be FNV-1a 64 over the bytes b continued from the
//     state h, and mix the MurmurHash3 fmix64 finalizer. H(-1) =
//     mix(fnv1a(offset basis, "relay/prefix/v1/" + encoding name)), and
//     shard i's hash H(i) = mix(fnv1a(H(i-1), the bytes of shard i)). Each
//     hash thus covers the encoding and all text up to the end of its
//     shard.
//  5. The hashes are H(0), H(1), ... for the full shards. A text with no
//     full shard (fewer than 16 tokens, or no boundary) gives one hash,
//     mix(fnv1a(H(-1), t)): a short prompt hashes what it has. Empty text
//     gives none. The prefix key P is the last hash.
//  6. The conversation anchor of a chat request (of a Responses input
//     array) is the first message after the leading system and developer
//     messages, when at least one more message follows it: the request is
//     a conversation past its first turn (an answer, a tool call or a tool
//     output came back). Its text A is that message's canonical text
//     (internal/prompt, the message alone) cut to its first 512 bytes.
//     With an anchor the key is mix(words(P, A)); without one it is P,
//     where words(h, b) continues h over b eight bytes at a time: for each
//     little-endian 64-bit word w of b (the last one padded with zero
//     bytes), h = rotl(h ^ w, 31) × 0x9E3779B97F4A7C15; then
//     h ^= len(b). A
//     one-shot request (a batch item behind a shared context, a
//     conversation's first turn) keeps the shared prefix's key; the later
//     turns of a conversation share a key of their own.
//
// The definition is deterministic and the same in every process and on
// every platform, so replicas of a service agree on every key.
const (
	shardTokens  = 16  // tokens of a prefix shard
	prefixTokens = 256 // leading tokens of the canonical prompt the key covers
	// prefixBytesPerToken caps the bytes read: at most 16×256, so a prompt
	// of long tokens (or of no boundaries at all) costs bounded time.
	prefixBytesPerToken = 16
	prefixLimit         = prefixBytesPerToken * prefixTokens
	// shardWindow is how many bytes from a shard's start key its memoized
	// end; shards longer than that are found again on every call.
	shardWindow = 256
	// anchorLimit caps the bytes of a conversation anchor's text (step 6):
	// enough to tell conversations apart, and hashed a word at a time.
	anchorLimit = 512
)

// withAnchor mixes a conversation anchor's text a into the prefix key p
// (step 6).
func withAnchor(p uint64, a []byte) uint64 {
	if len(a) == 0 || p == 0 {
		return p
	}
	return fmix64(words(p, a))
}

// words continues h over b eight bytes at a time (step 6).
func words(h uint64, b []byte) uint64 {
	n := len(b)
	for ; len(b) >= 8; b = b[8:] {
		h = bits.RotateLeft64(h^binary.LittleEndian.Uint64(b), 31) * 0x9E3779B97F4A7C15
	}
	if len(b) > 0 {
		var w [8]byte
		copy(w[:], b)
		h = bits.RotateLeft64(h^binary.LittleEndian.Uint64(w[:]), 31) * 0x9E3779B97F4A7C15
	}
	return h ^ uint64(n)
}

// keyOf returns the request's affinity key: the hash of the last full
// prefix shard of its canonical prompt, or of the whole (short) canonical
// prompt when it has no full shard. It is 0 when there is no prompt (a body
// that is not a JSON object, an unknown endpoint, an empty prompt) and when
// nothing uses the key (the strategy does not hash, and PromptCacheKey is
// off). classify computes it, in the same pass as the prompt's count.
func (r *Router) keyOf(c *classified) uint64 { return c.key }

// wantsKey reports whether something uses the affinity key.
func (r *Router) wantsKey() bool {
	st := r.s.strategy
	return st == StrategyAffinity || st == StrategyBoundedLoad || st == StrategyExpectedCost || r.s.cacheKey
}

// prefixKey computes the affinity key of the body sc.rd read, in encoding
// enc. It leaves in sc the cumulative token counts it learned at pre-token
// boundaries of the canonical prompt (sc.shards) and where each string sits
// in it (sc.canon.At), for the prompt's count to reuse.
//
// A prompt seen before is found in the memo under its strings as written
// (rawKey): no canonical prompt is built. Otherwise only as much canonical
// prompt is built as the shards need: its first prefixFirst bytes, and the
// rest up to 16×256 bytes when a shard reaches past them. When the prefix
// key depended on those first bytes alone, it is memoized under them (a
// new turn of a known conversation costs one build and one hash of at most
// prefixFirst bytes), and the whole key under the raw key. Otherwise each
// shard end is a memo lookup (warm) or the pieces of the shard are counted
// (cold), and the prompt's count does not count them again.
func (r *Router) prefixKey(enc tokens.Encoding, sc *scratch) uint64 {
	m := r.counter.memo
	sc.shards = sc.shards[:0]
	raw, rawOK := r.rawKey(enc, sc)
	if rawOK {
		if v, ok := m.getKey(raw); ok {
			sc.canon.At, sc.canon.End = sc.canon.At[:0], sc.canon.End[:0]
			return v
		}
	}
	p, stable := r.prefix(enc, sc)
	key := r.anchored(p, sc)
	if rawOK && stable {
		m.putKey(raw, key)
	}
	return key
}

// prefix computes the prefix key P (step 5) of the body sc.rd read, and
// reports whether it depended on the canonical prompt's first prefixFirst
// bytes alone.
func (r *Router) prefix(enc tokens.Encoding, sc *scratch) (p uint64, stable bool) {
	m := r.counter.memo
	sc.canon.Buf, sc.canon.Limit = sc.canon.Buf[:0], prefixFirst
	sc.rd.AppendCanonical(&sc.canon)
	if len(sc.canon.Buf) == 0 {
		return 0, true
	}
	x := shardText{t: unsafe.String(unsafe.SliceData(sc.canon.Buf), len(sc.canon.Buf))}
	if len(x.t) == prefixFirst { // there may be more
		x.more = func() string {
			sc.canon.Buf, sc.canon.Limit = sc.canon.Buf[:0], prefixLimit+1
			sc.rd.AppendCanonical(&sc.canon)
			return prefixCut(unsafe.String(unsafe.SliceData(sc.canon.Buf), len(sc.canon.Buf)))
		}
	}
	first, all := x.t, x.more == nil
	if v, ok := m.getWord(enc, kindKey, first); ok {
		return v, true
	}
	sc.shards = append(sc.shards, known{})
	var buf [prefixTokens/shardTokens + 1]int
	ends := shardEnds(m, enc, &x, buf[:0], &sc.shards)
	var arr [prefixTokens/shardTokens + 2]uint64
	hs := shardHashes(enc, x.whole(len(ends) == 0), ends, arr[:0])
	p = hs[len(hs)-1]
	stable = all || x.need <= len(first)
	if stable {
		m.putWord(enc, kindKey, first, p)
	}
	return p, stable
}

// rawKey is the memo key of the affinity key of the body sc.rd read, taken
// from its strings as written: the pieces of its canonical prompt until
// they hold prefixFirst bytes, then those of its anchor until they hold
// anchorLimit bytes, each string by the hash the Reader's Known took (or
// one taken here). Equal raw keys mean equal canonical texts as far as the
// key reads them when it depended on the first prefixFirst bytes alone
// (stable), so a prompt seen before costs no canonical prompt, no decoding
// and one lookup. Decoded lengths come from the memo (rawWord), or from
// decoding a short string; a long string with escapes that the memo does
// not know (a new prompt) ends the attempt: there is no raw key.
func (r *Router) rawKey(enc tokens.Encoding, sc *scratch) (uint64, bool) {
	m := r.counter.memo
	if m == nil {
		return 0, false
	}
	k := &sc.raw
	*k = rawKeyer{m: m, sc: sc, limit: prefixFirst}
	sc.rd.CanonicalPieces(k)
	if k.n == 0 || k.failed {
		*k = rawKeyer{}
		return 0, false
	}
	k.h, k.n, k.limit = bits.RotateLeft64(k.h^3, 31)*0x9E3779B97F4A7C15, 0, anchorLimit
	sc.rd.AnchorPieces(k)
	h, failed := fmix64(k.h), k.failed
	*k = rawKeyer{}
	return memoKey(h, enc, kindRawKey), !failed
}

// rawKeyer hashes pieces for rawKey until they hold limit decoded bytes.
type rawKeyer struct {
	m        *memo
	sc       *scratch
	h        uint64
	n, limit int
	failed   bool
}

func (k *rawKeyer) Piece(pc prompt.Piece) bool {
	var x uint64
	var l int
	if pc.Str < 0 {
		x, l = k.m.hash(pc.Lit)^1, len(pc.Lit)
	} else {
		rd := &k.sc.rd
		s := rd.Strs[pc.Str]
		raw := rd.Raw(s)
		x = s.H
		if !s.Hashed {
			x = k.m.hash(raw)
		}
		x ^= 2
		switch {
		case !s.Esc:
			l = len(raw)
		case s.Seen:
			l = int(s.W >> 32)
		case len(raw) < memoMin:
			k.sc.dec = rd.AppendStr(k.sc.dec[:0], s)
			l = len(k.sc.dec)
		default:
			// A long string the memo does not know: a new prompt, whose
			// key the memo does not know either. Not worth decoding it
			// for its length.
			k.failed = true
			return false
		}
	}
	k.h = bits.RotateLeft64(k.h^x, 31) * 0x9E3779B97F4A7C15
	k.n += l
	return k.n < k.limit
}

// anchored mixes the conversation anchor of the body sc.rd read into the
// prefix key p.
func (r *Router) anchored(p uint64, sc *scratch) uint64 {
	sc.anchor.Buf, sc.anchor.Limit = sc.anchor.Buf[:0], anchorLimit
	sc.rd.AppendAnchor(&sc.anchor)
	return withAnchor(p, sc.anchor.Buf)
}

// prefixFirst is how much canonical prompt prefixKey builds first: enough
// for the 256 tokens of most prompts.
const prefixFirst = 2048

// keyRef is the reference computation of the key of c: the canonical
// prompt built by prompt.AppendCanonical.
func (r *Router) keyRef(c *classified) uint64 {
	bp := canonPool.Get().(*[]byte)
	buf := prompt.AppendCanonical((*bp)[:0], c.req.Endpoint, c.body, prefixLimit+1)
	var key uint64
	if len(buf) > 0 {
		t := prefixCut(unsafe.String(unsafe.SliceData(buf), len(buf)))
		var arr [prefixTokens/shardTokens + 2]uint64
		hs := prefixShards(r.counter.memo, c.enc, t, arr[:0], nil)
		a := prompt.AppendAnchor(buf[len(buf):], c.req.Endpoint, c.body, anchorLimit)
		key = withAnchor(hs[len(hs)-1], a)
	}
	*bp = buf[:0]
	canonPool.Put(bp)
	return key
}

var canonPool = sync.Pool{New: func() any {
	b := make([]byte, 0, prefixLimit+anchorLimit+64)
	return &b
}}

// known is a pre-token boundary of a text and the count of the text up to
// it.
type known struct{ pos, cum int }

// prefixCut cuts text to the bytes the shards cover (step 1).
func prefixCut(text string) string {
	return text[:runeStartAtOrBefore(text, prefixLimit)]
}

// shardText is the text the shards tile: t holds all of it, or a prefix
// of it and more builds the rest. need is how much of the text the shards
// looked at: they depend on text[:need] alone.
type shardText struct {
	t     string
	more  func() string // nil once t holds all the text
	need  int
	valid int8 // t is valid UTF-8: 0 unknown, 1 yes, -1 no
}

// isValid reports whether t is valid UTF-8, checked once per text.
func (x *shardText) isValid() bool {
	if x.valid == 0 {
		x.valid = -1
		if utf8.ValidString(x.t) {
			x.valid = 1
		}
	}
	return x.valid > 0
}

// has reports whether the text has at least n bytes, building the rest of
// it when t holds fewer.
func (x *shardText) has(n int) bool {
	x.need = max(x.need, n)
	if n > len(x.t) && x.more != nil {
		x.t, x.more, x.valid = x.more(), nil, 0
	}
	return n <= len(x.t)
}

// whole returns t, all of the text when all is set.
func (x *shardText) whole(all bool) string {
	if all {
		x.has(prefixLimit + 1)
	}
	return x.t
}

// prefixShards appends the shard hashes of t (already cut by prefixCut) to
// dst. m, when not nil, memoizes shard ends. kn, when not nil, gets every
// boundary of t whose cumulative count was learned (shard ends and the ends
// of the pieces counted to find them), in order, from (0, 0).
func prefixShards(m *memo, enc tokens.Encoding, t string, dst []uint64, kn *[]known) []uint64 {
	if t == "" {
		return dst
	}
	if kn != nil {
		*kn = append(*kn, known{})
	}
	var buf [prefixTokens/shardTokens + 1]int
	ends := shardEnds(m, enc, &shardText{t: t}, buf[:0], kn)
	return shardHashes(enc, t, ends, dst)
}

// shardEnds appends the ends of the full shards of x's text to ends
// (steps 2 and 3).
func shardEnds(m *memo, enc tokens.Encoding, x *shardText, ends []int, kn *[]known) []int {
	start, covered := 0, 0
	for covered < prefixTokens {
		end, n, ok := nextShard(m, enc, x, start, covered, kn)
		if !ok {
			break
		}
		ends = append(ends, end)
		start, covered = end, covered+n
	}
	return ends
}

// shardHashes appends the hashes of the shards of t that end at ends to
// dst, or the hash of t when there is none (steps 4 and 5).
func shardHashes(enc tokens.Encoding, t string, ends []int, dst []uint64) []uint64 {
	seed := prefixSeeds[enc]
	if len(ends) == 0 {
		return append(dst, fmix64(fnv1a(seed, t)))
	}
	h, start := seed, 0
	for _, end := range ends {
		h = fmix64(fnv1a(h, t[start:end]))
		dst = append(dst, h)
		start = end
	}
	return dst
}

// nextShard returns the end and token count of the shard of x's text
// starting at start, looking it up in m first. A memo entry is keyed by the
// window of shardWindow bytes from start (or the rest of the text, under
// another kind), and only stored when the window determines the answer.
// covered is the count of the text before start, for kn (see
// prefixShards).
func nextShard(m *memo, enc tokens.Encoding, x *shardText, start, covered int, kn *[]known) (end, n int, ok bool) {
	kind := kindBlockEnd
	if x.has(start + shardWindow + 1) {
		kind = kindBlock
	}
	w := x.t[start:min(len(x.t), start+shardWindow)]
	var k uint64 // the window's memo key, taken once for the lookup and the store
	if m != nil {
		k = m.key(enc, kind, w)
		if word, hit := m.getKey(k); hit {
			return shardFromMemo(wordCount(word), start, covered, kn)
		}
	}
	end, n, ok = scanShard(enc, x, start, covered, kn)
	switch {
	case m == nil:
	case ok:
		if x.has(end+utf8.UTFMax) || end < len(x.t) {
			if _, size := tokens.ClassAt(x.t, end); end+size <= start+len(w) {
				m.putKey(k, countWord((end-start)|n<<16))
			}
		}
	case kind == kindBlockEnd:
		m.putKey(k, countWord(-1))
	}
	return end, n, ok
}

// shardFromMemo is nextShard's answer from a memo entry v.
func shardFromMemo(v, start, covered int, kn *[]known) (end, n int, ok bool) {
	if v < 0 {
		return 0, 0, false
	}
	end, n = start+v&0xFFFF, v>>16
	if kn != nil {
		*kn = append(*kn, known{end, covered + n})
	}
	return end, n, true
}

// scanShard finds the shard starting at start by counting the pieces
// between consecutive pre-token boundaries, whose counts add up exactly.
// Each piece's end goes to kn, with covered plus the count up to it.
func scanShard(enc tokens.Encoding, x *shardText, start, covered int, kn *[]known) (end, n int, ok bool) {
	if end, n, ok, sure := scanShardPieces(enc, x, start, covered, kn); sure {
		return end, n, ok
	}
	return scanShardRunes(enc, x, start, covered, kn)
}

// scanShardPieces is scanShard in one pass of the counter over the text
// from start: every known boundary (tokens.SafeAt) is the end of a
// pre-token, so the boundaries are found among the pre-token ends, and the
// count up to each comes with it. It is not sure (and leaves kn as it was)
// when the text is not valid UTF-8 (the counter would read other offsets),
// or when a boundary would have to be judged within utf8.UTFMax bytes of
// the end of a text that may go on (x.more): scanShardRunes then builds
// the rest and decides.
func scanShardPieces(enc tokens.Encoding, x *shardText, start, covered int, kn *[]known) (end, n int, ok, sure bool) {
	t := x.t
	if !x.isValid() {
		return 0, 0, false, false
	}
	mark := 0
	if kn != nil {
		mark = len(*kn)
	}
	sure = true
	// The pieces come in batches of as many as may still be needed, each
	// holding a token or more: no piece past the shard's end is counted
	// but for the few that a shard's first safe end after its 16th token
	// needs.
	var buf [shardTokens]tokens.Piece
	lim := len(t) // pieces ending at lim or later end the scan
	if x.more != nil {
		lim = len(t) - utf8.UTFMax + 1
	}
scan:
	for i, cum := start, 0; i < len(t); {
		ps := enc.AppendPieces(buf[:0:max(shardTokens-cum, 1)], t, i, cum)
		for _, pc := range ps {
			p, c := int(pc.End), int(pc.Cum)
			if p >= lim {
				sure = x.more == nil // else the rune at p may be cut short, or the text go on
				break scan
			}
			if a, b := t[p-1], t[p]; a|b < utf8.RuneSelf {
				if !tokens.SafeASCII(a, b) { // SafeAt, inline
					continue
				}
			} else if !tokens.SafeAt(t, p) {
				continue
			}
			if kn != nil {
				*kn = append(*kn, known{p, covered + c})
			}
			if c >= shardTokens {
				end, n, ok = p, c, true
				break scan
			}
		}
		last := ps[len(ps)-1]
		i, cum = int(last.End), int(last.Cum)
	}
	if !ok && x.more != nil {
		sure = false // the text goes on (an empty one gives no piece end to see it by)
	}
	switch {
	case !sure:
		if kn != nil {
			*kn = (*kn)[:mark]
		}
	case ok:
		x.has(end + utf8.UTFMax) // what the text needed, as scanShardRunes notes it
	default:
		x.has(len(t) + utf8.UTFMax)
	}
	return end, n, ok, sure
}

// scanShardRunes is scanShard rune by rune: at each boundary, the piece
// since the last one is counted.
func scanShardRunes(enc tokens.Encoding, x *shardText, start, covered int, kn *[]known) (end, n int, ok bool) {
	sum, piece := 0, start
	prev := tokens.ClassNone
	for p := start; x.has(p+utf8.UTFMax) || p < len(x.t); {
		t := x.t
		cur, size := tokens.ClassAt(t, p)
		if p > start && tokens.SafeCut(prev, cur) {
			sum += enc.Count(t[piece:p])
			piece = p
			if kn != nil {
				*kn = append(*kn, known{p, covered + sum})
			}
			if sum >= shardTokens {
				return p, sum, true
			}
		}
		prev = cur
		p += size
	}
	return 0, 0, false
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
	tokens.O200K:  fmix64(fnv1a(fnvOffset64, "relay/prefix/v1/"+tokens.O200K.String())),
	tokens.CL100K: fmix64(fnv1a(fnvOffset64, "relay/prefix/v1/"+tokens.CL100K.String())),
}

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
