package bpe

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// allTokens returns every token of e.
func allTokens(e *Encoding) []string { return e.Tokens() }

// Every token is reachable: merging its bytes yields the token itself, with
// all three merge implementations.
func TestTokensReachable(t *testing.T) {
	for _, e := range encodings() {
		sc := new(scratch)
		bt := e.backtracker()
		for i, tok := range allTokens(e) {
			if len(tok) < 2 {
				continue
			}
			if n := bt.count(tok, sc); n != 1 {
				t.Fatalf("%s: backtrack(%q) = %d", e.Name(), tok, n)
			}
			if i%8 != 0 {
				continue // the quadratic-ish paths on a sample only
			}
			if len(tok) <= smallPiece {
				if n := e.mergeSmall(tok); n != 1 {
					t.Fatalf("%s: mergeSmall(%q) = %d", e.Name(), tok, n)
				}
			}
			if n := e.mergeHeap(tok, sc); n != 1 {
				t.Fatalf("%s: mergeHeap(%q) = %d", e.Name(), tok, n)
			}
		}
	}
}

// The three merge strategies agree on random pieces (including long ones,
// which the quadratic reference cannot handle quickly).
func TestMergeStrategiesAgree(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, e := range encodings() {
		toks := allTokens(e)
		sc := new(scratch)
		bt := e.backtracker()
		for iter := range 3000 {
			var sb strings.Builder
			target := 2 + rng.IntN(24)
			if iter%10 == 0 {
				target = 100 + rng.IntN(3000)
			}
			for sb.Len() < target {
				switch rng.IntN(5) {
				case 0:
					sb.WriteByte(byte(rng.IntN(256)))
				case 1:
					tk := toks[rng.IntN(len(toks))]
					sb.WriteString(tk[:1+rng.IntN(len(tk))])
				case 2:
					sb.WriteString(strings.Repeat(string(rune(" a\n😀"[rng.IntN(4)])), rng.IntN(20)))
				default:
					sb.WriteString(toks[rng.IntN(len(toks))])
				}
			}
			p := sb.String()
			h := e.mergeHeap(p, sc)
			if b := bt.count(p, sc); b != h {
				t.Fatalf("%s: piece %q: heap %d, backtrack %d", e.Name(), p, h, b)
			}
			if len(p) <= smallPiece {
				if s := e.mergeSmall(p); s != h {
					t.Fatalf("%s: piece %q: heap %d, small %d", e.Name(), p, h, s)
				}
			}
		}
	}
}

// Long pieces go through the heap while the backtracker is not built and
// the budget lasts, then through the backtracker, with the same counts.
func TestHeapBudget(t *testing.T) {
	e := mustLoad("cl100k_base", false)
	piece := strings.Repeat("ab", 12<<10) // 24 KiB
	want := e.mergeHeap(piece, new(scratch))
	for i := range 4 {
		if got := e.Count(piece); got != want {
			t.Fatalf("count %d: %d, want %d", i, got, want)
		}
		built := e.bt.Load() != nil
		if wantBuilt := (i+1)*len(piece) > heapBudget; built != wantBuilt {
			t.Fatalf("after %d pieces of %d bytes: backtracker built %v", i+1, len(piece), built)
		}
	}
	big := mustLoad("cl100k_base", false)
	if got := big.Count(strings.Repeat("ab", heapBudget)); got != e.Count(strings.Repeat("ab", heapBudget)) || big.bt.Load() == nil {
		t.Fatal("a piece over the budget is not counted by the backtracker")
	}
	warm := mustLoad("cl100k_base", false)
	warm.Warm()
	if warm.bt.Load() == nil || warm.Count(piece) != want {
		t.Fatal("Warm did not build the backtracker")
	}
}

// The two-byte table agrees with the rank table.
func TestPairTable(t *testing.T) {
	for _, e := range encodings() {
		for i := range 1 << 16 {
			a, b := byte(i), byte(i>>8)
			if got, want := e.ranks.pair(a, b), e.ranks.get(string([]byte{a, b})); got != want {
				t.Fatalf("%s: pair(%#x, %#x) = %d, rank %d", e.Name(), a, b, got, want)
			}
		}
	}
}
