package bpe

import (
	"encoding/binary"
	"sync/atomic"
	"unsafe"
)

// pieceCache is a fixed-size, set-associative, lock-free cache from
// pre-token (2 to cacheKeyMax bytes) to its token count. Most pre-tokens of
// natural text and code are words that repeat, and so are whole clauses of
// text that is counted again (a system prompt, the history of a chat); a
// hit costs one hash and one or two cache lines of a table small enough to
// stay in the CPU caches, instead of rank lookups in the multi-megabyte
// vocabulary and a byte-pair merge.
//
// Pre-tokens are cached by length in four tables (see cacheGeometry) of
// slots of one meta word and 1, 3, 7 or 15 key words (16 to 128 bytes),
// allocated with the encoding and never grown: cacheBytes (2,304 KiB) per
// encoding in all, whatever is counted.
//
// A slot stores the whole key (its bytes, zero-padded, and its length), so
// a hit is never a different pre-token. Slots are read and written with
// atomic operations under a per-slot sequence lock: a writer claims the
// slot by setting its busy bit with a compare-and-swap (and skips the
// insert if another writer holds it), stores the key, then publishes a new
// version with the count; a reader accepts a slot only if its meta word
// was not busy and did not change while the key was read. A new pre-token
// takes an empty slot of its set, or else replaces one chosen by its hash
// and the set's versions (see put); a key found past the first way of its
// set now and then trades places with the key there (see promote), so
// that in a full table the keys in use are found at the first compare.
type pieceCache struct {
	tables [len(cacheGeometry)]cacheTable
}

// cacheGeometry lists the tables: the longest key in bytes (8 per key
// word), slots per set and log2 of the number of sets.
var cacheGeometry = [...]tableGeometry{
	// 4 slots of 16 bytes a set: 1 MiB. With 8,192 sets, a MiB of Go
	// source (about 9,700 distinct pieces of up to 8 bytes) had five or
	// more in about 0.7 % of the sets, and one of each such set missed on
	// every count: 16,384 sets counted it 2-5 % faster (BenchmarkCorpus).
	{8, 4, 14},
	{24, 4, 12},  // 4 slots of 32 bytes a set: 512 KiB
	{56, 2, 12},  // 2 slots of 64 bytes a set: 512 KiB
	{120, 2, 10}, // 2 slots of 128 bytes a set: 256 KiB
}

type tableGeometry struct{ maxLen, ways, setBits int }

const (
	cacheKeyMax = 120 // longest cached pre-token, in bytes
	cacheBytes  = (1024 + 512 + 512 + 256) << 10

	cacheBusy = 1 << 16
	hashMul3  = 0x165667B19E3779F9
)

// cacheTable holds sets of ways slots of stride words. A slot is a meta
// word, count | len<<8 | busy<<16 | version<<17 (len 0: empty), and
// stride-1 key words.
type cacheTable struct {
	ways, stride int
	shift        uint // 64 - log2(sets)
	slots        []atomic.Uint64
}

// newPieceCache returns an empty cache with the given tables.
func newPieceCache(geometry [len(cacheGeometry)]tableGeometry) *pieceCache {
	c := new(pieceCache)
	for n, g := range geometry {
		stride := 1 + g.maxLen/8
		c.tables[n] = cacheTable{
			ways: g.ways, stride: stride, shift: uint(64 - g.setBits),
			slots: make([]atomic.Uint64, g.ways*stride<<g.setBits),
		}
	}
	return c
}

// set returns the slots of the set of a key with hash h.
func (t *cacheTable) set(h uint64) []atomic.Uint64 {
	n := t.ways * t.stride
	return t.slots[int(h>>t.shift)*n:][:n]
}

// keyBytes returns len(buf) bytes from s[i:], or near the end of s a copy
// of s[i:j] in buf (the bytes past j are masked off by the callers).
func keyBytes(s string, i, j int, buf []byte) []byte {
	if len(s)-i >= len(buf) {
		return unsafe.Slice(unsafe.StringData(s[i:]), len(buf))
	}
	copy(buf, s[i:j])
	return buf
}

