package relay

import (
	"hash/maphash"
	"sync"
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
	n := prompt.ToolsTokens(e.enc.Count, tools)
	e.c.memo.put(e.enc, kindTools, tools.Raw, n)
	return n
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
	kindBlock    uint8 = 0xB1 // a prefix shard's end, from a window that stops short of the text's end
	kindBlockEnd uint8 = 0xB2 // the same, from a window that reaches it
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
// a number. Each shard keeps two generations: when the current one is full
// it becomes the old one and the previous old one is dropped; a hit in the
// old generation moves the entry back. Entries are keyed by a 64-bit hash of
// the string, so the memo holds no reference to request bodies. A nil
// *memo remembers nothing.
type memo struct {
	seed   maphash.Seed
	per    int
	shards [memoShards]memoShard
}

const memoShards = 16

type memoShard struct {
	mu       sync.Mutex
	cur, old map[uint64]int32
	_        [40]byte // keep shards on separate cache lines
}

func newMemo(entries int) *memo {
	m := &memo{seed: maphash.MakeSeed(), per: max(1, entries/(2*memoShards))}
	for i := range m.shards {
		m.shards[i].cur = make(map[uint64]int32, m.per)
	}
	return m
}

func (m *memo) key(enc tokens.Encoding, kind uint8, s string) uint64 {
	return maphash.String(m.seed, s) ^ uint64(enc)<<56 ^ uint64(kind)<<48
}

func (m *memo) get(enc tokens.Encoding, kind uint8, s string) (int, bool) {
	if m == nil {
		return 0, false
	}
	k := m.key(enc, kind, s)
	sh := &m.shards[k%memoShards]
	sh.mu.Lock()
	v, ok := sh.cur[k]
	if !ok {
		if v, ok = sh.old[k]; ok {
			sh.insert(k, v, m.per)
		}
	}
	sh.mu.Unlock()
	return int(v), ok
}

func (m *memo) put(enc tokens.Encoding, kind uint8, s string, n int) {
	if m == nil {
		return
	}
	k := m.key(enc, kind, s)
	sh := &m.shards[k%memoShards]
	sh.mu.Lock()
	sh.insert(k, int32(min(n, 1<<31-1)), m.per)
	sh.mu.Unlock()
}

func (sh *memoShard) insert(k uint64, v int32, per int) {
	if len(sh.cur) >= per {
		sh.old, sh.cur = sh.cur, make(map[uint64]int32, per)
	}
	sh.cur[k] = v
}
