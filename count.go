package relay

import (
	"cmp"
	"hash/maphash"
	"math/bits"
	"slices"
	"sync/atomic"
	"unsafe"

	"github.com/tidwall/gjson"

	"github.com/tokenrelay/relay/internal/jsonscan"
	"github.com/tokenrelay/relay/internal/prompt"
	"github.com/tokenrelay/relay/internal/tokens"
)

// counter counts the tokens of prompts and answers, memoizing the counts of
// long strings. It is safe for concurrent use.
type counter struct {
	memo        *memo // nil: no memo
	imageTokens int
	lastEnc     atomic.Uint32 // the encoding of the last request read (see knownMemo)
}

func newCounter(entries, imageTokens int) *counter {
	c := &counter{imageTokens: imageTokens}
	if entries > 0 {
		c.memo = newMemo(entries)
	}
	return c
}

// prompt counts a request's prompt as the API bills it (the formula is in
// internal/prompt).
func (c *counter) prompt(enc tokens.Encoding, endpoint string, f *prompt.Fields) int {
	return prompt.Tokens(encCounter{c, enc}, c.imageTokens, endpoint, f)
}

// encCounter counts in one encoding through the counter's memo.
type encCounter struct {
	c   *counter
	enc tokens.Encoding
}

func (e encCounter) Text(s string) int { return e.c.count(e.enc, s) }

// Tools counts a tools block, memoized per block.
func (e encCounter) Tools(tools gjson.Result) int {
	if !tools.IsArray() || len(tools.Raw) <= 2 {
		return 0
	}
	if n, ok := e.c.memo.get(e.enc, kindTools, tools.Raw); ok {
		return n
	}
	funcInit := prompt.FuncInitO200K
	if e.enc == tokens.CL100K {
		funcInit = prompt.FuncInitCL100K
	}
	n := prompt.ToolsTokensFor(e.enc.Count, tools, funcInit)
	e.c.memo.put(e.enc, kindTools, tools.Raw, n)
	return n
}

// countReader counts the strings a prompt.Reader read, through the memo,
// keyed by their text as written (kindRaw), so that a memo hit needs no
// decoding, and the hash the Reader's Known took is not taken again. A
// string the memo does not know is counted from the affinity key's work
// where that covers it (see reuse), else on its own.
type countReader struct {
	c   *counter
	enc tokens.Encoding
	sc  *scratch
}

func (e *countReader) Str(i int) int {
	rd := &e.sc.rd
	s := rd.Strs[i]
	raw := rd.Raw(s)
	m := e.c.memo
	if len(raw) < memoMin || m == nil {
		return e.reuse(i, e.text(i, s, raw))
	}
	if s.Seen && e.sc.known.enc == e.enc {
		return wordCount(s.W)
	}
	h := s.H
	if !s.Hashed {
		h = m.hash(raw)
	}
	k := memoKey(h, e.enc, kindRaw)
	if !s.Hashed || e.sc.known.enc != e.enc { // else Known has just looked for k
		if w, ok := m.getKey(k); ok {
			return wordCount(w)
		}
	}
	text := e.text(i, s, raw)
	n := e.reuse(i, text)
	m.putKey(k, rawWord(n, len(text)))
	return n
}

// text returns the decoded Strs[i], s, whose text as written is raw: the
// bytes the affinity key's canonical prompt decoded it into when all of it
// is there (a new prompt's first 2 KB, decoded once, not twice), else
// decoded here.
func (e *countReader) text(i int, s prompt.Str, raw string) string {
	if !s.Esc {
		return raw
	}
	if c := &e.sc.canon; i < len(c.End) && i < len(c.At) && c.End[i] >= 0 && c.At[i] >= 0 {
		b := c.Buf[c.At[i]:c.End[i]]
		return unsafe.String(unsafe.SliceData(b), len(b))
	}
	e.sc.dec = e.sc.rd.AppendStr(e.sc.dec[:0], s)
	return unsafe.String(unsafe.SliceData(e.sc.dec), len(e.sc.dec))
}

// knownMemo is the memo as the prompt.Known of one read: it knows the
// strings stored under kindRaw, which only strings of bodies found JSON
// are, in enc: the encoding of the last request, since a body's model may
// come after its messages (countReader looks again when it was not).
type knownMemo struct {
	m   *memo
	enc tokens.Encoding
}

func (k *knownMemo) Known(raw string) (h, w uint64, ok bool) {
	h = k.m.hash(raw)
	w, ok = k.m.getKey(memoKey(h, k.enc, kindRaw))
	return h, w, ok
}