// keyWord returns word n of a key of length l in b, its bytes past l zeroed
// (a shift by 64 is 0).
func keyWord(b []byte, n, l int) uint64 {
	return binary.LittleEndian.Uint64(b[8*n:]) & (^uint64(0) >> (64 - 8*min(max(l-8*n, 0), 8)))
}

// hash1 is the hash of a key of one word w, of length l, in table 0.
func hash1(l int, w uint64) uint64 { return mix(uint64(l)*hashMul2, w) * hashMul3 }

func mix(h, w uint64) uint64 {
	h = (h ^ w) * hashMul1
	return h ^ h>>29
}

// match reports whether slot sl holds the key of length l whose words are
// given by word, and its count.
func match(sl []atomic.Uint64, l uint64, word func(int) uint64) (int, bool) {
	m := sl[0].Load()
	if m&(cacheBusy|0xff00) != l<<8 {
		return 0, false
	}
	for n := 1; n < len(sl); n++ {
		if sl[n].Load() != word(n-1) {
			return 0, false
		}
	}
	if sl[0].Load() != m {
		return 0, false
	}
	return int(m & 0xff), true
}

// put stores count n for the key of length l and hash h, unless another
// writer holds the slot it would take: an empty way of its set, or else
// the way that the hash and the versions of the set's slots pick. Each
// store moves a version on, so a key that finds its set full again takes
// another way than last time: with the hash alone, two keys of a set that
// it sends to the same way would evict each other every time while keys
// never counted again held the other ways (a table that is full, as one
// soon is in a service, would then behave as if it had one way a set).
// TestCacheMakesRoomInFullSets.
func (t *cacheTable) put(h, l uint64, word func(int) uint64, n int) {
	set := t.set(h)
	way, turn := -1, h>>(t.shift-2)
	for w := range t.ways {
		m := set[w*t.stride].Load()
		if m&0xff00 == 0 {
			way = w
			break
		}
		turn += m >> 17
	}
	if way < 0 {
		way = int(turn) & (t.ways - 1)
	}
	sl := set[way*t.stride:][:t.stride]
	m := sl[0].Load()
	if m&cacheBusy != 0 || !sl[0].CompareAndSwap(m, m|cacheBusy) {
		return
	}
	for i := 1; i < len(sl); i++ {
		sl[i].Store(word(i - 1))
	}
	sl[0].Store((m>>17+1)<<17 | l<<8 | uint64(n))
}

// promoteAt promotes the key found at word a of set, one hit in 16 picked
// by the key's offset in its text (at). It is not inlined, so that the
// lookups' path to a key in way 0 stays as short as without it.
//
//go:noinline
func promoteAt(set []atomic.Uint64, a, stride, at int) {
	if uint64(at)*0x9E3779B97F4A7C15>>60 == 0 {
		promote(set, a, stride)
	}
}

// promote swaps the slot at word a of set (a way past 0) with way 0, so
// that a key in use is found at the first compare: in a full table keys
// land in any way, and a lookup that goes past way 0 costs a
// mispredicted branch or more. Both slots are claimed as put claims one,
// and published with new versions, so a reader never takes a key of one
// slot with the count of the other; when another writer holds either, the
// swap is skipped.
func promote(set []atomic.Uint64, a, stride int) {
	x, y := set[:stride], set[a:a+stride]
	mx := x[0].Load()
	if mx&cacheBusy != 0 || !x[0].CompareAndSwap(mx, mx|cacheBusy) {
		return
	}
	my := y[0].Load()
	if my&cacheBusy != 0 || !y[0].CompareAndSwap(my, my|cacheBusy) {
		x[0].Store((mx>>17+1)<<17 | mx&0xffff)
		return
	}
	for k := 1; k < stride; k++ {
		kx, ky := x[k].Load(), y[k].Load()
		x[k].Store(ky)
		y[k].Store(kx)
	}
	y[0].Store((my>>17+1)<<17 | mx&0xffff)
	x[0].Store((mx>>17+1)<<17 | my&0xffff)
}

