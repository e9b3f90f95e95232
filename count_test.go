package relay

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay/internal/corpus"
	"github.com/tokenrelay/relay/internal/tokens"
)

func TestCountCookbookFormula(t *testing.T) {
	r := testRouter(t)
	for _, c := range []struct {
		model string
		want  int
	}{
		{"gpt-3.5-turbo-0613", 129},
		{"gpt-4-0613", 129},
		{"gpt-4o", 124},
		{"gpt-4o-mini", 124},
	} {
		t.Run(c.model, func(t *testing.T) {
			q := classifyBody(t, r, "/v1/chat/completions", `{"model":"`+c.model+`","messages":`+cookbookMessages+`}`)
			assert.Equal(t, c.want, q.PromptTokens)
			// Warm memo gives the same count.
			q = classifyBody(t, r, "/v1/chat/completions", `{"model":"`+c.model+`","messages":`+cookbookMessages+`}`)
			assert.Equal(t, c.want, q.PromptTokens)
		})
	}
}

func TestEncodingFor(t *testing.T) {
	for model, want := range map[string]tokens.Encoding{
		"gpt-4o": tokens.O200K, "gpt-4o-mini-2024-07-18": tokens.O200K, "gpt-4.1": tokens.O200K, "gpt-5": tokens.O200K, "gpt-5.5-codex": tokens.O200K,
		"o1": tokens.O200K, "o3-mini": tokens.O200K, "o4-mini": tokens.O200K,
		"gpt-4": tokens.CL100K, "gpt-4-turbo": tokens.CL100K, "gpt-3.5-turbo": tokens.CL100K, "text-embedding-3-small": tokens.CL100K,
		"openai/gpt-4": tokens.CL100K, "claude-sonnet-4.5": tokens.O200K, "gemini-2.5-flash": tokens.O200K, "deepseek-v3.2": tokens.O200K, "": tokens.O200K,
	} {
		assert.Equal(t, want, tokens.ForModel(model), model)
	}
}

func TestToolsCountedAndMemoized(t *testing.T) {
	r := testRouter(t)
	base := `{"model":"gpt-4o","messages":[{"role":"user","content":"What's the weather like in Boston today?"}]}`
	with := string(fixture(t, "chat_request_with_tools.json"))
	without := classifyBody(t, r, "/v1/chat/completions", base).PromptTokens
	withTools := classifyBody(t, r, "/v1/chat/completions", with).PromptTokens
	assert.Greater(t, withTools, without+20, "tool definitions count")
	assert.Equal(t, withTools, classifyBody(t, r, "/v1/chat/completions", with).PromptTokens)
}

func TestMemoBoundedAndResendPaysOnlyNew(t *testing.T) {
	m := newMemo(64)
	for i := range 10000 {
		m.put(tokens.O200K, kindText, fmt.Sprintf("message number %d", i), i)
	}
	assert.LessOrEqual(t, m.len(), 64+memoWays-1)
	assert.Greater(t, m.len(), 64/2, "a full memo uses most of its ways")

	// A conversation that resends its history counts only new messages.
	c := newCounter(1024, 85)
	calls := 0
	counted := func(s string) int {
		if _, ok := c.memo.get(tokens.O200K, kindText, s); !ok {
			calls++
		}
		return c.count(tokens.O200K, s)
	}
	history := []string{}
	for turn := range 5 {
		history = append(history, strings.Repeat(fmt.Sprintf("turn %d says something long enough to memoize. ", turn), 3))
		calls = 0
		for _, h := range history {
			counted(h)
		}
		assert.Equal(t, 1, calls, "turn %d", turn)
	}
}

// TestHeapBoundedOverDistinctPrompts sends 10,000 distinct 4 KB prompts
// through a router (every line of every message new, as in BenchmarkOverhead)
// and checks that what stays on the heap afterwards grows by less than
// 64 MB: the token memo, the key memo and the pooled scratch are bounded,
// whatever the traffic.
func TestHeapBoundedOverDistinctPrompts(t *testing.T) {
	answer := fixture(t, "chat_response_default.json")
	var reports atomic.Int64
	r := overheadRouter(t, corpus.MemBase(answer), &reports)
	ob := newOverheadBody(t)
	send := func(i int) {
		ob.renew(uint64(i))
		req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", bytes.NewReader(ob.b))
		resp, err := r.RoundTrip(req)
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	send(0) // load the encodings
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const n = 10_000
	for i := 1; i <= n; i++ {
		send(i)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	growth := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap after %d distinct prompts: %+.1f MB (%.1f MB in use)", n, float64(growth)/(1<<20), float64(after.HeapAlloc)/(1<<20))
	assert.Less(t, growth, int64(64<<20))
	assert.Equal(t, int64(n+1), reports.Load())
	assert.LessOrEqual(t, r.counter.memo.len(), 8192+memoWays-1, "the memo holds at most MemoEntries")
}

// TestMemoConcurrentNeverMisleads has goroutines store and look up keys
// that crowd a small memo's sets, each key's value a function of the key:
// a hit must always give that value (a set being rewritten is a miss, never
// another key's word), and entries stay within the bound. A key is looked
// up again right after it is stored, so that hits come however the
// goroutines are scheduled (200 keys cycling through 48 entries seldom hit
// on their own: 160 times in 160,000 once, in a loaded CI run).
func TestMemoConcurrentNeverMisleads(t *testing.T) {
	m := newMemo(48)
	val := func(k uint64) uint64 { return k*0x9E3779B97F4A7C15 ^ 0xABCD }
	var wg sync.WaitGroup
	var hits, wrong atomic.Int64
	look := func(k uint64) bool {
		v, ok := m.getKey(k)
		if ok {
			hits.Add(1)
			if v != val(live(k)) {
				wrong.Add(1)
			}
		}
		return ok
	}
	for g := range 8 {
		wg.Go(func() {
			for i := range 20000 {
				k := m.key(tokens.O200K, kindText, fmt.Sprint((i*7+g)%200))
				if !look(k) {
					m.putKey(k, val(live(k)))
					look(k) // a hit unless another goroutine took the way since
				}
			}
		})
	}
	wg.Wait()
	assert.Zero(t, wrong.Load(), "hits with another key's value")
	assert.Greater(t, hits.Load(), int64(20000), "the goroutines' own stores were seldom found")
	assert.LessOrEqual(t, m.len(), 48)
}

// TestMemoKeepsHotEntries: the memo replaces entries of a full set by the
// new key, not by recency, so a hot entry (a system prompt every request
// sends) is evicted now and then by the entries of new prompts. At the
// default size, with a new prompt's 22 entries a request (4 strings, 16
// shard ends, 2 keys), each of 8 hot entries looked up every request
// misses about once every 376 requests (and is counted again once); the
// test holds that to at most one miss per 250.
func TestMemoKeepsHotEntries(t *testing.T) {
	m := newMemo(8192)
	rng := rand.New(rand.NewPCG(1, 2))
	hot := make([]uint64, 8)
	for i := range hot {
		hot[i] = rng.Uint64()
		m.putKey(hot[i], 1)
	}
	misses, reqs := 0, 100_000
	for range reqs {
		for _, h := range hot {
			if v, ok := m.getKey(h); !ok {
				misses++
				m.putKey(h, 1)
			} else {
				require.Equal(t, uint64(1), v)
			}
		}
		for range 22 {
			m.putKey(rng.Uint64(), 2)
		}
	}
	perMiss := float64(reqs*len(hot)) / float64(max(misses, 1))
	t.Logf("a hot entry misses once every %.0f requests", perMiss)
	assert.Greater(t, perMiss, 250.0)
}
