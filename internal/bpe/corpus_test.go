package bpe

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/tokenrelay/relay/internal/corpus"
)

// TestWriteCorpora writes the benchmark corpora as <name>.txt into the
// directory named by BPE_CORPUS_DIR, with their counts in each encoding as
// <name>.<encoding>.count, to measure other tokenizers on the same texts
// (testdata/gpt-tokenizer.mjs). It is skipped when the variable is unset.
//
//	BPE_CORPUS_DIR=/tmp/corpora go test -run=TestWriteCorpora ./internal/bpe
//	cd internal/bpe/testdata && npm install --no-save gpt-tokenizer@4.0.0 && node gpt-tokenizer.mjs /tmp/corpora
func TestWriteCorpora(t *testing.T) {
	dir := os.Getenv("BPE_CORPUS_DIR")
	if dir == "" {
		t.Skip("BPE_CORPUS_DIR not set")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range corpus.Bench(t) {
		if err := os.WriteFile(filepath.Join(dir, c.Name+".txt"), []byte(c.Text), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, e := range []*Encoding{O200K(), CL100K()} {
			n := strconv.Itoa(e.Count(c.Text))
			if err := os.WriteFile(filepath.Join(dir, c.Name+"."+e.Name()+".count"), []byte(n), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}
