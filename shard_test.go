package relay

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func ExampleShard() {
	text := "Relay routes each request. It counts tokens first! Then it picks an upstream? " +
		"Yes.\nShort lines end segments too.\n東京は晴れです。大阪は雨です。"
	for _, seg := range Shard(text, 8, "gpt-4o") {
		fmt.Printf("%q\n", seg)
	}
	// Output:
	// "Relay routes each request. It counts tokens first!"
	// " Then it picks an upstream? Yes.\n"
	// "Short lines end segments too.\n東京は晴れです。"
	// "大阪は雨です。"
}

// shardCorpus holds texts of every shape the sharder must handle.
func shardCorpus() map[string]string {
	prose := strings.Repeat("The quick brown fox jumps over the lazy dog. Did it? It did! "+
		"\"Quoted sentences end here.\" (So do bracketed ones.) Decimal 3.14 and example.com do not.\n\n", 40)
	code := strings.Repeat(`func add(a, b int) int {
	// adds two numbers; see issue 1234.
	return a + b
}

type T struct{ x, y float64 }
`, 40)
	cjk := strings.Repeat("今天天气很好。我们去公园散步吧！你觉得怎么样？東京は晴れです。大阪は雨でした。", 30)
	cjkNoPunct := strings.Repeat("这是一个没有任何标点符号的很长很长的句子", 60)
	arabic := strings.Repeat("مرحبا بك في الموجه. كيف حالك اليوم؟ نحن نعد الرموز بدقة۔ ", 40)
	emoji := strings.Repeat("Family: 👨‍👩‍👧‍👦! Flags 🇫🇷🇩🇪. Skin 👍🏽? Keycap 1️⃣. ", 40)
	mixed := strings.Repeat("Überprüfen Sie die Konfiguration: naïve café résumé, 東京 の 天気 は 晴れ です。 Revenue grew 17.5% to 4,321,000 USD. ", 30)
	return map[string]string{
		"prose":        prose,
		"code":         code,
		"cjk":          cjk,
		"cjk-no-punct": cjkNoPunct,
		"arabic":       arabic,
		"emoji":        emoji,
		"mixed":        mixed,
		"long-word":    strings.Repeat("supercalifragilistic", 500),
		"one-letter":   strings.Repeat("a", 100<<10),
		"newlines":     strings.Repeat("\n", 5000),
		"crlf-lines":   strings.Repeat("line\r\n", 300),
		"bangs":        strings.Repeat("!", 3000),
		"spaces":       strings.Repeat(" ", 3000) + "x",
		"one-char":     "x",
		"one-rune":     "界",
		"short":        "Hello there.",
		"no-end":       strings.Repeat("word ", 400),
		"digits":       strings.Repeat("1234567890", 300),
		"base64":       strings.Repeat("QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0123+/", 100),
		"invalid-utf8": strings.Repeat("ok. \xff\xfe bad\xe4\xbd bytes! \x80", 50),
	}
}

// sentenceEnds lists every sentence end of text the way shardUnits finds
// them, in order, ending with the end of the text.
func sentenceEnds(text string) []int {
	var ends []int
	for p := 0; p < len(text); {
		if q, ok := sentenceEndAt(text, p); ok {
			ends = append(ends, q)
			p = q
			continue
		}
		_, n := utf8.DecodeRuneInString(text[p:])
		p += n
	}
	if len(ends) == 0 || ends[len(ends)-1] != len(text) {
		ends = append(ends, len(text))
	}
	return ends
}

// checkShard asserts every documented property of Shard(text, size, model)
// and returns the segments.
func checkShard(t *testing.T, text string, size int, model string) []string {
	t.Helper()
	segs := Shard(text, size, model)
	require.Equal(t, text, strings.Join(segs, ""), "reconstruction")
	if text == "" {
		require.Nil(t, segs)
		return segs
	}
	if size <= 0 {
		size = DefaultShardSize
	}
	bound := shardBoundFactor * size
	enc := encodingFor(model)
	ends := sentenceEnds(text)
	valid := utf8.ValidString(text)
	off := 0
	for i, seg := range segs {
		require.NotEmpty(t, seg, "segment %d is empty", i)
		start := off
		off += len(seg)
		if valid {
			require.True(t, utf8.ValidString(seg), "segment %d splits a rune: %q", i, seg)
		}
		if i == len(segs)-1 {
			break
		}
		n := countTokens(enc, seg)
		require.GreaterOrEqual(t, n, size, "segment %d (%q) is short", i, seg)
		k, isEnd := slices.BinarySearch(ends, off)
		if isEnd {
			require.LessOrEqual(t, n, bound, "segment %d ends at a sentence end beyond the bound", i)
			continue
		}
		// A hard cut: the first sentence end at which the segment would
		// have had size tokens must lie beyond the bound. (Ends more than
		// 32 bytes per token away are beyond it in any text but runs of
		// spaces; they are not counted, to keep the test fast.)
		for _, e := range ends[k:] {
			if e-start > 32*(bound+16) {
				break
			}
			if m := countTokens(enc, text[start:e]); m >= size {
				require.Greater(t, m, bound, "segment %d (%q) was cut hard at %d although the sentence end at %d has %d tokens",
					i, seg, off, e, m)
				break
			}
		}
	}
	return segs
}

