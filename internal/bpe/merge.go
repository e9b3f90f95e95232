package bpe

// smallPiece is the piece length up to which the simple quadratic merge
// (tiktoken's own algorithm, on stack arrays) is used; it is bounded, so the
// overall cost stays linear in the piece length.
const smallPiece = 32

// countPiece returns the number of tokens the byte-pair merge of piece
// produces. It never allocates for pieces up to smallPiece bytes; longer
// pieces use the scratch buffers of sc.
func (e *Encoding) countPiece(piece string, sc *scratch) int {
	if len(piece) == 1 {
		return 1
	}
	if len(piece) <= e.ranks.maxLen && e.ranks.get(piece) != noRank {
		return 1
	}
	if len(piece) <= smallPiece {
		return e.mergeSmall(piece)
	}
	if len(piece) < backtrackPiece || e.heapWhileUnbuilt(len(piece)) {
		return e.mergeHeap(piece, sc)
	}
	return e.backtracker().count(piece, sc)
}

// backtrackPiece is the piece length from which the linear backtracking
// encoder is used instead of the heap merge.
const backtrackPiece = 1024

// heapBudget is how many bytes of long pieces an encoding merges with the
// heap before it builds the backtracker's tables (which takes longer than
// the heap needs for this many bytes of the worst kind, a run of one
// letter, about 10 ms): texts with few long pieces never pay for the
// tables, and the heap's O(n log n) is spent on a bounded number of bytes.
const heapBudget = 64 << 10

// heapWhileUnbuilt reports whether a long piece of n bytes is to be merged
// with the heap because the backtracker is not built and the budget allows
// it (the piece's bytes are then charged to it).
func (e *Encoding) heapWhileUnbuilt(n int) bool {
	if e.bt.Load() != nil || n > heapBudget || e.heapLong.Load() > heapBudget {
		return false
	}
	return e.heapLong.Add(int64(n)) <= heapBudget
}

// mergeSmall is tiktoken's bytePairMerge on fixed-size arrays.
func (e *Encoding) mergeSmall(p string) int {
	var start [smallPiece + 1]uint8
	var rank [smallPiece]uint32
	t := &e.ranks
	parts := len(p)
	for i := 0; i <= parts; i++ {
		start[i] = uint8(i)
	}
	for i := 0; i+1 < parts; i++ {
		rank[i] = t.pair(p[i], p[i+1])
	}
	rank[parts-1] = noRank
	for parts > 1 {
		minR, mi := noRank, -1
		for i := 0; i < parts-1; i++ {
			if rank[i] < minR {
				minR, mi = rank[i], i
			}
		}
		if mi < 0 {
			break
		}
		// Merge parts mi and mi+1: drop boundary mi+1.
		copy(start[mi+1:parts], start[mi+2:parts+1])
		copy(rank[mi+1:parts-1], rank[mi+2:parts])
		parts--
		if mi+1 < parts {
			rank[mi] = e.pairRank(p, int(start[mi]), int(start[mi+2]))
		} else {
			rank[mi] = noRank
		}
		if mi > 0 {
			rank[mi-1] = e.pairRank(p, int(start[mi-1]), int(start[mi+1]))
		}
	}
	return parts
}

func (e *Encoding) pairRank(p string, i, j int) uint32 {
	if j-i > e.ranks.maxLen {
		return noRank
	}
	return e.ranks.get(p[i:j])
}

// mergeHeap performs the same merge in O(n log n): a doubly linked list of
// parts plus a binary min-heap of (rank, position) candidates with lazy
// invalidation. Ties on rank are resolved leftmost first, as in tiktoken.
func (e *Encoding) mergeHeap(p string, sc *scratch) int {
	n := len(p)
	sc.grow(n)
	next, prev, rank := sc.next[:n+1], sc.prev[:n+1], sc.rank[:n+1]
	h := sc.heap[:0]
	for i := 0; i < n; i++ {
		next[i] = int32(i + 1)
		prev[i] = int32(i - 1)
		r := noRank
		if i+1 < n {
			r = e.ranks.pair(p[i], p[i+1])
			if r != noRank {
				h = append(h, uint64(r)<<32|uint64(i))
			}
		}
		rank[i] = r
	}
	heapInit(h)
	count := n
	for len(h) > 0 {
		top := h[0]
		last := len(h) - 1
		h[0] = h[last]
		h = h[:last]
		if last > 0 {
			siftDown(h, 0)
		}
		r, i := uint32(top>>32), int32(uint32(top))
		if rank[i] != r {
			continue // stale
		}
		j := next[i]
		k := next[j]
		rank[j] = noRank
		next[i] = k
		if int(k) < n {
			prev[k] = i
			nr := e.pairRank(p, int(i), int(next[k]))
			rank[i] = nr
			if nr != noRank {
				h = heapPush(h, uint64(nr)<<32|uint64(i))
			}
		} else {
			rank[i] = noRank
		}
		if i > 0 {
			q := prev[i]
			nr := e.pairRank(p, int(q), int(k))
			rank[q] = nr
			if nr != noRank {
				h = heapPush(h, uint64(nr)<<32|uint64(q))
			}
		}
		count--
	}
	sc.heap = h[:0]
	return count
}

func heapInit(h []uint64) {
	for i := len(h)/2 - 1; i >= 0; i-- {
		siftDown(h, i)
	}
}

func siftDown(h []uint64, i int) {
	n := len(h)
	x := h[i]
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		if c+1 < n && h[c+1] < h[c] {
			c++
		}
		if h[c] >= x {
			break
		}
		h[i] = h[c]
		i = c
	}
	h[i] = x
}

func heapPush(h []uint64, x uint64) []uint64 {
	h = append(h, x)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if h[p] <= x {
			break
		}
		h[i] = h[p]
		i = p
	}
	h[i] = x
	return h
}

// Warm builds the tables of the linear-time encoder for long pre-tokens
// now, instead of when the encoding first counts pre-tokens of 1 KiB or
// more adding up to over 64 KiB (or one longer than that). It takes about
// 50 ms for cl100k_base and 100 to 200 ms for o200k_base on a 2-core
// server, and 10 to 20 MB of memory; loading the encoding itself (CL100K,
// O200K) takes under 10 ms. Counts are the same with or without it: call it
// where a pause is harmless (a constructor) if long runs are expected.
func (e *Encoding) Warm() { e.backtracker() }