// countCached returns the count of the pre-token s[i:j] of 2 to cacheKeyMax
// bytes, from the cache or computed and cached.
func (e *Encoding) countCached(s string, i, j int, scp **scratch) int {
	l := j - i
	switch {
	case l <= 8:
		return e.countCached1(s, i, j)
	case l <= 24:
		return e.countCached3(s, i, j)
	case l <= 56:
		return e.countCachedN(&e.cache.tables[2], s, i, j, scp)
	}
	return e.countCachedN(&e.cache.tables[3], s, i, j, scp)
}

// countCached1 is countCached for keys of one word.
func (e *Encoding) countCached1(s string, i, j int) int {
	l := j - i
	var w uint64
	if len(s)-i >= 8 {
		w = binary.LittleEndian.Uint64(unsafe.Slice(unsafe.StringData(s[i:]), 8))
	} else {
		var buf [8]byte
		copy(buf[:], s[i:j])
		w = binary.LittleEndian.Uint64(buf[:])
	}
	w &= ^uint64(0) >> ((64 - 8*uint(l)) & 63) // l is 2 to 8
	h := hash1(l, w)
	t := &e.cache.tables[0]
	set := t.set(h)
	for way := 0; way+2 <= len(set); way += 2 {
		m := set[way].Load()
		if m&(cacheBusy|0xff00) == uint64(l)<<8 && set[way+1].Load() == w && set[way].Load() == m {
			if way > 0 {
				promoteAt(set, way, 2, i)
			}
			return int(m & 0xff)
		}
	}
	n := e.countPiece(s[i:j], nil)
	t.put(h, uint64(l), func(int) uint64 { return w }, n)
	return n
}

// countCached3 is countCached for keys of three words.
func (e *Encoding) countCached3(s string, i, j int) int {
	l := j - i
	var buf [24]byte
	b := keyBytes(s, i, j, buf[:])
	w0, w1, w2 := keyWord(b, 0, l), keyWord(b, 1, l), keyWord(b, 2, l)
	h := mix(mix(mix(uint64(l)*hashMul2, w0), w1), w2) * hashMul3
	t := &e.cache.tables[1]
	set := t.set(h)
	for way := 0; way+4 <= len(set); way += 4 {
		m := set[way].Load()
		if m&(cacheBusy|0xff00) == uint64(l)<<8 && set[way+1].Load() == w0 &&
			set[way+2].Load() == w1 && set[way+3].Load() == w2 && set[way].Load() == m {
			if way > 0 {
				promoteAt(set, way, 4, i)
			}
			return int(m & 0xff)
		}
	}
	n := e.countPiece(s[i:j], nil)
	t.put(h, uint64(l), func(k int) uint64 { return [3]uint64{w0, w1, w2}[k] }, n)
	return n
}

// countCachedN is countCached for the tables of longer keys.
func (e *Encoding) countCachedN(t *cacheTable, s string, i, j int, scp **scratch) int {
	l := j - i
	words := t.stride - 1
	var buf [cacheKeyMax]byte
	b := keyBytes(s, i, j, buf[:8*words])
	h := uint64(l) * hashMul2
	for n := range words {
		h = mix(h, keyWord(b, n, l))
	}
	h *= hashMul3
	word := func(n int) uint64 { return keyWord(b, n, l) }
	set := t.set(h)
	for way := range t.ways {
		if n, ok := match(set[way*t.stride:][:t.stride], uint64(l), word); ok {
			return n
		}
	}
	if *scp == nil {
		*scp = e.pool.Get().(*scratch)
	}
	n := e.countPiece(s[i:j], *scp)
	t.put(h, uint64(l), word, n)
	return n
}

// reset empties the cache (for benchmarks of a cold cache); it is safe
// with concurrent use.
func (c *pieceCache) reset() {
	for n := range c.tables {
		t := &c.tables[n]
		for i := 0; i < len(t.slots); i += t.stride {
			m := t.slots[i].Load()
			if m&cacheBusy == 0 && t.slots[i].CompareAndSwap(m, m|cacheBusy) {
				t.slots[i].Store((m>>17 + 1) << 17)
			}
		}
	}
}
