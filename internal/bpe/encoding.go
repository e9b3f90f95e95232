package bpe

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"strconv"
	"sync"
	"unicode/utf8"
	"unsafe"

	"github.com/pkoukk/tiktoken-go-loader/assets"
)

// Encoding counts tokens of one tiktoken encoding. Safe for concurrent use.
type Encoding struct {
	name  string
	o200k bool
	ranks rankTable
	cls   classifier
	pool  sync.Pool // *scratch

	btOnce sync.Once
	bt     *backtracker

	cache *pieceCache
}

var (
	cl100k = sync.OnceValue(func() *Encoding { return mustLoad("cl100k_base", false) })
	o200k  = sync.OnceValue(func() *Encoding { return mustLoad("o200k_base", true) })
)

// CL100K returns the cl100k_base encoding, loaded lazily once from the
// assets embedded in github.com/pkoukk/tiktoken-go-loader.
func CL100K() *Encoding { return cl100k() }

// O200K returns the o200k_base encoding, loaded lazily once from the
// assets embedded in github.com/pkoukk/tiktoken-go-loader.
func O200K() *Encoding { return o200k() }

// Name returns the encoding name ("cl100k_base" or "o200k_base").
func (e *Encoding) Name() string { return e.name }

func mustLoad(name string, o200k bool) *Encoding {
	data, err := assets.Assets.ReadFile(name + ".tiktoken")
	if err != nil {
		panic(fmt.Sprintf("bpe: reading %s: %v", name, err))
	}
	e, err := parse(name, o200k, data)
	if err != nil {
		panic(err)
	}
	return e
}

// parse builds an Encoding from a .tiktoken file (lines of "base64 rank").
func parse(name string, o200k bool, data []byte) (*Encoding, error) {
	lines := bytes.Count(data, []byte{'\n'}) + 1
	e := &Encoding{name: name, o200k: o200k, cls: classifier{t: classTable()}, cache: newPieceCache(cacheGeometry)}
	e.pool.New = func() any { return new(scratch) }
	t := newRankTable(lines)
	arena := make([]byte, 0, len(data)*3/4)
	type entry struct {
		off, n int
		rank   uint32
	}
	entries := make([]entry, 0, lines)
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
		sp := bytes.IndexByte(line, ' ')
		if sp < 0 {
			return nil, fmt.Errorf("bpe: %s: malformed line %q", name, line)
		}
		rank, err := strconv.ParseUint(string(line[sp+1:]), 10, 32)
		if err != nil || rank >= 1<<31 {
			return nil, fmt.Errorf("bpe: %s: bad rank in %q", name, line)
		}
		off := len(arena)
		arena = arena[:off+base64.StdEncoding.DecodedLen(sp)]
		n, err := base64.StdEncoding.Decode(arena[off:], line[:sp])
		if err != nil || n == 0 || n > 255 {
			return nil, fmt.Errorf("bpe: %s: bad token in %q", name, line)
		}
		arena = arena[:off+n]
		entries = append(entries, entry{off, n, uint32(rank)})
	}
	if len(arena) >= 1<<24 {
		return nil, fmt.Errorf("bpe: %s: vocabulary too large", name)
	}
	t.arena = arena
	for _, en := range entries {
		key := unsafe.String(&arena[en.off], en.n)
		if t.get(key) != noRank {
			return nil, fmt.Errorf("bpe: %s: duplicate token %q", name, key)
		}
		t.insert(key, en.off, en.rank)
	}
	e.ranks = *t
	return e, nil
}

// scratch holds per-call buffers, recycled through Encoding.pool.
type scratch struct {
	next, prev []int32
	rank       []uint32
	heap       []uint64
	text       []byte
	bits       []uint64
	stack      []uint32
}

func (sc *scratch) grow(n int) {
	if cap(sc.next) < n+1 {
		c := max(n+1, 2*cap(sc.next))
		sc.next = make([]int32, c)
		sc.prev = make([]int32, c)
		sc.rank = make([]uint32, c)
		sc.heap = make([]uint64, 0, c)
	}
}

// Count returns the number of tokens tiktoken's EncodeOrdinary produces for
// text: special tokens are treated as plain text, and each byte of an
// invalid UTF-8 sequence counts as U+FFFD (as tiktoken-go does).
func (e *Encoding) Count(text string) int {
	if len(text) == 0 {
		return 0
	}
	var sc *scratch
	if !utf8.ValidString(text) {
		sc = e.pool.Get().(*scratch)
		sc.text = appendReplacingInvalid(sc.text[:0], text)
		text = unsafe.String(unsafe.SliceData(sc.text), len(sc.text))
	}
	n := e.count(text, &sc)
	if sc != nil {
		e.pool.Put(sc)
	}
	return n
}

// count counts valid UTF-8 text. *scp is fetched from the pool on demand.
func (e *Encoding) count(s string, scp **scratch) int {
	c := e.cls
	total := 0
	for i := 0; i < len(s); {
		var j int
		if e.o200k {
			j = c.nextO200K(s, i)
		} else {
			j = c.nextCL100K(s, i)
		}
		piece := s[i:j]
		switch {
		case len(piece) == 1:
			total++
		case len(piece) <= cacheKeyMax:
			total += e.countCached(s, i, j, scp)
		default:
			if len(piece) > smallPiece && *scp == nil {
				*scp = e.pool.Get().(*scratch)
			}
			total += e.countPiece(piece, *scp)
		}
		i = j
	}
	return total
}

// appendReplacingInvalid appends s to dst with every byte that is not part
// of a valid UTF-8 sequence replaced by U+FFFD, like Go's []rune(s).
func appendReplacingInvalid(dst []byte, s string) []byte {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			dst = append(dst, "\uFFFD"...)
		} else {
			dst = append(dst, s[i:i+n]...)
		}
		i += n
	}
	return dst
}