func TestShardCorpus(t *testing.T) {
	for name, text := range shardCorpus() {
		for _, size := range []int{0, 1, 5, 16, 64, 300} {
			for _, model := range []string{"gpt-4o", "gpt-4"} {
				t.Run(fmt.Sprintf("%s/%d/%s", name, size, model), func(t *testing.T) {
					segs := checkShard(t, text, size, model)
					if countTokens(encodingFor(model), text) < max(size, 1) {
						assert.Len(t, segs, 1)
					}
				})
			}
		}
	}
}

func TestShardEdges(t *testing.T) {
	assert.Nil(t, Shard("", 16, "gpt-4o"))
	assert.Equal(t, []string{"x"}, Shard("x", 16, "gpt-4o"))
	assert.Equal(t, []string{"Short. Two sentences."}, Shard("Short. Two sentences.", 16, "gpt-4o"))
	assert.Equal(t, []string{"\n\n\n"}, Shard("\n\n\n", 16, "gpt-4o"))
	// Size 1: every sentence end is taken.
	assert.Equal(t, []string{"A.", " B?", " C!\n", "D"}, Shard("A. B? C!\nD", 1, "gpt-4o"))
	// Closers stay with their sentence; decimals and hosts are not ends.
	assert.Equal(t, []string{`He said "stop."`, ` Pi is 3.14 at example.com (roughly.)`, " End"},
		Shard(`He said "stop." Pi is 3.14 at example.com (roughly.) End`, 4, "gpt-4o"))
	// Newlines after a terminator belong to its sentence end.
	assert.Equal(t, []string{"Done.\n\n", "Next one."}, Shard("Done.\n\nNext one.", 1, "gpt-4o"))
	// CJK full stops end sentences without a following space.
	assert.Equal(t, []string{"你好。", "再见！", "好吗？"}, Shard("你好。再见！好吗？", 1, "gpt-4o"))
}

func TestShardHardCut(t *testing.T) {
	// One long sentence: hard cuts after about size tokens, at word
	// boundaries, then the tail ends at the full stop.
	text := strings.Repeat("word ", 200) + "end."
	segs := checkShard(t, text, 16, "gpt-4o")
	require.Greater(t, len(segs), 5)
	for _, seg := range segs[:len(segs)-1] {
		n := countTokens(o200k, seg)
		assert.GreaterOrEqual(t, n, 16)
		assert.LessOrEqual(t, n, 24, "%q", seg)
		assert.True(t, strings.HasSuffix(seg, "word"), "%q", seg) // cut before the space
	}
	// No boundary at all: the cut is where the prefix count steps past size.
	text = strings.Repeat("a", 100<<10)
	segs = checkShard(t, text, 16, "gpt-4o")
	for _, seg := range segs[:len(segs)-1] {
		assert.Equal(t, 16, countTokens(o200k, seg))
	}
	// A sentence end within the bound wins over a hard cut.
	text = strings.Repeat("word ", 40) + "end. " + strings.Repeat("more ", 10)
	segs = checkShard(t, text, 16, "gpt-4o")
	assert.True(t, strings.HasSuffix(segs[0], "end."), "%q", segs[0])
}

// TestShardOffsets checks that segments tile the text: offsets strictly
// increase and no segment repeats a position.
func TestShardOffsets(t *testing.T) {
	text := shardCorpus()["prose"]
	segs := Shard(text, 16, "gpt-4o")
	off := 0
	for _, seg := range segs {
		require.Equal(t, text[off:off+len(seg)], seg)
		next := off + len(seg)
		require.Greater(t, next, off)
		off = next
	}
	require.Equal(t, len(text), off)
}

