package bpe

import (
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tokenrelay/relay/internal/corpus"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func encodings() []*Encoding { return []*Encoding{CL100K(), O200K()} }

func TestNames(t *testing.T) {
	first, second := CL100K(), CL100K()
	if first.Name() != "cl100k_base" || O200K().Name() != "o200k_base" || first != second {
		t.Fatal("bad names or encodings not cached")
	}
}

func TestLoadTime(t *testing.T) {
	for _, name := range []string{"cl100k_base", "o200k_base"} {
		start := time.Now()
		e := mustLoad(name, name == "o200k_base")
		t.Logf("%s: loaded %d byte arena in %v", name, len(e.ranks.arena), time.Since(start))
		// A fresh load is the same table as the cached encoding's.
		cached := CL100K()
		if name == "o200k_base" {
			cached = O200K()
		}
		if len(e.ranks.arena) != len(cached.ranks.arena) || e.Count(corpus.Mixed(4<<10)) != cached.Count(corpus.Mixed(4<<10)) {
			t.Fatalf("%s: a fresh load differs from the cached encoding", name)
		}
	}
}

// Published vectors (tiktoken's own test suite and README).
func TestKnownVectors(t *testing.T) {
	cl, o := CL100K(), O200K()
	// cl100k_base: "hello world" -> [15339, 1917]
	eq(t, 2, cl.Count("hello world"))
	eq(t, uint32(15339), cl.ranks.get("hello"))
	eq(t, uint32(1917), cl.ranks.get(" world"))
	// cl100k_base: "tiktoken is great!" -> [83, 1609, 5963, 374, 2294, 0]
	eq(t, 6, cl.Count("tiktoken is great!"))
	// "<|endoftext|>" as ordinary text: [27, 91, 8862, 728, 428, 91, 29]
	eq(t, 7, cl.Count("<|endoftext|>"))
	// o200k_base: "hello world" -> [24912, 2375]
	eq(t, 2, o.Count("hello world"))
	eq(t, uint32(24912), o.ranks.get("hello"))
	eq(t, uint32(2375), o.ranks.get(" world"))
	eq(t, 0, cl.Count(""))
	eq(t, 0, o.Count(""))
	// cl100k_base: "\n" -> [198], "  \n" -> [720]
	eq(t, 1, cl.Count("\n"))
	eq(t, uint32(198), cl.ranks.get("\n"))
}

func TestConcurrent(t *testing.T) {
	doc := corpus.Mixed(4 << 10)
	want := [2]int{CL100K().Count(doc), O200K().Count(doc)}
	done := make(chan bool)
	for g := range 4 {
		go func() {
			ok := true
			for range 20 {
				ok = ok && CL100K().Count(doc) == want[0] && O200K().Count(doc) == want[1]
				ok = ok && CL100K().Count(strings.Repeat("a", 100+g)) > 0
			}
			done <- ok
		}()
	}
	for range 4 {
		if !<-done {
			t.Error("concurrent count mismatch")
		}
	}
}

func eq[T comparable](t *testing.T, want, got T) {
	t.Helper()
	if want != got {
		t.Errorf("want %v, got %v", want, got)
	}
}

func TestBacktrackerBuildTime(t *testing.T) {
	for _, e := range encodings() {
		start := time.Now()
		bt := buildBacktracker(&e.ranks)
		t.Logf("%s: backtracker built in %v (%d trie nodes)", e.Name(), time.Since(start), len(bt.trie.nodeTok))
	}
}

// TestAppendPieces: at each pre-token end AppendPieces reports the count of
// the text up to it, the ends rise to the text's end, a batch stops when
// dst is full, and the next one continues from its last piece as one call
// with room for all would.
func TestAppendPieces(t *testing.T) {
	text := "Hello, world! It's 12345 tokens\n\n  東京の天気 😀👍🏽 don't /path ok"
	for _, e := range []*Encoding{O200K(), CL100K()} {
		all := e.AppendPieces(make([]Piece, 0, len(text)), text, 0, 0)
		prev := 0
		for _, pc := range all {
			if int(pc.End) <= prev {
				t.Fatalf("%s: end %d after %d", e.Name(), pc.End, prev)
			}
			if want := e.Count(text[:pc.End]); int(pc.Cum) != want {
				t.Fatalf("%s: cum %d at %d, Count gives %d", e.Name(), pc.Cum, pc.End, want)
			}
			prev = int(pc.End)
		}
		if prev != len(text) || len(all) < 10 {
			t.Fatalf("%s: last end %d of %d after %d pieces", e.Name(), prev, len(text), len(all))
		}
		var batched []Piece
		i, cum := 0, 0
		for {
			ps := e.AppendPieces(make([]Piece, 0, 3), text, i, cum)
			if len(ps) == 0 {
				break
			}
			if len(ps) < 3 && int(ps[len(ps)-1].End) != len(text) {
				t.Fatalf("%s: a batch of %d pieces before the text's end", e.Name(), len(ps))
			}
			batched = append(batched, ps...)
			i, cum = int(ps[len(ps)-1].End), int(ps[len(ps)-1].Cum)
		}
		if !slices.Equal(batched, all) {
			t.Fatalf("%s: batches of 3 give %v, one batch %v", e.Name(), batched, all)
		}
	}
}
