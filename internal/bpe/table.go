package bpe

import (
	"math/bits"
	"unsafe"
)

// noRank marks "not a token".
const noRank = ^uint32(0)

// rankTable is an open-addressing (linear probing) hash table from token
// bytes to rank. Each slot is 16 bytes: the first up to 8 key bytes packed
// into a word (k) and metadata (m = rank | len<<32 | arenaOffset<<40). Keys of
// at most 8 bytes are compared without touching the arena, so a lookup of a
// short key costs one cache line.
type rankTable struct {
	slots  []slot
	shift  uint // 64 - log2(len(slots))
	mask   uint64
	arena  []byte // concatenated token bytes (for keys longer than 8 bytes)
	maxLen int
	// pairs holds the rank of every two-byte string (noRank if none),
	// indexed by first byte | second byte<<8: the first lookups of every
	// merge, from a table that stays in the CPU caches.
	pairs *[1 << 16]uint32
	// filter is a blocked Bloom filter of the tokens in 256 KiB, which stays
	// in the CPU caches: a token sets two bits of one word (filterMask).
	// Most non-ASCII strings looked up in a merge (of CJK text, say) are not
	// tokens, and the filter answers most of those without a random access
	// into the table (ASCII strings mostly are tokens: they skip it).
	filter *[1 << 15]uint64
}

// filterMask returns the filter word and bits of a key with hash h.
func filterMask(h uint64) (int, uint64) {
	return int(h & (1<<15 - 1)), 1<<(h>>15&63) | 1<<(h>>21&63)
}

// addFilter sets the filter bits of a key with hash h.
func (t *rankTable) addFilter(h uint64) {
	w, m := filterMask(h)
	t.filter[w] |= m
}

// pair returns the rank of the two-byte string ab, or noRank.
func (t *rankTable) pair(a, b byte) uint32 { return t.pairs[uint16(a)|uint16(b)<<8] }

type slot struct {
	k uint64
	m uint64
}

const (
	hashMul1 = 0x9E3779B97F4A7C15
	hashMul2 = 0xC2B2AE3D27D4EB4F
)

func load64(p unsafe.Pointer) uint64 { return *(*uint64)(p) }
func load32(p unsafe.Pointer) uint32 { return *(*uint32)(p) }

// packKey returns an injective (for a given length) packing of the first
// min(len,8) bytes of s. s must be non-empty.
func packKey(s string) uint64 {
	p := unsafe.Pointer(unsafe.StringData(s))
	l := len(s)
	switch {
	case l >= 8:
		return load64(p)
	case l >= 4:
		return uint64(load32(p)) | uint64(load32(unsafe.Add(p, l-4)))<<32
	default:
		return uint64(s[0]) | uint64(s[l>>1])<<8 | uint64(s[l-1])<<16
	}
}

// hashKey hashes s given its packed prefix k.
func hashKey(s string, k uint64) uint64 {
	l := len(s)
	h := (k ^ uint64(l)*hashMul2) * hashMul1
	if l > 8 {
		p := unsafe.Pointer(unsafe.StringData(s))
		i := 8
		for ; i+8 <= l; i += 8 {
			h = (h ^ h>>31 ^ load64(unsafe.Add(p, i))) * hashMul1
		}
		if i < l {
			h = (h ^ h>>31 ^ load64(unsafe.Add(p, l-8))) * hashMul1
		}
	}
	return h ^ h>>29
}

// rankTableSize returns the number of slots of the table of n tokens (a
// power of two, at most half full).
func rankTableSize(n int) int { return 1 << bits.Len(uint(n*2)) }

func newRankTable(n int) *rankTable {
	size := rankTableSize(n)
	t := &rankTable{
		shift: uint(64 - bits.TrailingZeros(uint(size))),
		mask:  uint64(size - 1),
	}
	t.slots = allocTable[slot](size)
	t.pairs = new([1 << 16]uint32)
	t.filter = new([1 << 15]uint64)
	for i := range t.pairs {
		t.pairs[i] = noRank
	}
	return t
}

// place stores s in the first free slot from its home position i (and, for
// a two-byte key, in pairs).
func (t *rankTable) place(s slot, i uint64) {
	if s.m>>32&0xff == 2 {
		t.pairs[uint16(s.k)] = uint32(s.m)
	}
	for t.slots[i].m != 0 {
		i = (i + 1) & t.mask
	}
	t.slots[i] = s
}

// get returns the rank of s or noRank. s must be non-empty.
func (t *rankTable) get(s string) uint32 {
	k := packKey(s)
	h := hashKey(s, k)
	if k&0x8080808080808080 != 0 { // non-ASCII: mostly not tokens
		if w, m := filterMask(h); t.filter[w]&m != m {
			return noRank
		}
	}
	i := h >> t.shift
	l := uint64(len(s))
	slots := t.slots
	for {
		sl := &slots[i&t.mask]
		m := sl.m
		if m == 0 {
			return noRank
		}
		if sl.k == k && (m>>32)&0xff == l {
			if l <= 8 {
				return uint32(m)
			}
			off := m >> 40
			if string(t.arena[off+8:off+l]) == s[8:] {
				return uint32(m)
			}
		}
		i++
	}
}