// TestSafeCutsAreAdditive checks the pre-token boundary rule the sharder
// and the prefix blocks rest on: cutting at every boundary it accepts keeps
// the token count exact, in both encodings.
func TestSafeCutsAreAdditive(t *testing.T) {
	for name, text := range shardCorpus() {
		if len(text) > 20000 {
			text = text[:20000]
		}
		for _, enc := range []encoding{o200k, cl100k} {
			sum, n := safePieceSum(enc, text)
			assert.Equal(t, countTokens(enc, text), sum, "%s %s (%d cuts)", name, enc, n)
		}
	}
}

func safePieceSum(enc encoding, text string) (sum, cuts int) {
	last := 0
	for p := 1; p < len(text); p++ {
		if utf8.RuneStart(text[p]) && safeAt(text, p) {
			sum += countTokens(enc, text[last:p])
			last = p
			cuts++
		}
	}
	return sum + countTokens(enc, text[last:]), cuts
}

func FuzzShard(f *testing.F) {
	for _, text := range shardCorpus() {
		if len(text) > 600 {
			text = text[:600]
		}
		f.Add(text, 4)
	}
	f.Add("A. B? C!\nD", 1)
	f.Add("你好。再见！好吗？", 2)
	f.Add("x\r\n\r\n  /y's 'll\u0301. \u00a0\u3000z", 3)
	f.Fuzz(func(t *testing.T, text string, size int) {
		if len(text) > 4096 {
			return
		}
		size = size%64 - 8 // include size <= 0
		segs := Shard(text, size, "gpt-4o")
		require.Equal(t, text, strings.Join(segs, ""))
		if text == "" {
			require.Empty(t, segs)
		}
		valid := utf8.ValidString(text)
		for _, seg := range segs {
			require.NotEmpty(t, seg)
			if valid {
				require.True(t, utf8.ValidString(seg), "%q", seg)
			}
		}
		if size <= 0 {
			size = DefaultShardSize
		}
		for _, seg := range segs[:max(len(segs)-1, 0)] {
			require.GreaterOrEqual(t, countTokens(o200k, seg), size, "%q", seg)
		}
		// The boundary rule keeps counts exact.
		for _, enc := range []encoding{o200k, cl100k} {
			sum, _ := safePieceSum(enc, text)
			require.Equal(t, countTokens(enc, text), sum)
		}
		// Prefix blocks: deterministic, consistent with the memo path.
		hs := PrefixBlocks(text, "gpt-4o", 64)
		if text == "" {
			require.Nil(t, hs)
		} else {
			require.NotEmpty(t, hs)
			require.Equal(t, hs, prefixBlocks(newMemo(64), o200k, prefixCut(text, 64), 64, nil))
		}
	})
}

// Prefix blocks and affinity keys.

// words returns a deterministic text of about n tokens, distinct per seed.
func affWords(seed string, n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, " %s%d", seed, i)
		if i%12 == 11 {
			b.WriteString(".")
		}
	}
	return b.String()
}

func affChatReq(system, user string, tools string) string {
	m := map[string]any{
		"model": "gpt-4o",
		"messages": []map[string]any{
			{"role": "system", "content": system},
			{"role": "user", "content": user},
		},
	}
	if tools != "" {
		m["tools"] = json.RawMessage(tools)
	}
	b, _ := json.Marshal(m)
	return string(b)
}

func shardRouter(t testing.TB) *Router {
	r, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}}})
	require.NoError(t, err)
	return r
}

func affKeyOf(r *Router, path, body string) uint64 {
	c := r.classify("POST", path, nil, []byte(body))
	return r.affinityKey(&c)
}

