package relay

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/tokenrelay/relay/internal/jsonscan"
	"github.com/tokenrelay/relay/internal/prompt"
	"github.com/tokenrelay/relay/internal/tokens"
)

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
	return r.keyOf(&c)
}

// prefixHashes returns the prefix shard hashes of text in the encoding of
// model, without a memo.
func prefixHashes(text, model string) []uint64 {
	return prefixShards(nil, tokens.ForModel(model), prefixCut(text), nil, nil)
}

// definitionShards computes the shard hashes of text straight from the
// definition (shard.go), counting every candidate prefix of every shard.
func definitionShards(text string, enc tokens.Encoding) []uint64 {
	t0 := prefixCut(text)
	if t0 == "" {
		return nil
	}
	h, start, covered := prefixSeeds[enc], 0, 0
	var hs []uint64
	for covered < prefixTokens {
		end := -1
		for b := start + 1; b < len(t0); b++ {
			if tokens.SafeAt(t0, b) && enc.Count(t0[start:b]) >= shardTokens {
				end = b
				break
			}
		}
		if end < 0 {
			break
		}
		h = fmix64(fnv1a(h, t0[start:end]))
		hs = append(hs, h)
		covered += enc.Count(t0[start:end])
		start = end
	}
	if len(hs) == 0 {
		hs = append(hs, fmix64(fnv1a(prefixSeeds[enc], t0)))
	}
	return hs
}

func TestPrefixShardsDefinition(t *testing.T) {
	text := affWords("alpha", 400)
	hs := prefixHashes(text, "gpt-4o")
	require.NotEmpty(t, hs)
	// Blocks cover the first 256 tokens: at least 256/16 blocks minus the
	// overshoot, and every block has at least 16 tokens.
	assert.GreaterOrEqual(t, len(hs), 12)
	assert.LessOrEqual(t, len(hs), prefixTokens/shardTokens)
	// Recompute from the definition, here and on random texts.
	assert.Equal(t, definitionShards(text, tokens.O200K), hs)
	rng := rand.New(rand.NewPCG(11, 12))
	for range 100 {
		r := randText(rng, rng.IntN(2048))
		for _, enc := range []tokens.Encoding{tokens.O200K, tokens.CL100K} {
			require.Equal(t, definitionShards(r, enc), prefixShards(nil, enc, prefixCut(r), nil, nil), "%q", r)
		}
	}
	// Stable across processes and releases: a golden value.
	assert.Equal(t, "relay-"+fmt.Sprintf("%016x", hs[0]), cacheKeyString(hs[0]))
	assert.Equal(t, uint64(0x48a0357a2b3e9668), prefixHashes("The quick brown fox jumps over the lazy dog, again and again and again.", "gpt-4o")[0])
	// Shared prefixes share leading hashes.
	other := prefixHashes(affWords("alpha", 100)+affWords("beta", 300), "gpt-4o")
	shared := 0
	for shared < min(len(hs), len(other)) && hs[shared] == other[shared] {
		shared++
	}
	assert.GreaterOrEqual(t, shared, 4)
	assert.Less(t, shared, len(hs))
	// Encodings hash apart; short texts hash what they have.
	assert.NotEqual(t, hs, prefixHashes(text, "gpt-4"))
	short := prefixHashes("Hi there", "gpt-4o")
	require.Len(t, short, 1)
	assert.Equal(t, fmix64(fnv1a(prefixSeeds[tokens.O200K], "Hi there")), short[0])
	assert.NotEqual(t, short, prefixHashes("Hi there!", "gpt-4o"))
	assert.Nil(t, prefixHashes("", "gpt-4o"))
	// No boundary at all: one partial block over the cut text.
	assert.Len(t, prefixHashes(strings.Repeat("a", 10000), "gpt-4o"), 1)
}

