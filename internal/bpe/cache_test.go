package bpe

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay/internal/corpus"
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
	text := corpus.Prose(64 << 10)
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

// key1 returns the key word and hash of the piece p (2 to 8 bytes) in
// table 0, as countCached1 takes them.
func key1(p string) (w, h uint64) {
	var b [8]byte
	copy(b[:], p)
	w = binary.LittleEndian.Uint64(b[:])
	return w, hash1(len(p), w)
}

// wayOf returns the way of table 0 that holds the piece p (2 to 8 bytes),
// or -1, without counting or storing it.
func (c *pieceCache) wayOf(p string) int {
	w, h := key1(p)
	set := c.tables[0].set(h)
	for way := 0; way+2 <= len(set); way += 2 {
		if _, ok := match(set[way:way+2], uint64(len(p)), func(int) uint64 { return w }); ok {
			return way / 2
		}
	}
	return -1
}

// A full cache makes room for the pieces counted now: after a table is
// filled with pieces never counted again, a few hot pieces that fit in
// their sets all end up held, however their hashes fall. A new piece that
// finds its set full replaces a way picked by its hash and the versions of
// the set's slots; picked by the hash alone, two hot pieces of a set that
// pick the same way would evict each other on every pass while the stale
// pieces of the other ways stayed (the hot set below has such a pair).
func TestCacheMakesRoomInFullSets(t *testing.T) {
	e := mustLoad("o200k_base", true)
	small := cacheGeometry
	small[0].setBits = 2 // 4 sets of 4 ways
	e.cache = newPieceCache(small)
	tb := &e.cache.tables[0]
	where := func(p string) (set, way int) { // as the hash alone picks them
		_, h := key1(p)
		return int(h >> tb.shift), int(h>>(tb.shift-2)) & (tb.ways - 1)
	}
	// Three hot pieces a set, with two of one set on the same way.
	var hot []string
	perSet := map[int][]string{}
	pair := false
	for n := 0; len(hot) < 12; n++ {
		p := fmt.Sprintf("h%d", n)
		s, w := where(p)
		if len(perSet[s]) == 3 {
			continue
		}
		clash := false
		for _, q := range perSet[s] {
			if _, qw := where(q); qw == w {
				clash = true
			}
		}
		if clash && pair {
			continue // one clashing pair is enough
		}
		pair = pair || clash
		perSet[s] = append(perSet[s], p)
		hot = append(hot, p)
	}
	if !pair {
		t.Fatal("no two hot pieces of a set on the same way")
	}
	var sc *scratch
	for n := range 64 { // stale pieces fill every way
		p := fmt.Sprintf("s%02d", n)
		e.countCached(p, 0, len(p), &sc)
	}
	// The hot pieces, as a text counts them.
	var text strings.Builder
	for n := range 40 {
		text.WriteString(hot[n%len(hot)])
		text.WriteString(strings.Repeat(";", n%7+1))
	}
	s := text.String()
	for range 20 {
		for i := 0; i < len(s); {
			j := i + strings.IndexByte(s[i:], ';')
			e.countCached(s, i, j, &sc)
			i = j + strings.IndexFunc(s[j:], func(r rune) bool { return r != ';' })
			if i < j {
				break
			}
		}
	}
	for _, p := range hot {
		if e.cache.wayOf(p) < 0 {
			s, w := where(p)
			t.Errorf("hot piece %q (set %d, way %d) not held after 20 passes", p, s, w)
		}
	}
}

// A piece found past way 0 of its set, again and again, moves to way 0,
// where a lookup finds it at the first compare; the piece it displaces
// stays in the set, and every count stays exact.
func TestCachePromotesHitsToWayZero(t *testing.T) {
	e := mustLoad("o200k_base", true)
	one := cacheGeometry
	one[0].setBits = 0 // one set of 4 ways
	e.cache = newPieceCache(one)
	var sc *scratch
	pieces := []string{"ab", "cd", "ef", "gh"}
	for _, p := range pieces { // they take ways 0 to 3 in turn
		e.countCached(p, 0, len(p), &sc)
	}
	require.Equal(t, 3, e.cache.wayOf("gh"))
	want := e.countPiece("gh", nil)
	text := strings.Repeat("gh", 64)
	for i := 0; i < len(text); i += 2 { // found at 64 offsets
		require.Equal(t, want, e.countCached(text, i, i+2, &sc))
	}
	require.Equal(t, 0, e.cache.wayOf("gh"))
	for _, p := range pieces {
		require.GreaterOrEqual(t, e.cache.wayOf(p), 0, "%q left the set", p)
		require.Equal(t, e.countPiece(p, nil), e.countCached(p, 0, len(p), &sc))
	}
}
