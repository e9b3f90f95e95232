package bpe

import (
	"math/bits"
	"sync"
	"unsafe"
)

// backtracker holds the tables of the linear-time backtracking encoder (the
// algorithm of GitHub's "bpe" crate). It is only used for long pieces and is
// built lazily the first time one is seen.
//
// Token ids are ranks. The result equals tiktoken's merge order because the
// byte-pair encoding of a text is the unique token sequence in which every
// token is BPE-reachable and every adjacent pair is "valid" (BPE would not
// merge across their boundary); the encoder finds it by greedy longest-prefix
// matching with backtracking, visiting each text position a bounded number
// of times.
type backtracker struct {
	tokOff     []uint32    // rank -> arena offset
	tokLen     []uint8     // rank -> byte length (0: unused rank)
	nextPrefix []uint32    // rank -> longest token that is a proper prefix, or none
	split      [][2]uint32 // rank -> the pair BPE merges last to build it, or (rank, rank)
	pairs      pairTable   // (left, right) -> merged rank
	trie       trie
}

const none32 = ^uint32(0)

// trie over all tokens; edges in an open-addressing table keyed by
// node<<8|byte.
type trie struct {
	edges   []uint64 // (key+1)<<32 | child ; 0 = empty
	shift   uint
	mask    uint64
	nodeTok []uint32 // node -> rank of the token ending here, or none
	used    int
	// one and two are the nodes of the first two levels, by their bytes
	// (two[a|b<<8]: none when no token starts with a, b), so that a walk
	// from every offset (Prefixes) starts without a hash lookup.
	one [256]uint32
	two []uint32
}

// fillRoots fills one and two from the edges.
func (t *trie) fillRoots() {
	t.two = make([]uint32, 1<<16)
	for a := range 256 {
		n := t.child(0, byte(a))
		t.one[a] = n
		for b := range 256 {
			c := none32
			if n != none32 {
				c = t.child(n, byte(b))
			}
			t.two[a|b<<8] = c
		}
	}
}

func (t *trie) child(node uint32, b byte) uint32 {
	key := uint64(node)<<8 | uint64(b)
	want := key + 1
	i := (key * hashMul1) >> t.shift
	for {
		e := t.edges[i&t.mask]
		if e == 0 {
			return none32
		}
		if e>>32 == want {
			return uint32(e)
		}
		i++
	}
}

func (t *trie) resize(size int) {
	old := t.edges
	t.edges = make([]uint64, size)
	t.shift = uint(64 - bits.TrailingZeros(uint(size)))
	t.mask = uint64(size - 1)
	t.used = 0
	for _, e := range old {
		if e != 0 {
			k := e>>32 - 1
			t.insertEdge(uint32(k>>8), byte(k), uint32(e))
		}
	}
}

func (t *trie) insertEdge(node uint32, b byte, c uint32) {
	if (t.used+1)*2 > len(t.edges) {
		t.resize(2 * len(t.edges))
	}
	t.used++
	key := uint64(node)<<8 | uint64(b)
	i := (key * hashMul1) >> t.shift
	for t.edges[i&t.mask] != 0 {
		i++
	}
	t.edges[i&t.mask] = (key+1)<<32 | uint64(c)
}

type pairTable struct {
	keys  []uint64 // (left<<32 | right) + 1; 0 = empty
	vals  []uint32
	shift uint
	mask  uint64
}

func (p *pairTable) get(a, b uint32) uint32 {
	want := (uint64(a)<<32 | uint64(b)) + 1
	i := (want * hashMul1) >> p.shift
	for {
		k := p.keys[i&p.mask]
		if k == want {
			return p.vals[i&p.mask]
		}
		if k == 0 {
			return none32
		}
		i++
	}
}

func (p *pairTable) put(a, b, v uint32) {
	want := (uint64(a)<<32 | uint64(b)) + 1
	i := (want * hashMul1) >> p.shift
	for p.keys[i&p.mask] != 0 {
		i++
	}
	p.keys[i&p.mask] = want
	p.vals[i&p.mask] = v
}

func pow2Table(n int) (size int, shift uint) {
	size = 1 << bits.Len(uint(n*2))
	return size, uint(64 - bits.TrailingZeros(uint(size)))
}

func (e *Encoding) backtracker() *backtracker {
	if bt := e.bt.Load(); bt != nil {
		return bt
	}
	e.btOnce.Do(func() { e.bt.Store(buildBacktracker(&e.ranks)) })
	return e.bt.Load()
}