// rawWord is a kindRaw entry: the string's count, and its decoded length.
func rawWord(n, decoded int) uint64 {
	return countWord(n) | uint64(uint32(min(decoded, 1<<32-1)))<<32
}

// countWord and wordCount write and read a count (or a shard end, -1 for
// none) in the low 32 bits of a memo word.
func countWord(n int) uint64 { return uint64(uint32(int32(min(n, 1<<31-1)))) }
func wordCount(w uint64) int { return int(int32(uint32(w))) }

// reuse counts text, the decoded Strs[i], with the counts the affinity key
// gathered where they cover it. The key's shards and the pieces counted to
// find them end at pre-token boundaries of the canonical prompt, where
// counts add up; the prompt holds text at canon.At[i], so a boundary inside
// text is one of text too, and
//
//	count(text) = count(head) + (cum(k2) - cum(k1)) + count(tail)
//
// with k1 and k2 the first and the last boundary inside text whose
// cumulative count is known, head the text before k1 and tail the text
// after k2. Only head and tail are counted.
func (e *countReader) reuse(i int, text string) int {
	sc := e.sc
	if i >= len(sc.canon.At) || sc.canon.At[i] < 0 || len(sc.shards) < 2 {
		return e.enc.Count(text)
	}
	at := int(sc.canon.At[i])
	end := at + len(text)
	k := sc.shards
	a, _ := slices.BinarySearchFunc(k, at, func(p known, at int) int { return cmp.Compare(p.pos, at) })
	b, found := slices.BinarySearchFunc(k, end, func(p known, at int) int { return cmp.Compare(p.pos, at) })
	if !found {
		b-- // the last at or before end
	}
	if a >= b {
		return e.enc.Count(text)
	}
	k1, k2 := k[a], k[b]
	return e.enc.Count(text[:k1.pos-at]) + k2.cum - k1.cum + e.enc.Count(text[k2.pos-at:])
}

func (e *countReader) Tools(raw string) int {
	return encCounter{e.c, e.enc}.Tools(gjson.Result{Type: gjson.JSON, Raw: raw})
}

// completion counts the answer text of a non-streaming response, when the
// upstream sent no usage: chat choices' content, tool-call names and
// arguments, completions' text, and the Responses API's output text.
func (c *counter) completion(enc tokens.Encoding, body []byte) int {
	s := unsafe.String(unsafe.SliceData(body), len(body))
	if !jsonscan.Valid(s) {
		return 0
	}
	root := gjson.Parse(s)
	n := 0
	root.Get("choices").ForEach(func(_, ch gjson.Result) bool {
		msg := ch.Get("message")
		n += enc.Count(msg.Get("content").Str)
		msg.Get("tool_calls").ForEach(func(_, call gjson.Result) bool {
			n += enc.Count(call.Get("function.name").Str) + enc.Count(call.Get("function.arguments").Str)
			return true
		})
		n += enc.Count(ch.Get("text").Str)
		return true
	})
	root.Get("output").ForEach(func(_, item gjson.Result) bool {
		item.Get("content").ForEach(func(_, part gjson.Result) bool {
			n += enc.Count(part.Get("text").Str)
			return true
		})
		n += enc.Count(item.Get("arguments").Str)
		return true
	})
	return n
}

// memoMin is the shortest string whose count is memoized: shorter ones cost
// less to count than to look up.
const memoMin = 64

// Memo kinds: what a memo entry counts.
const (
	kindText     uint8 = iota
	kindTools                 // a tools block
	kindRaw                   // a string of a body found JSON, keyed as written (see rawWord)
	kindBlock    uint8 = 0xB1 // a prefix shard's end, from a window that stops short of the text's end
	kindBlockEnd uint8 = 0xB2 // the same, from a window that reaches it
	kindKey      uint8 = 0xB3 // a prefix key, from the canonical prompt's first prefixFirst bytes
	kindRawKey   uint8 = 0xB4 // an affinity key, from the strings as written (see rawKey)
)

// count returns the tokens of s, from the memo when s is long enough.
func (c *counter) count(enc tokens.Encoding, s string) int {
	if len(s) < memoMin || c.memo == nil {
		return enc.Count(s)
	}
	if n, ok := c.memo.get(enc, kindText, s); ok {
		return n
	}
	n := enc.Count(s)
	c.memo.put(enc, kindText, s, n)
	return n
}

