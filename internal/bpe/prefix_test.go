package bpe

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// Prefixes gives, for every prefix of a piece, the count countPiece gives
// that prefix on its own: pieces of tokens, parts of tokens, random bytes,
// runs and random letters, at every offset (inside UTF-8 sequences too),
// asked for in increasing order and then out of order.
func TestPrefixesMatchCountPiece(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, e := range encodings() {
		e.Warm()
		toks := allTokens(e)
		sc := new(scratch)
		var p Prefixes
		for iter := range 1500 {
			var sb strings.Builder
			target := 1 + rng.IntN(80)
			if iter%25 == 0 {
				target = 200 + rng.IntN(1500)
			}
			letters := iter%3 == 0
			for sb.Len() < target {
				switch k := rng.IntN(6); {
				case letters:
					sb.WriteByte("abcdefghijklmnopqrstuvwxyz"[rng.IntN(26)])
				case k == 0:
					sb.WriteByte(byte(rng.IntN(256)))
				case k == 1:
					tk := toks[rng.IntN(len(toks))]
					sb.WriteString(tk[:1+rng.IntN(len(tk))])
				case k == 2:
					sb.WriteString(strings.Repeat(string(rune(" a\n😀"[rng.IntN(4)])), rng.IntN(20)))
				default:
					sb.WriteString(toks[rng.IntN(len(toks))])
				}
			}
			s := sb.String()
			if !e.Prefixes(&p, s, len(s)) {
				t.Fatalf("%s: Prefixes refused with the tables built", e.Name())
			}
			// Every prefix of a short piece; of a long one the first 200
			// and 60 more at random, asked for out of order.
			ms := make([]int, 0, 260)
			for m := 0; m <= min(len(s), 200); m++ {
				ms = append(ms, m)
			}
			for range 60 {
				if len(s) > 200 {
					ms = append(ms, 200+rng.IntN(len(s)-199))
				}
			}
			for _, m := range ms {
				want := 0
				if m > 0 {
					want = e.countPiece(s[:m], sc)
				}
				if got := p.Count(m); got != want {
					t.Fatalf("%s: piece %q: prefix of %d bytes counts %d, want %d", e.Name(), s, m, got, want)
				}
			}
		}
	}
}

// The walk is cut short by nothing but the trie: a run of one byte, whose
// tokens are long, counts as countPiece counts it at every length.
func TestPrefixesOfRuns(t *testing.T) {
	sc := new(scratch)
	for _, e := range encodings() {
		e.Warm()
		for _, r := range []string{"a", " ", "=", "\n", "0", "é"} {
			s := strings.Repeat(r, 600)
			var p Prefixes
			if !e.Prefixes(&p, s, len(s)) {
				t.Fatal("Prefixes refused")
			}
			for m := 1; m <= len(s); m++ {
				if got, want := p.Count(m), e.countPiece(s[:m], sc); got != want {
					t.Fatalf("%s: %d bytes of %q: %d, want %d", e.Name(), m, r, got, want)
				}
			}
		}
	}
}

// While the backtracker's tables are not built, Prefixes refuses and
// charges the bytes asked about to its budget, so that a caller that
// keeps asking builds them once the budget is spent, and not before; the
// budget for long pieces is not touched.
func TestPrefixesWaitForTheTables(t *testing.T) {
	e := mustLoad("cl100k_base", false)
	piece := strings.Repeat("xq", 100)
	const n = 64 << 10 // charged per refusal
	var p Prefixes
	refused := 0
	for !e.Prefixes(&p, piece, n) {
		if refused++; refused*n > prefixBudget {
			t.Fatalf("still refused after %d bytes (budget %d)", refused*n, prefixBudget)
		}
	}
	if (refused+1)*n <= prefixBudget || e.bt.Load() == nil {
		t.Fatalf("started after %d bytes refused (budget %d), tables built %v", refused*n, prefixBudget, e.bt.Load() != nil)
	}
	if e.heapLong.Load() != 0 {
		t.Fatalf("the long pieces' budget was charged %d", e.heapLong.Load())
	}
	if got, want := p.Count(len(piece)), e.countPiece(piece, new(scratch)); got != want {
		t.Fatalf("count %d, want %d", got, want)
	}
}

// OnePiece agrees with the pre-tokenizer count uses: a text is one piece
// exactly when AppendPieces gives one pre-token for it.
func TestOnePiece(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	const alphabet = "aZ 9'\n.é日😀"
	runes := []rune(alphabet)
	for _, e := range encodings() {
		for range 20000 {
			var sb strings.Builder
			for range 1 + rng.IntN(8) {
				sb.WriteRune(runes[rng.IntN(len(runes))])
			}
			s := sb.String()
			pieces := e.AppendPieces(make([]Piece, 0, 2), s, 0, 0)
			if want := len(pieces) == 1 && int(pieces[0].End) == len(s); e.OnePiece(s) != want {
				t.Fatalf("%s: OnePiece(%q) = %v, want %v", e.Name(), s, !want, want)
			}
		}
		if e.OnePiece("") {
			t.Fatalf("%s: the empty text is a piece", e.Name())
		}
	}
}