func TestPrefixBlocksDefinition(t *testing.T) {
	text := affWords("alpha", 400)
	hs := PrefixBlocks(text, "gpt-4o", 0)
	require.NotEmpty(t, hs)
	// Blocks cover the first 256 tokens: at least 256/16 blocks minus the
	// overshoot, and every block has at least 16 tokens.
	assert.GreaterOrEqual(t, len(hs), 12)
	assert.LessOrEqual(t, len(hs), DefaultPrefixTokens/BlockTokens)
	// Recompute from the definition.
	t0 := prefixCut(text, DefaultPrefixTokens)
	h, start, covered := prefixSeeds[o200k], 0, 0
	var want []uint64
	for covered < DefaultPrefixTokens {
		end := -1
		for b := start + 1; b < len(t0); b++ {
			if safeAt(t0, b) && countTokens(o200k, t0[start:b]) >= BlockTokens {
				end = b
				break
			}
		}
		if end < 0 {
			break
		}
		h = fmix64(fnv1a(h, t0[start:end]))
		want = append(want, h)
		covered += countTokens(o200k, t0[start:end])
		start = end
	}
	assert.Equal(t, want, hs)
	// Stable across processes and releases: a golden value.
	assert.Equal(t, "relay-"+fmt.Sprintf("%016x", hs[0]), cacheKeyString(hs[0]))
	assert.Equal(t, uint64(0x48a0357a2b3e9668), PrefixBlocks("The quick brown fox jumps over the lazy dog, again and again and again.", "gpt-4o", 0)[0])
	// Shared prefixes share leading hashes.
	other := PrefixBlocks(affWords("alpha", 100)+affWords("beta", 300), "gpt-4o", 0)
	shared := 0
	for shared < min(len(hs), len(other)) && hs[shared] == other[shared] {
		shared++
	}
	assert.GreaterOrEqual(t, shared, 4)
	assert.Less(t, shared, len(hs))
	// Encodings hash apart; short texts hash what they have.
	assert.NotEqual(t, hs, PrefixBlocks(text, "gpt-4", 0))
	short := PrefixBlocks("Hi there", "gpt-4o", 0)
	require.Len(t, short, 1)
	assert.Equal(t, fmix64(fnv1a(prefixSeeds[o200k], "Hi there")), short[0])
	assert.NotEqual(t, short, PrefixBlocks("Hi there!", "gpt-4o", 0))
	assert.Nil(t, PrefixBlocks("", "gpt-4o", 0))
	// No boundary at all: one partial block over the cut text.
	assert.Len(t, PrefixBlocks(strings.Repeat("a", 10000), "gpt-4o", 0), 1)
}

func TestAffinityKey(t *testing.T) {
	r1, r2 := shardRouter(t), shardRouter(t)
	system := affWords("policy", 300)
	require.GreaterOrEqual(t, countTokens(o200k, system), 300)
	const chat = "/v1/chat/completions"
	k1 := affKeyOf(r1, chat, affChatReq(system, "What is the refund window?", ""))
	k2 := affKeyOf(r1, chat, affChatReq(system, "How do I reset my password?", ""))
	require.NotZero(t, k1)
	assert.Equal(t, k1, k2, "shared 300-token system prompt")
	// Warm memo gives the same key; so does another router (another memo).
	assert.Equal(t, k1, affKeyOf(r1, chat, affChatReq(system, "What is the refund window?", "")))
	assert.Equal(t, k1, affKeyOf(r2, chat, affChatReq(system, "Anything else?", "")))
	// A different system prompt gives a different key.
	assert.NotEqual(t, k1, affKeyOf(r1, chat, affChatReq(affWords("rules", 300), "What is the refund window?", "")))
	// The key is the last block of PrefixBlocks over the canonical prompt.
	canon := "system\n" + system + "\nuser\nWhat is the refund window?\n"
	hs := PrefixBlocks(canon, "gpt-4o", 0)
	assert.Equal(t, hs[len(hs)-1], k1)
	// Short prompts differ by their question.
	s1 := affKeyOf(r1, chat, affChatReq("Be brief.", "Hi", ""))
	s2 := affKeyOf(r1, chat, affChatReq("Be brief.", "Hello", ""))
	assert.NotZero(t, s1)
	assert.NotEqual(t, s1, s2)
	// Tools come after the system prompt and before the conversation.
	tools := `[{"type":"function","function":{"name":"lookup","parameters":{"type":"object"}}}]`
	kt := affKeyOf(r1, chat, affChatReq("Be brief.", "Hi", tools))
	assert.NotEqual(t, s1, kt)
	// Responses with the same content and no tools agree with chat.
	resp := `{"model":"gpt-4o","instructions":` + affJSON(system) + `,"input":"Another question"}`
	assert.Equal(t, k1, affKeyOf(r1, "/v1/responses", resp))
	items := `{"model":"gpt-4o","instructions":"Be brief.","input":[{"role":"user","content":[{"type":"input_text","text":"Hi"}]}]}`
	assert.Equal(t, s1, affKeyOf(r1, "/v1/responses", items))
	// Completions and embeddings hash their text.
	comp := `{"model":"gpt-4o","prompt":` + affJSON(system) + `}`
	assert.Equal(t, PrefixBlocks(system, "gpt-4o", 0)[len(PrefixBlocks(system, "gpt-4o", 0))-1], affKeyOf(r1, "/v1/completions", comp))
	emb := `{"model":"text-embedding-3-small","input":["a b c","d e f"]}`
	assert.Equal(t, PrefixBlocks("a b c\nd e f", "text-embedding-3-small", 0)[0], affKeyOf(r1, "/v1/embeddings", emb))
	// No prompt, no key.
	assert.Zero(t, affKeyOf(r1, chat, "not json"))
	assert.Zero(t, affKeyOf(r1, chat, `[1,2]`))
	assert.Zero(t, affKeyOf(r1, chat, `{"model":"gpt-4o","messages":[]}`))
	assert.Zero(t, affKeyOf(r1, "/v1/models", `{"model":"gpt-4o"}`))
}