// memo is a bounded, concurrency-safe map from (encoding, kind, string) to
// a 64-bit word (a count, a shard end, an affinity key), keyed by a 64-bit
// hash of the string, so it holds no reference to request bodies. It is a
// table allocated once and never grown: sets of memoWays entries, each set
// one 64-byte cache line (a sequence word and memoWays key and value
// words), about entries/memoWays sets, so it holds at most entries+2
// entries, 64 bytes per memoWays of them (about 171 KB with the default
// 8192 entries), whatever the traffic. A new entry takes a free way of its
// set, or else replaces one chosen by its key.
//
// Reads and writes are lock-free. A writer claims the set by making its
// sequence odd with a compare-and-swap (and skips the store if another
// writer holds it: the memo may forget, never mislead), writes the way,
// then makes the sequence even again; a reader accepts a hit only if the
// sequence was even and did not change while it read. A nil *memo
// remembers nothing.
type memo struct {
	seed maphash.Seed
	sets []memoSet
}

const memoWays = 3

// memoSet is a cache line: seq (odd while a writer holds the set), then
// the ways' keys and values. A key of 0 is a free way.
type memoSet struct {
	seq  atomic.Uint64
	ways [memoWays]struct{ k, v atomic.Uint64 }
	_    [64 - 8 - memoWays*16]byte
}

func newMemo(entries int) *memo {
	return &memo{seed: maphash.MakeSeed(), sets: make([]memoSet, max(1, (entries+memoWays-1)/memoWays))}
}

// set returns the set of key k (a hash: its high bits pick the set).
func (m *memo) set(k uint64) *memoSet {
	i, _ := bits.Mul64(k, uint64(len(m.sets)))
	return &m.sets[i]
}

// live is k as stored: never 0, which marks a free way.
func live(k uint64) uint64 { return k | 1<<47 }

// len returns how many entries the memo holds (for tests).
func (m *memo) len() int {
	n := 0
	for i := range m.sets {
		for w := range m.sets[i].ways {
			if m.sets[i].ways[w].k.Load() != 0 {
				n++
			}
		}
	}
	return n
}

func (m *memo) key(enc tokens.Encoding, kind uint8, s string) uint64 {
	return memoKey(m.hash(s), enc, kind)
}

// hash is the part of a key that depends on the string: a string hashed
// once is looked up in any encoding and kind (memoKey).
func (m *memo) hash(s string) uint64 { return maphash.String(m.seed, s) }

func memoKey(h uint64, enc tokens.Encoding, kind uint8) uint64 {
	return h ^ uint64(enc)<<56 ^ uint64(kind)<<48
}

// get returns the count (or shard end) stored for s.
func (m *memo) get(enc tokens.Encoding, kind uint8, s string) (int, bool) {
	v, ok := m.getWord(enc, kind, s)
	return wordCount(v), ok
}

// put stores a count (or shard end) for s.
func (m *memo) put(enc tokens.Encoding, kind uint8, s string, n int) {
	m.putWord(enc, kind, s, countWord(n))
}

func (m *memo) getWord(enc tokens.Encoding, kind uint8, s string) (uint64, bool) {
	if m == nil {
		return 0, false
	}
	return m.getKey(m.key(enc, kind, s))
}

func (m *memo) getKey(k uint64) (uint64, bool) {
	k = live(k)
	st := m.set(k)
	seq := st.seq.Load()
	if seq&1 != 0 {
		return 0, false // a writer holds the set
	}
	for w := range st.ways {
		if st.ways[w].k.Load() == k {
			v := st.ways[w].v.Load()
			return v, st.seq.Load() == seq
		}
	}
	return 0, false
}

func (m *memo) putWord(enc tokens.Encoding, kind uint8, s string, v uint64) {
	if m == nil {
		return
	}
	m.putKey(m.key(enc, kind, s), v)
}

func (m *memo) putKey(k, v uint64) {
	k = live(k)
	st := m.set(k)
	seq := st.seq.Load()
	if seq&1 != 0 || !st.seq.CompareAndSwap(seq, seq+1) {
		return // another writer holds the set: skip, as a full cache would
	}
	way := int(k>>20) % memoWays
	for w := range st.ways {
		if kw := st.ways[w].k.Load(); kw == k || kw == 0 {
			way = w
			break
		}
	}
	st.ways[way].k.Store(k)
	st.ways[way].v.Store(v)
	st.seq.Store(seq + 2)
}