func buildBacktracker(rt *rankTable) *backtracker {
	nTok := 0
	maxRank := uint32(0)
	for _, s := range rt.slots {
		if s.m != 0 {
			nTok++
			maxRank = max(maxRank, uint32(s.m))
		}
	}
	V := int(maxRank) + 1
	bt := &backtracker{
		tokOff:     make([]uint32, V),
		tokLen:     make([]uint8, V),
		nextPrefix: make([]uint32, V),
		split:      make([][2]uint32, V),
	}
	for _, s := range rt.slots {
		if s.m != 0 {
			r := uint32(s.m)
			bt.tokOff[r] = uint32(s.m >> 40)
			bt.tokLen[r] = uint8(s.m >> 32)
		}
	}
	tok := func(r uint32) string {
		return unsafe.String(&rt.arena[bt.tokOff[r]], int(bt.tokLen[r]))
	}
	// Trie, built shortest tokens first so that every proper prefix token
	// is already present when a token is inserted (gives nextPrefix).
	byLen := make([][]uint32, 256)
	for r := range V {
		if l := bt.tokLen[r]; l > 0 {
			byLen[l] = append(byLen[l], uint32(r))
		}
	}
	tr := &bt.trie
	tr.resize(1 << 16)
	tr.nodeTok = make([]uint32, 1, nTok*2)
	tr.nodeTok[0] = none32
	for _, group := range byLen {
		for _, r := range group {
			bt.nextPrefix[r] = none32
			node := uint32(0)
			s := tok(r)
			for i := 0; i < len(s); i++ {
				if t := tr.nodeTok[node]; t != none32 && i > 0 {
					bt.nextPrefix[r] = t
				}
				c := tr.child(node, s[i])
				if c == none32 {
					c = uint32(len(tr.nodeTok))
					tr.nodeTok = append(tr.nodeTok, none32)
					tr.insertEdge(node, s[i], c)
				}
				node = c
			}
			tr.nodeTok[node] = r
		}
	}
	tr.fillRoots()
	// Split table and pair lookup, in rank order.
	psize, pshift := pow2Table(V)
	bt.pairs = pairTable{keys: make([]uint64, psize), vals: make([]uint32, psize), shift: pshift, mask: uint64(psize - 1)}
	for r := range V {
		id := uint32(r)
		bt.split[r] = [2]uint32{id, id}
		if bt.tokLen[r] == 0 {
			continue
		}
		s := tok(id)
		for t1 := bt.nextPrefix[r]; t1 != none32; t1 = bt.nextPrefix[t1] {
			t2 := rt.get(s[bt.tokLen[t1]:])
			if t2 != noRank && t1 < id && t2 < id && bt.validPair(t1, t2) {
				bt.pairs.put(t1, t2, id)
				bt.split[r] = [2]uint32{t1, t2}
				break
			}
		}
	}
	return bt
}

// validPair reports whether BPE would leave the boundary between adjacent
// tokens t1 and t2 unmerged.
func (bt *backtracker) validPair(t1, t2 uint32) bool {
	limit := none32
	for {
		if c := bt.pairs.get(t1, t2); c != none32 && c < limit {
			return false
		}
		if t1 > t2 {
			limit = t1
			t1 = bt.split[t1][1]
			if t1 == limit {
				limit = t2 + 1
				t2 = bt.split[t2][0]
				if t2+1 == limit {
					return true
				}
			}
		} else {
			limit = t2 + 1
			t2 = bt.split[t2][0]
			if t2+1 == limit {
				limit = t1
				t1 = bt.split[t1][1]
				if t1 == limit {
					return true
				}
			}
		}
	}
}

// longestMatch returns the longest token that is a prefix of s (non-empty).
func (bt *backtracker) longestMatch(s string) uint32 {
	best := none32
	node := uint32(0)
	tr := &bt.trie
	for i := 0; i < len(s); i++ {
		node = tr.child(node, s[i])
		if node == none32 {
			break
		}
		if t := tr.nodeTok[node]; t != none32 {
			best = t
		}
	}
	return best
}

// count returns the number of BPE tokens of p using sc's buffers.
func (bt *backtracker) count(p string, sc *scratch) int {
	n := len(p)
	words := n/64 + 1
	if cap(sc.bits) < words {
		sc.bits = make([]uint64, words, max(words, 2*cap(sc.bits)))
	}
	bitsf := sc.bits[:words]
	for i := range bitsf {
		bitsf[i] = ^uint64(0)
	}
	stack := sc.stack[:0]
	pos := 0
	next := bt.longestMatch(p)
	for next != none32 {
		token := next
		last := none32
		if len(stack) > 0 {
			last = stack[len(stack)-1]
		}
		for {
			end := pos + int(bt.tokLen[token])
			if bitsf[end>>6]&(1<<(end&63)) != 0 && (last == none32 || bt.validPair(last, token)) {
				stack = append(stack, token)
				pos = end
				if end < n {
					next = bt.longestMatch(p[end:])
				} else {
					next = none32
				}
				break
			}
			if np := bt.nextPrefix[token]; np != none32 {
				token = np
				continue
			}
			bitsf[pos>>6] &^= 1 << (pos & 63)
			stack = stack[:len(stack)-1]
			pos -= int(bt.tokLen[last])
			next = last
			break
		}
	}
	sc.stack = stack[:0]
	return len(stack)
}

var _ sync.Once
