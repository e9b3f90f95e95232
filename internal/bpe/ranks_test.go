package bpe

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math/bits"
	"os"
	"slices"
	"strconv"
	"testing"

	"github.com/pkoukk/tiktoken-go-loader/assets"
)

// compactRanks converts a .tiktoken file (lines of "base64 rank") to the
// compact vocabulary form that loadRanks reads.
func compactRanks(data []byte) ([]byte, error) {
	var toks [][]byte
	seen := map[string]bool{}
	for len(data) > 0 {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		if len(line) == 0 {
			continue
		}
		b64, r, ok := bytes.Cut(line, []byte{' '})
		rank, err := strconv.ParseUint(string(r), 10, 32)
		if !ok || err != nil || rank >= 1<<24 {
			return nil, fmt.Errorf("bad line %q", line)
		}
		tok, err := base64.StdEncoding.DecodeString(string(b64))
		if err != nil || len(tok) == 0 || len(tok) > 255 || seen[string(tok)] {
			return nil, fmt.Errorf("bad or duplicate token in %q", line)
		}
		seen[string(tok)] = true
		for uint64(len(toks)) <= rank {
			toks = append(toks, nil)
		}
		if toks[rank] != nil {
			return nil, fmt.Errorf("duplicate rank in %q", line)
		}
		toks[rank] = tok
	}
	// Order the tokens by home slot in the table loadRanks will make (then
	// by rank).
	shift := 64 - bits.TrailingZeros(uint(rankTableSize(len(toks))))
	type entry struct {
		home uint64
		rank int
	}
	var order []entry
	for rank, tok := range toks {
		if tok != nil {
			order = append(order, entry{hashKey(string(tok), packKey(string(tok))) >> shift, rank})
		}
	}
	slices.SortFunc(order, func(a, b entry) int {
		return cmp.Or(cmp.Compare(a.home, b.home), cmp.Compare(a.rank, b.rank))
	})
	out := binary.LittleEndian.AppendUint32([]byte(ranksMagic), uint32(len(toks)))
	out = binary.LittleEndian.AppendUint32(out, uint32(len(order)))
	for _, en := range order {
		tok := toks[en.rank]
		out = append(out, byte(len(tok)), byte(en.rank), byte(en.rank>>8), byte(en.rank>>16))
		out = append(out, tok...)
	}
	return out, nil
}

// The embedded vocabularies are what compactRanks makes of the assets of
// tiktoken-go-loader. With BPE_UPDATE_RANKS=1 (go generate), they are
// rewritten instead.
func TestRanksFiles(t *testing.T) {
	for _, f := range []struct{ name, embedded string }{{"cl100k_base", cl100kRanks}, {"o200k_base", o200kRanks}} {
		src, err := assets.Assets.ReadFile(f.name + ".tiktoken")
		if err != nil {
			t.Fatal(err)
		}
		want, err := compactRanks(src)
		if err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
		if os.Getenv("BPE_UPDATE_RANKS") == "1" {
			if err := os.WriteFile(f.name+".ranks", want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if f.embedded != string(want) {
			t.Errorf("%s.ranks differs from what the tiktoken file gives (%d bytes, want %d): run go generate", f.name, len(f.embedded), len(want))
		}
	}
}

// Every token of the .tiktoken files has its rank in the loaded encodings,
// and nothing else is a token.
func TestRanksLoaded(t *testing.T) {
	for _, e := range encodings() {
		src, err := assets.Assets.ReadFile(e.Name() + ".tiktoken")
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, line := range bytes.Split(bytes.TrimSpace(src), []byte{'\n'}) {
			b64, r, _ := bytes.Cut(line, []byte{' '})
			tok, _ := base64.StdEncoding.DecodeString(string(b64))
			rank, _ := strconv.ParseUint(string(r), 10, 32)
			if got := e.ranks.get(string(tok)); got != uint32(rank) {
				t.Fatalf("%s: rank of %q = %d, want %d", e.Name(), tok, got, rank)
			}
			n++
		}
		if got := len(allTokens(e)); got != n {
			t.Fatalf("%s: %d tokens loaded, the tiktoken file has %d", e.Name(), got, n)
		}
	}
}

func TestLoadRanksRejects(t *testing.T) {
	good := ranksMagic + "\x03\x00\x00\x00\x02\x00\x00\x00" + "\x01\x02\x00\x00a" + "\x02\x00\x00\x00bc"
	tb, err := loadRanks("x", good)
	if err != nil {
		t.Fatalf("good file: %v", err)
	}
	if tb.get("a") != 2 || tb.get("bc") != 0 || tb.get("b") != noRank {
		t.Fatal("good file: wrong ranks")
	}
	for _, bad := range []string{"", "bpe2", "bpe0" + good[4:], good[:len(good)-1], good + "z",
		good[:4] + "\x02" + good[5:], // rank 2 out of range
		good[:8] + "\x04" + good[9:], // more tokens than ranks
	} {
		if _, err := loadRanks("x", bad); err == nil {
			t.Errorf("loadRanks(%q) accepted", bad)
		}
	}
}