func TestAffinityKey(t *testing.T) {
	r1, r2 := shardRouter(t), shardRouter(t)
	system := affWords("policy", 300)
	require.GreaterOrEqual(t, tokens.O200K.Count(system), 300)
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
	// The key is the last prefix shard hash over the canonical prompt.
	canon := "system\n" + system + "\nuser\nWhat is the refund window?\n"
	hs := prefixHashes(canon, "gpt-4o")
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
	assert.Equal(t, prefixHashes(system, "gpt-4o")[len(prefixHashes(system, "gpt-4o"))-1], affKeyOf(r1, "/v1/completions", comp))
	emb := `{"model":"text-embedding-3-small","input":["a b c","d e f"]}`
	assert.Equal(t, prefixHashes("a b c\nd e f", "text-embedding-3-small")[0], affKeyOf(r1, "/v1/embeddings", emb))
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
	assert.Equal(t, "caf\u00e9 \ufffd\\q x", string(jsonscan.AppendUnescaped(nil, `caf\u00e9 \ud83d\\q x`, 100)))
	assert.Equal(t, "ab", string(jsonscan.AppendUnescaped(nil, `abcdef`, 2)))
	assert.Equal(t, `\x\`, string(jsonscan.AppendUnescaped(nil, `\x\`, 10)))
}

// TestAffinityKeyLongPrompt checks the byte cap: a long prompt's key only
// depends on its beginning.
func TestAffinityKeyLongPrompt(t *testing.T) {
	r := shardRouter(t)
	head := benchPrompt(4 << 10)
	k1 := affKeyOf(r, "/v1/chat/completions", chatBody("gpt-4.1", head+" one"))
	k2 := affKeyOf(r, "/v1/chat/completions", chatBody("gpt-4.1", head+" two"))
	assert.Equal(t, k1, k2)
	hs := prefixHashes("user\n"+head+" one\n", "gpt-4.1")
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

// BenchmarkAffinityKey measures the affinity key of a 4 KB chat prompt
// alone, from a body already read as classify reads it, with a warm memo:
// the key is found under its strings as written (rawKey).
func BenchmarkAffinityKey(b *testing.B) {
	r := shardRouter(b)
	b.Run("one-shot", func(b *testing.B) { benchKey(b, r, chatBody("gpt-4.1", benchPrompt(4<<10))) })
	// The overhead benchmark's conversation: the key mixes in its anchor.
	b.Run("conversation", func(b *testing.B) { benchKey(b, r, string(newOverheadBody(b).b)) })
}

// BenchmarkAffinityKeyCold is BenchmarkAffinityKey without a memo: the
// pieces of the first 256 tokens are counted every time.
func BenchmarkAffinityKeyCold(b *testing.B) {
	r, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}}, MemoEntries: -1})
	require.NoError(b, err)
	benchKey(b, r, chatBody("gpt-4.1", benchPrompt(4<<10)))
}

func benchKey(b *testing.B, r *Router, s string) {
	body := []byte(s)
	want := r.classify("POST", "/v1/chat/completions", nil, body).key // warms the token memo
	r.classify("POST", "/v1/chat/completions", nil, body)             // stores it under its raw key
	sc := getScratch()
	defer sc.release()
	sc.known = knownMemo{m: r.counter.memo, enc: tokens.O200K}
	if sc.known.m != nil {
		sc.rd.Known, sc.rd.KnownMin = &sc.known, memoMin
	}
	sc.rd.Read(prompt.Chat, string(body))
	enc := tokens.ForModel("gpt-4.1")
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if r.prefixKey(enc, sc) != want {
			b.Fatal("key changed")
		}
	}
}

// FuzzPrefixShards checks that prefix shard hashes follow the definition
// (for texts short enough to count every candidate prefix), are
// deterministic, and are the same with and without the memo of shard ends.
func FuzzPrefixShards(f *testing.F) {
	f.Add("The quick brown fox jumps over the lazy dog. " + affWords("x", 300))
	f.Add("x\r\n\r\n  /y's 'll\u0301. \u00a0\u3000z")
	f.Add(strings.Repeat("a", 5000))
	f.Fuzz(func(t *testing.T, text string) {
		if len(text) > 8192 {
			return
		}
		m := newMemo(64)
		want := prefixHashes(text, "gpt-4o")
		if text == "" {
			require.Empty(t, want)
			return
		}
		require.NotEmpty(t, want)
		if len(text) <= 2048 {
			require.Equal(t, definitionShards(text, tokens.O200K), want, "the definition")
		}
		for range 2 { // cold memo, then warm
			require.Equal(t, want, prefixShards(m, tokens.O200K, prefixCut(text), nil, nil))
		}
	})
}

// TestAffinityKeyConversation: a conversation past its first turn is keyed
// on its first turn too, so two conversations behind one system prompt get
// keys of their own, each the same on every later turn; a first turn, a
// one-shot request and a Responses input keep the shared prefix's key.
func TestAffinityKeyConversation(t *testing.T) {
	r := shardRouter(t)
	system := affWords("policy", 300)
	const chat = "/v1/chat/completions"
	conv := func(turns ...string) string {
		msgs := []map[string]any{{"role": "system", "content": system}}
		for i, c := range turns {
			role := "user"
			if i%2 == 1 {
				role = "assistant"
			}
			msgs = append(msgs, map[string]any{"role": role, "content": c})
		}
		b, err := json.Marshal(map[string]any{"model": "gpt-4o", "messages": msgs})
		require.NoError(t, err)
		return string(b)
	}
	shared := affKeyOf(r, chat, conv("How do I reset my password?"))
	assert.Equal(t, shared, affKeyOf(r, chat, conv("What is the refund window?")), "first turns share the prefix key")
	a2 := affKeyOf(r, chat, conv("How do I reset my password?", "Open settings.", "I did."))
	a3 := affKeyOf(r, chat, conv("How do I reset my password?", "Open settings.", "I did.", "Then?", "It worked."))
	b2 := affKeyOf(r, chat, conv("What is the refund window?", "30 days.", "Thanks."))
	assert.NotEqual(t, shared, a2)
	assert.Equal(t, a2, a3, "every later turn of a conversation shares its key")
	assert.NotEqual(t, a2, b2, "conversations have keys of their own")
	hs := prefixHashes("system\n"+system+"\nuser\nHow do I reset my password?\nassistant\nOpen settings.\nuser\nI did.\n", "gpt-4o")
	assert.Equal(t, withAnchor(hs[len(hs)-1], []byte("user\nHow do I reset my password?\n")), a2, "step 6")
	// A tool loop: the task anchors it.
	tools := `[{"type":"function","function":{"name":"lookup","parameters":{"type":"object"}}}]`
	loop := `{"model":"gpt-4o","tools":` + tools + `,"messages":[{"role":"system","content":` + affJSON(system) + `},{"role":"user","content":"Fix the build."},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"lookup","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"ok"}]}`
	assert.NotEqual(t, affKeyOf(r, chat, loop), affKeyOf(r, chat, strings.Replace(loop, "Fix the build.", "Fix the tests.", 1)))
	// Responses: an input array past its first item.
	items := `{"model":"gpt-4o","instructions":` + affJSON(system) + `,"input":[{"role":"user","content":"How do I reset my password?"},{"role":"assistant","content":"Open settings."},{"role":"user","content":"I did."}]}`
	assert.Equal(t, a2, affKeyOf(r, "/v1/responses", items), "the same conversation through either API")
}

// scanBoth runs scanShardPieces and scanShardRunes on copies of the same
// text from start and checks they agree: the shard (end, count, found),
// the boundaries learned, what the text needed and the text built. It
// returns whether scanShardPieces was sure.
func scanBoth(t *testing.T, enc tokens.Encoding, x shardText, start, covered int) bool {
	t.Helper()
	xr, xp := x, x
	var kr, kp []known
	endR, nR, okR := scanShardRunes(enc, &xr, start, covered, &kr)
	endP, nP, okP, sure := scanShardPieces(enc, &xp, start, covered, &kp)
	if !sure {
		assert.Empty(t, kp, "an unsure scan leaves kn alone")
		endP, nP, okP = scanShardRunes(enc, &xp, start, covered, &kp)
	}
	ctx := fmt.Sprintf("%s from %d of %q (%d built)", enc, start, x.t[start:min(len(x.t), start+80)], len(x.t))
	require.Equal(t, [3]any{endR, nR, okR}, [3]any{endP, nP, okP}, ctx)
	require.Equal(t, kr, kp, ctx)
	require.Equal(t, xr.need, xp.need, ctx)
	require.Equal(t, xr.t, xp.t, ctx)
	return sure
}

// TestScanShardPiecesMatchesRunes: finding shards among the counter's
// pre-token ends gives what the rune-by-rune scan gives, shard after
// shard, on whole texts and on texts built in two steps (cut anywhere,
// in a rune too), in both encodings. Invalid UTF-8 goes the rune way.
func TestScanShardPiecesMatchesRunes(t *testing.T) {
	texts := []string{
		benchPrompt(3000),
		strings.Repeat("東京の天気は晴れです。😀👍🏽 ", 40),
		strings.Repeat("x", 700) + " tail",
		strings.Repeat("1234567890", 60),
		strings.Repeat("  \n\n\t line\r\n", 50),
		strings.Repeat("don't we'll it's O'Neil's /path/to/file ./x //y ", 20),
		strings.Repeat("a-b_c.d,e;f:g!h?i(j)k[l]{m}n<o>p=q+r*s&t^u%v$w#x@y~z`", 12),
		"system\nYou are a helpful assistant.\nuser\nWhat is 2+2?\nassistant\n4\nuser\nAnd 3+3?\n",
		"short text",
		"",
		"bad \xff\xfe bytes " + strings.Repeat("word ", 80),
		strings.Repeat("é", 500) + strings.Repeat(" ü", 100),
	}
	rng := rand.New(rand.NewPCG(1, 2))
	scans, sure := 0, 0
	for _, enc := range []tokens.Encoding{tokens.O200K, tokens.CL100K} {
		for _, text := range texts {
			cuts := []int{len(text)}
			for range 6 {
				cuts = append(cuts, rng.IntN(len(text)+1))
			}
			for _, cut := range cuts {
				x := shardText{t: text[:cut]}
				if cut < len(text) {
					x.more = func() string { return text }
				}
				start, covered := 0, 0
				for start >= 0 && covered < prefixTokens {
					scans++
					if scanBoth(t, enc, x, start, covered) {
						sure++
					}
					// go on as shardEnds does, on the text the scan built
					xr := x
					e, n, ok := scanShardRunes(enc, &xr, start, covered, nil)
					if !ok {
						break
					}
					x.t, x.more = xr.t, xr.more
					start, covered = e, covered+n
				}
			}
		}
	}
	t.Logf("%d scans, %d decided among pre-token ends", scans, sure)
	assert.Greater(t, sure, scans*3/4, "most scans take the one-pass way")
}

func FuzzScanShard(f *testing.F) {
	f.Add("The quick brown fox jumps over the lazy dog. "+strings.Repeat("Hello, world! ", 10), uint16(30))
	f.Add(strings.Repeat("東京 ", 30), uint16(7))
	f.Add("a\r\n\r\n b's /x 12345 é", uint16(3))
	f.Fuzz(func(t *testing.T, text string, cut uint16) {
		if len(text) > 4096 {
			return
		}
		for _, enc := range []tokens.Encoding{tokens.O200K, tokens.CL100K} {
			x := shardText{t: text}
			if c := int(cut) % (len(text) + 1); c < len(text) {
				x = shardText{t: text[:c], more: func() string { return text }}
			}
			scanBoth(t, enc, x, 0, 0)
		}
	})
}

// rawKeyOf reads body as classify does and returns its raw key, and
// whether there is one and the memo holds a key under it.
func rawKeyOf(r *Router, path, body string) (raw uint64, ok, stored bool) {
	sc := getScratch()
	defer sc.release()
	sc.known = knownMemo{m: r.counter.memo, enc: tokens.Encoding(r.counter.lastEnc.Load())}
	sc.rd.Known, sc.rd.KnownMin = &sc.known, memoMin
	sc.rd.Read(prompt.Endpoint(path), body)
	enc := tokens.ForModel(gjson.Get(body, "model").Str)
	raw, ok = r.rawKey(enc, sc)
	if ok {
		_, stored = r.counter.memo.getKey(raw)
	}
	return raw, ok, stored
}

// TestAffinityKeyRaw checks the memo of keys by strings as written: a
// prompt seen before is keyed without building its canonical prompt, a
// new one has no raw key until its strings are known, and the raw key
// tells apart what the canonical prompt tells apart as far as the key
// reads it: the first 2048 canonical bytes and the anchor's first 512.
func TestAffinityKeyRaw(t *testing.T) {
	const chat = "/v1/chat/completions"
	r := shardRouter(t)
	system := strings.Repeat(`Answer with care.\nCite the policy.\n`, 60) // escapes: decoded lengths from the memo
	conv := func(system, first, last string) string {
		return `{"model":"gpt-4o","messages":[{"role":"system","content":"` + system + `"},{"role":"user","content":"` + first +
			`"},{"role":"assistant","content":"Sure."},{"role":"user","content":"` + last + `"}]}`
	}
	first := strings.Repeat(`Where is my parcel?\n`, 10)
	body := conv(system, first, "Thanks")
	_, ok, _ := rawKeyOf(r, chat, body)
	assert.False(t, ok, "a new prompt has no raw key")
	k := affKeyOf(r, chat, body)
	raw, ok, stored := rawKeyOf(r, chat, body)
	require.True(t, ok, "its strings known, the prompt has a raw key")
	assert.False(t, stored, "stored by the first classify only once its strings were known")
	assert.Equal(t, k, affKeyOf(r, chat, body))
	_, _, stored = rawKeyOf(r, chat, body)
	require.True(t, stored, "the second classify stores the key under the raw key")
	assert.Equal(t, k, affKeyOf(r, chat, body), "and the third reads it")

	// A later turn (past the 2048 bytes and the anchor) shares the raw key.
	raw2, ok, _ := rawKeyOf(r, chat, conv(system, first, "And when will it arrive?"))
	assert.True(t, ok)
	assert.Equal(t, raw, raw2)
	// Another anchor, the same text escaped otherwise, or another encoding
	// is another raw key.
	first2 := strings.Replace(first, "parcel", "order!", 1)
	affKeyOf(r, chat, conv(system, first2, "Thanks"))
	raw3, ok, _ := rawKeyOf(r, chat, conv(system, first2, "Thanks"))
	assert.True(t, ok)
	assert.NotEqual(t, raw, raw3)
	alt := strings.ReplaceAll(system, `\n`, `\u000a`)
	assert.Equal(t, k, affKeyOf(r, chat, conv(alt, first, "Thanks")), "the canonical prompt decodes escapes")
	raw4, _, _ := rawKeyOf(r, chat, conv(alt, first, "Thanks"))
	assert.NotEqual(t, raw, raw4)
	gpt4 := strings.Replace(body, `"gpt-4o"`, `"gpt-4"`, 1)
	kc := affKeyOf(r, chat, gpt4)
	assert.NotEqual(t, k, kc)
	assert.Equal(t, kc, affKeyOf(r, chat, gpt4))
	assert.Equal(t, kc, affKeyOf(r, chat, gpt4))
	assert.Equal(t, k, affKeyOf(r, chat, body), "each encoding has its own raw key")
}
