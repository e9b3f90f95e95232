package bpe

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	_ "embed"
)

// The vocabularies, in a compact form generated from the .tiktoken files of
// github.com/pkoukk/tiktoken-go-loader (go generate; TestRanksFiles, in the
// module interop, checks that regenerating gives the same bytes): the magic "bpe2", the number of
// ranks and the number of tokens as little-endian uint32s, then for each
// token its length (a byte), its rank (three bytes, little-endian) and its
// bytes, in the order of their home slots in the rank table. Loading needs
// no decoding and no sorting: token bytes are used in place, and the table,
// far larger than the CPU caches, is filled in one nearly sequential pass.
//
//go:generate env BPE_UPDATE_RANKS=1 go test -run ^TestRanksFiles$ ../../interop/tiktoken
var (
	//go:embed cl100k_base.ranks
	cl100kRanks string
	//go:embed o200k_base.ranks
	o200kRanks string
)

const ranksMagic = "bpe2"

// loadRanks builds the rank table of a compact vocabulary file.
func loadRanks(name, data string) (*rankTable, error) {
	if len(data) < 12 || data[:4] != ranksMagic {
		return nil, fmt.Errorf("bpe: %s: not a vocabulary file", name)
	}
	n := int(binary.LittleEndian.Uint32([]byte(data[4:8])))
	tokens := int(binary.LittleEndian.Uint32([]byte(data[8:12])))
	if len(data) >= 1<<24 || n >= 1<<24 || tokens > n {
		return nil, fmt.Errorf("bpe: %s: bad vocabulary size", name)
	}
	t := newRankTable(n)
	t.arena = unsafe.Slice(unsafe.StringData(data), len(data))
	p := 12
	for range tokens {
		if p+4 > len(data) {
			return nil, fmt.Errorf("bpe: %s: truncated", name)
		}
		l := int(data[p])
		rank := uint64(data[p+1]) | uint64(data[p+2])<<8 | uint64(data[p+3])<<16
		p += 4
		if l == 0 || p+l > len(data) || int(rank) >= n {
			return nil, fmt.Errorf("bpe: %s: bad token at offset %d", name, p-4)
		}
		key := data[p : p+l]
		k := packKey(key)
		h := hashKey(key, k)
		t.addFilter(h)
		t.place(slot{k: k, m: rank | uint64(l)<<32 | uint64(p)<<40}, h>>t.shift)
		t.maxLen = max(t.maxLen, l)
		p += l
	}
	if p != len(data) {
		return nil, fmt.Errorf("bpe: %s: %d trailing bytes", name, len(data)-p)
	}
	return t, nil
}
