package tiktoken

import (
	"bytes"
	"encoding/base64"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/pkoukk/tiktoken-go-loader/assets"

	. "github.com/tokenrelay/relay/internal/bpe"
)

// The embedded vocabularies are what CompactRanks makes of the assets of
// tiktoken-go-loader. With BPE_UPDATE_RANKS=1 (go generate in internal/bpe,
// in a checkout of the repository), they are rewritten instead.
func TestRanksFiles(t *testing.T) {
	for _, f := range []struct{ name, embedded string }{{"cl100k_base", RanksFile("cl100k_base")}, {"o200k_base", RanksFile("o200k_base")}} {
		src, err := assets.Assets.ReadFile(f.name + ".tiktoken")
		if err != nil {
			t.Fatal(err)
		}
		want, err := CompactRanks(src)
		if err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
		if os.Getenv("BPE_UPDATE_RANKS") == "1" {
			if err := os.WriteFile(filepath.Join("..", "..", "internal", "bpe", f.name+".ranks"), want, 0o644); err != nil {
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
			if got, _ := e.Rank(string(tok)); got != uint32(rank) {
				t.Fatalf("%s: rank of %q = %d, want %d", e.Name(), tok, got, rank)
			}
			n++
		}
		if got := len(e.Tokens()); got != n {
			t.Fatalf("%s: %d tokens loaded, the tiktoken file has %d", e.Name(), got, n)
		}
	}
}