func TestAffinityKeyEscapes(t *testing.T) {
	r := shardRouter(t)
	// JSON escapes decode: the same text escaped two ways gives one key.
	a := `{"model":"gpt-4o","messages":[{"role":"user","content":"caf\u00e9 <b> \ud83d\ude00 line\nnext"}]}`
	b := `{"model":"gpt-4o","messages":[{"role":"user","content":"café \u003cb\u003e 😀 line\nnext"}]}`
	assert.Equal(t, affKeyOf(r, "/v1/chat/completions", a), affKeyOf(r, "/v1/chat/completions", b))
	assert.Equal(t, "caf\u00e9 \ufffd\\q x", string(appendUnescaped(nil, `caf\u00e9 \ud83d\\q x`, 100)))
	assert.Equal(t, "ab", string(appendUnescaped(nil, `abcdef`, 2)))
	assert.Equal(t, `\x\`, string(appendUnescaped(nil, `\x\`, 10)))
}

// TestAffinityKeyLongPrompt checks the byte cap: a long prompt's key only
// depends on its beginning.
func TestAffinityKeyLongPrompt(t *testing.T) {
	r := shardRouter(t)
	head := benchPrompt(4 << 10)
	k1 := affKeyOf(r, "/v1/chat/completions", chatBody("gpt-4.1", head+" one"))
	k2 := affKeyOf(r, "/v1/chat/completions", chatBody("gpt-4.1", head+" two"))
	assert.Equal(t, k1, k2)
	hs := PrefixBlocks("user\n"+head+" one\n", "gpt-4.1", 0)
	assert.Equal(t, hs[len(hs)-1], k1)
}

func TestAffinityKeyConcurrent(t *testing.T) {
	r := shardRouter(t)
	system := affWords("shared", 300)
	want := affKeyOf(r, "/v1/chat/completions", affChatReq(system, "q", ""))
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				assert.Equal(t, want, affKeyOf(r, "/v1/chat/completions", affChatReq(system, fmt.Sprint("question ", g, i), "")))
			}
		}()
	}
	wg.Wait()
}

func affJSON(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func TestInjectCacheKey(t *testing.T) {
	r, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://127.0.0.1:1"}}, PromptCacheKey: true})
	require.NoError(t, err)
	inject := func(in string, key uint64) string {
		tr := &trip{r: r, body: []byte(in), key: key}
		tr.c = r.classify("POST", "/v1/chat/completions", nil, tr.body)
		return string(tr.bodyFor(candidate{up: r.ups[0], model: tr.c.req.Model}))
	}
	body := `{"model":"gpt-4o","messages":[]}`
	assert.Equal(t, `{"model":"gpt-4o","messages":[],"prompt_cache_key":"relay-0123456789abcdef"}`, inject(body, 0x0123456789abcdef))
	assert.Contains(t, inject(`{"model":"x"}`, 1), `"relay-0000000000000001"`)
	for _, in := range []string{
		`{"model":"gpt-4o","prompt_cache_key":"mine"}`,
		`{"prompt_cache_key":null}`,
		`not json`,
		`{"model":`,
		`[1,2,3]`,
		`"string"`,
		``,
	} {
		assert.Equal(t, in, inject(in, 42), in)
	}
	assert.Equal(t, `{"model":"x"}`, inject(`{"model":"x"}`, 0), "no key, no field")
}

func BenchmarkAffinityKey(b *testing.B) {
	r := shardRouter(b)
	body := []byte(chatBody("gpt-4.1", benchPrompt(4<<10)))
	c := r.classify("POST", "/v1/chat/completions", nil, body) // warms the token memo
	want := r.affinityKey(&c)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if r.affinityKey(&c) != want {
			b.Fatal("key changed")
		}
	}
}

func BenchmarkAffinityKeyCold(b *testing.B) {
	body := []byte(chatBody("gpt-4.1", benchPrompt(4<<10)))
	r, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}}, MemoEntries: -1})
	require.NoError(b, err)
	c := r.classify("POST", "/v1/chat/completions", nil, body)
	b.ReportAllocs()
	for b.Loop() {
		r.affinityKey(&c)
	}
}

func BenchmarkShard(b *testing.B) {
	text := benchPrompt(16 << 10)
	countTokens(o200k, "load the encoding")
	b.ReportAllocs()
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		Shard(text, 16, "gpt-4o")
	}
}
