package bpe

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math/bits"
	"slices"
	"strconv"
	"unsafe"
)

// What the tests and benchmarks that compare the counter with tiktoken-go
// and github.com/tiktoken-go/tokenizer use (the module
// github.com/tokenrelay/relay/interop, which requires those libraries so
// that this module does not).

// Load returns a new encoding of the vocabulary name ("cl100k_base" or
// "o200k_base"), with a piece cache of its own: unlike CL100K and O200K,
// it shares nothing with other callers.
func Load(name string) *Encoding { return mustLoad(name, name == "o200k_base") }

// RanksFile returns the compact vocabulary the encoding name embeds.
func RanksFile(name string) string {
	if name == "o200k_base" {
		return o200kRanks
	}
	return cl100kRanks
}

// Rank returns the rank of the token tok, and whether tok is a token.
func (e *Encoding) Rank(tok string) (uint32, bool) {
	r := e.ranks.get(tok)
	return r, r != noRank
}

// Tokens returns every token of e, in no particular order.
func (e *Encoding) Tokens() []string {
	var out []string
	for _, s := range e.ranks.slots {
		if s.m != 0 {
			out = append(out, unsafe.String(&e.ranks.arena[s.m>>40], int(s.m>>32&0xff)))
		}
	}
	return out
}

// CountHeap counts the single pre-token p with the O(n log n) heap merge,
// whatever its length.
func (e *Encoding) CountHeap(p string) int { return e.mergeHeap(p, new(scratch)) }

// ResetCache empties e's piece cache, so that the next count meets every
// pre-token for the first time.
func (e *Encoding) ResetCache() { e.cache.reset() }

// RuneClass returns the character class bits the split patterns give r.
func RuneClass(r rune) uint8 {
	if r < tableLimit {
		return classTable()[r]
	}
	return slowClass(r)
}

// CompactRanks converts a .tiktoken file (lines of "base64 rank") to the
// compact vocabulary form that the encodings embed (see ranks.go).
func CompactRanks(data []byte) ([]byte, error) {
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
