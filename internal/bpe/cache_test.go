package bpe

import (
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
)

func TestCacheGeometry(t *testing.T) {
	size, prev := 0, 1
	for _, g := range cacheGeometry {
		if g.maxLen%8 != 0 || g.maxLen <= prev || g.ways&(g.ways-1) != 0 {
			t.Fatalf("bad table %+v", g)
		}
		size += g.ways * (1 + g.maxLen/8) * 8 << g.setBits
		prev = g.maxLen
	}
	if size != cacheBytes || prev != cacheKeyMax {
		t.Fatalf("tables hold %d bytes, keys up to %d; cacheBytes = %d, cacheKeyMax = %d", size, prev, cacheBytes, cacheKeyMax)
	}
	if cacheGeometry[0].maxLen != 8 || cacheGeometry[0].ways != 4 || cacheGeometry[1].maxLen != 24 || cacheGeometry[1].ways != 4 {
		t.Fatal("countCached1 and countCached3 expect tables of 8 and 24 bytes, 4 ways")
	}
}

// cachePieces returns random pre-token-like strings of every cached length,
// including ones that differ only in zero bytes or length.
func cachePieces(rng *rand.Rand, n int) []string {
	out := []string{"\x00\x00", "\x00\x00\x00", "a\x00", "\x00a", strings.Repeat("\x00", 9), strings.Repeat("\x00", 25)}
	for range n {
		l := 2 + rng.IntN(cacheKeyMax-1)
		if rng.IntN(2) == 0 {
			l = 2 + rng.IntN(10)
		}
		b := make([]byte, l)
		for i := range b {
			b[i] = " aeEt\x00\xe6\x97\xa5"[rng.IntN(9)]
		}
		out = append(out, string(b))
	}
	return out
}

// countCached agrees with countPiece on misses and hits, for pieces in the
// middle and at the very end of a text.
func TestCacheExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	pieces := cachePieces(rng, 3000)
	for _, e := range encodings() {
		sc := new(scratch)
		for round := range 2 {
			for _, p := range pieces {
				want := e.countPiece(p, sc)
				for _, text := range []string{p, p + strings.Repeat("x", cacheKeyMax)} {
					if got := e.countCached(text, 0, len(p), &sc); got != want {
						t.Fatalf("%s round %d: countCached(%q) = %d, countPiece %d", e.Name(), round, p, got, want)
					}
				}
			}
		}
	}
}

// Many goroutines count pieces that collide in a cache of one set per
// table: every count stays exact (run with -race to check the protocol).
func TestCacheConcurrent(t *testing.T) {
	e := mustLoad("o200k_base", true)
	tiny := cacheGeometry
	for n := range tiny {
		tiny[n].setBits = 0
	}
	e.cache = newPieceCache(tiny)
	pieces := cachePieces(rand.New(rand.NewPCG(15, 16)), 200)
	want := make([]int, len(pieces))
	for n, p := range pieces {
		want[n] = e.countPiece(p, new(scratch))
	}
	var wg sync.WaitGroup
	errs := make(chan string, 4)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(17, uint64(g)))
			var sc *scratch
			for range 20000 {
				n := rng.IntN(len(pieces))
				if got := e.countCached(pieces[n], 0, len(pieces[n]), &sc); got != want[n] {
					errs <- pieces[n]
					return
				}
				if rng.IntN(5000) == 0 {
					e.cache.reset()
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for p := range errs {
		t.Errorf("wrong count for %q", p)
	}
}

// After reset, the cache answers nothing until it is filled again.
func TestCacheReset(t *testing.T) {
	e := mustLoad("cl100k_base", false)
	text := proseCorpus(t, 64<<10)
	want := e.Count(text)
	e.cache.reset()
	for n := range e.cache.tables {
		tb := &e.cache.tables[n]
		for i := 0; i < len(tb.slots); i += tb.stride {
			if m := tb.slots[i].Load(); m&0xffff != 0 {
				t.Fatalf("table %d slot %d not empty after reset: %#x", n, i/tb.stride, m)
			}
		}
	}
	if got := e.Count(text); got != want {
		t.Fatalf("after reset: %d, before %d", got, want)
	}
}
