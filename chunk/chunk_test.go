package chunk

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tokenrelay/relay/internal/bpe"
	"github.com/tokenrelay/relay/internal/tokens"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func ExampleSplit() {
	text := "Relay routes each request. It counts tokens first! Then it picks an upstream? " +
		"Yes.\nShort lines end segments too.\n東京は晴れです。大阪は雨です。"
	for _, seg := range Split(text, 8, "gpt-4o") {
		fmt.Printf("%q\n", seg)
	}
	// Output:
	// "Relay routes each request. It counts tokens first!"
	// " Then it picks an upstream? Yes.\n"
	// "Short lines end segments too.\n東京は晴れです。"
	// "大阪は雨です。"
}

// corpus holds texts of every shape the splitter must handle.
func corpus() map[string]string {
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
		"invalid":      strings.Repeat("今天天气很好。Fine\xff weather. 我们去公园\xe4\xbd散步吧！", 40),
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
		"json":         indentedJSON(),
	}
}

// indentedJSON is a catalog of 40 records as json.MarshalIndent writes it:
// lines that meet at a newline before indentation, no sentence ends
// inside a line.
func indentedJSON() string {
	type item struct {
		ID    int            `json:"id"`
		Name  string         `json:"name"`
		Tags  []string       `json:"tags"`
		Price float64        `json:"price"`
		Meta  map[string]any `json:"meta"`
	}
	items := make([]item, 40)
	for i := range items {
		items[i] = item{ID: i, Name: fmt.Sprintf("item %d of the catalog", i), Tags: []string{"red", "large", "sale"},
			Price: float64(i) * 1.25, Meta: map[string]any{"in_stock": i%2 == 0, "dims": map[string]int{"w": i, "h": 2 * i}}}
	}
	b, err := json.MarshalIndent(map[string]any{"items": items}, "", "  ")
	if err != nil {
		panic(err)
	}
	return string(b)
}

// sentenceEnds lists every sentence end of text the way units finds
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

// checkSplit asserts every documented property of Split(text, size, model)
// and returns the segments.
func checkSplit(t *testing.T, text string, size int, model string) []string {
	t.Helper()
	segs := Split(text, size, model)
	require.Equal(t, text, strings.Join(segs, ""), "reconstruction")
	if text == "" {
		require.Nil(t, segs)
		return segs
	}
	if size <= 0 {
		size = DefaultSize
	}
	bound := boundFactor * size
	enc := tokens.ForModel(model)
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
		n := enc.Count(seg)
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
			if m := enc.Count(text[start:e]); m >= size {
				require.Greater(t, m, bound, "segment %d (%q) was cut hard at %d although the sentence end at %d has %d tokens",
					i, seg, off, e, m)
				break
			}
		}
	}
	return segs
}

func TestSplitCorpus(t *testing.T) {
	for name, text := range corpus() {
		for _, size := range []int{0, 1, 5, 16, 64, 300} {
			for _, model := range []string{"gpt-4o", "gpt-4"} {
				t.Run(fmt.Sprintf("%s/%d/%s", name, size, model), func(t *testing.T) {
					segs := checkSplit(t, text, size, model)
					if tokens.ForModel(model).Count(text) < max(size, 1) {
						assert.Len(t, segs, 1)
					}
				})
			}
		}
	}
}

func TestSplitEdges(t *testing.T) {
	assert.Nil(t, Split("", 16, "gpt-4o"))
	assert.Equal(t, []string{"x"}, Split("x", 16, "gpt-4o"))
	assert.Equal(t, []string{"Short. Two sentences."}, Split("Short. Two sentences.", 16, "gpt-4o"))
	assert.Equal(t, []string{"\n\n\n"}, Split("\n\n\n", 16, "gpt-4o"))
	// Size 1: every sentence end is taken.
	assert.Equal(t, []string{"A.", " B?", " C!\n", "D"}, Split("A. B? C!\nD", 1, "gpt-4o"))
	// Closers stay with their sentence; decimals and hosts are not ends.
	assert.Equal(t, []string{`He said "stop."`, ` Pi is 3.14 at example.com (roughly.)`, " End"},
		Split(`He said "stop." Pi is 3.14 at example.com (roughly.) End`, 4, "gpt-4o"))
	// Newlines after a terminator belong to its sentence end.
	assert.Equal(t, []string{"Done.\n\n", "Next one."}, Split("Done.\n\nNext one.", 1, "gpt-4o"))
	// CJK full stops end sentences without a following space.
	assert.Equal(t, []string{"你好。", "再见！", "好吗？"}, Split("你好。再见！好吗？", 1, "gpt-4o"))
}

func TestSplitHardCut(t *testing.T) {
	// One long sentence: hard cuts after about size tokens, at word
	// boundaries, then the tail ends at the full stop.
	text := strings.Repeat("word ", 200) + "end."
	segs := checkSplit(t, text, 16, "gpt-4o")
	require.Greater(t, len(segs), 5)
	for _, seg := range segs[:len(segs)-1] {
		n := tokens.O200K.Count(seg)
		assert.GreaterOrEqual(t, n, 16)
		assert.LessOrEqual(t, n, 24, "%q", seg)
		assert.True(t, strings.HasSuffix(seg, "word"), "%q", seg) // cut before the space
	}
	// No boundary at all: the cut is where the prefix count steps past size.
	text = strings.Repeat("a", 100<<10)
	segs = checkSplit(t, text, 16, "gpt-4o")
	for _, seg := range segs[:len(segs)-1] {
		assert.Equal(t, 16, tokens.O200K.Count(seg))
	}
	// A sentence end within the bound wins over a hard cut.
	text = strings.Repeat("word ", 40) + "end. " + strings.Repeat("more ", 10)
	segs = checkSplit(t, text, 16, "gpt-4o")
	assert.True(t, strings.HasSuffix(segs[0], "end."), "%q", segs[0])
}

// TestSplitOffsets checks that segments tile the text: offsets strictly
// increase and no segment repeats a position.
func TestSplitOffsets(t *testing.T) {
	text := corpus()["prose"]
	segs := Split(text, 16, "gpt-4o")
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
	for name, text := range corpus() {
		if len(text) > 20000 {
			text = text[:20000]
		}
		for _, enc := range []tokens.Encoding{tokens.O200K, tokens.CL100K} {
			sum, n := safePieceSum(enc, text)
			assert.Equal(t, enc.Count(text), sum, "%s %s (%d cuts)", name, enc, n)
		}
	}
}

// TestSplitCutsAddUp checks the splitter's own boundary rule (safeAt:
// SafeAt's, a letter next to a number, a line end before indentation):
// cutting at every position it accepts keeps the count exact, in both
// encodings, on the corpus and on random mixes of letters and numbers of
// several scripts (Latin, Latin-1, CJK, Hangul, Arabic-Indic digits,
// superscripts, Roman numerals, which are \p{N}), marks, apostrophes and
// punctuation.
func TestSplitCutsAddUp(t *testing.T) {
	texts := []string{}
	for _, text := range corpus() {
		texts = append(texts, text[:min(len(text), 20000)])
	}
	pieces := []string{"a", "Ab", "xyz", "é", "中文", "한", "1", "12", "123", "4567", "٣٤", "²", "Ⅻ", "\u0301", "'s", "'", "!", "-", " ", "\n", "f00d", "0x", "Z9", "cafe\u0301", "n\u0303o", "\u0301\u0301"}
	rng := rand.New(rand.NewPCG(11, 12))
	for range 4000 {
		var b strings.Builder
		for range 1 + rng.IntN(16) {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		texts = append(texts, b.String())
	}
	letterNumber := 0
	for _, text := range texts {
		for _, enc := range []tokens.Encoding{tokens.O200K, tokens.CL100K} {
			sum, last := 0, 0
			for p := 1; p < len(text); p++ {
				if !utf8.RuneStart(text[p]) || !safeAt(text, p) {
					continue
				}
				if !tokens.SafeAt(text, p) && !tokens.SafeBeforeIndent(text, p) {
					letterNumber++
				}
				sum += enc.Count(text[last:p])
				last = p
			}
			sum += enc.Count(text[last:])
			require.Equal(t, enc.Count(text), sum, "%s %q", enc, text)
		}
	}
	assert.Greater(t, letterNumber, 5000, "the letter-number rule was tried at few positions")
}

// TestDigitCutsAddUp checks digitCut's rule: cutting a text inside its
// runs of numbers after every third number of each run (and at every
// boundary safeAt knows) keeps the count exact in both encodings, on
// random mixes of ASCII, Arabic-Indic and superscript digits, Roman
// numerals, letters, marks, spaces and punctuation. The same cuts one
// number later do change counts, so the test tells the rule from a wrong
// one.
func TestDigitCutsAddUp(t *testing.T) {
	pieces := []string{"0", "12", "345", "6789", "٣٤", "²", "Ⅻ", "a", "Bc", "中", "\u0301", "'s", " ", "\n", ".", "-", "x9"}
	rng := rand.New(rand.NewPCG(21, 22))
	sum := func(enc tokens.Encoding, text string, phase int) int {
		n, last, run := 0, 0, 0
		for p := 0; p < len(text); {
			c, size := tokens.ClassAt(text, p)
			if p > 0 && (c == tokens.ClassNumber && run > 0 && run%3 == phase || safeAt(text, p)) {
				n += enc.Count(text[last:p])
				last = p
			}
			if c == tokens.ClassNumber {
				run++
			} else {
				run = 0
			}
			p += size
		}
		return n + enc.Count(text[last:])
	}
	wrong, digitCuts := 0, 0
	for range 4000 {
		var b strings.Builder
		for range 1 + rng.IntN(24) {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		text := b.String()
		for _, enc := range []tokens.Encoding{tokens.O200K, tokens.CL100K} {
			require.Equal(t, enc.Count(text), sum(enc, text, 0), "%s %q", enc, text)
			if sum(enc, text, 1) != enc.Count(text) {
				wrong++
			}
		}
		if strings.Contains(text, "6789") {
			digitCuts++
		}
	}
	assert.Greater(t, digitCuts, 500, "few runs of more than three digits")
	assert.Greater(t, wrong, 100, "cuts after the first number of every three should change counts")
}

func safePieceSum(enc tokens.Encoding, text string) (sum, cuts int) {
	last := 0
	for p := 1; p < len(text); p++ {
		if utf8.RuneStart(text[p]) && tokens.SafeAt(text, p) {
			sum += enc.Count(text[last:p])
			last = p
			cuts++
		}
	}
	return sum + enc.Count(text[last:]), cuts
}

func FuzzSplit(f *testing.F) {
	for _, text := range corpus() {
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
		segs := Split(text, size, "gpt-4o")
		require.Equal(t, splitRef(text, size, "gpt-4o"), segs)
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
			size = DefaultSize
		}
		for _, seg := range segs[:max(len(segs)-1, 0)] {
			require.GreaterOrEqual(t, tokens.O200K.Count(seg), size, "%q", seg)
		}
		// The boundary rule keeps counts exact.
		for _, enc := range []tokens.Encoding{tokens.O200K, tokens.CL100K} {
			sum, _ := safePieceSum(enc, text)
			require.Equal(t, enc.Count(text), sum)
		}
	})
}

// BenchmarkSplit measures splitting a 16 KB prose-and-code prompt into
// 16-token segments.
func BenchmarkSplit(b *testing.B) {
	text := strings.Repeat(corpus()["prose"], 4)[:16<<10]
	tokens.O200K.Count("load the encoding")
	b.ReportAllocs()
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		Split(text, 16, "gpt-4o")
	}
}

// TestSplitMatchesReference checks that Split cuts where the splitter cut
// before it skipped needless counts (ref_test.go): on the corpus, in both
// encodings, at several sizes, and on random texts.
func TestSplitMatchesReference(t *testing.T) {
	for name, text := range corpus() {
		if len(text) > 40000 {
			text = text[:40000]
		}
		for _, size := range []int{0, 1, 5, 16, 64} {
			for _, model := range []string{"gpt-4o", "gpt-4"} {
				require.Equal(t, splitRef(text, size, model), Split(text, size, model), "%s/%d/%s", name, size, model)
			}
		}
	}
}

// TestSplitMatchesReferenceRandom holds Split to the reference on random
// texts drawn from pieces that meet in every way the splitter treats
// apart: sentence ends with and without a space after them, full stops
// before letters, closers, newlines, runs without boundaries, digits and an
// invalid byte.
func TestSplitMatchesReferenceRandom(t *testing.T) {
	pieces := []string{
		"今天", "天气很好", "。", "！", "？", "」", "，", "東京は晴れです", "a", "word", " ", "  ",
		".", "?", "!", "…", "\n", "\r\n", "\n\n", "Hello", " there", "3.14", "x.y", "'s",
		"\"", ")", "12345", "aaaaaaaaaaaaaaaa", "👍🏽", "\t", "\xff", "مرحبا", "؟", "।",
	}
	rng := rand.New(rand.NewPCG(1, 2))
	n := 3000
	if testing.Short() {
		n = 300
	}
	for i := range n {
		var b strings.Builder
		for range 1 + rng.IntN(120) {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		text := b.String()
		size := 1 + rng.IntN(24)
		model := []string{"gpt-4o", "gpt-4"}[i%2]
		require.Equal(t, splitRef(text, size, model), Split(text, size, model), "%q size %d %s", text, size, model)
	}
}

// TestSplitMatchesReferenceLongRuns holds Split to the reference on long
// runs without boundaries, where it remembers counts and hard cuts by
// their text (runMemo): runs that repeat, runs that do not (at size 3,
// enough segments to fill the memo and turn it off), and the two one after
// the other.
func TestSplitMatchesReferenceLongRuns(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	random := func(alphabet string, n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		return string(b)
	}
	n := 12 << 10 // at size 3, enough hard cuts to fill the memo (memoSize) and turn it off
	texts := map[string]string{
		"ab":             strings.Repeat("ab", n/2),
		"pattern":        strings.Repeat("=-", n/4) + strings.Repeat("1234567890", n/20),
		"random-letters": random("abcdefghijklmnopqrstuvwxyz", n),
		"random-digits":  random("0123456789", n),
		"repeat-random":  strings.Repeat("x", n/2) + random("xyz", n) + strings.Repeat("x", n/2),
		// One letter with another at random, now and then: pieces that are
		// equal but for a byte, which a memo keyed by less than the whole
		// text would confuse.
		"sparse": random(strings.Repeat("a", 150)+"b", n),
	}
	for name, text := range texts {
		for _, size := range []int{3, 16} {
			for _, model := range []string{"gpt-4o", "gpt-4"} {
				require.Equal(t, splitRef(text, size, model), Split(text, size, model), "%s/%d/%s", name, size, model)
			}
		}
	}
}

// TestMemoizedMatchesDirect: countRun and bisect, which remember their
// answers by the text they read, answer what count and search do, for
// pieces of a run that are equal but for a byte (one letter with another
// now and then), asked in any order.
func TestMemoizedMatchesDirect(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	b := make([]byte, 16<<10)
	for i := range b {
		b[i] = 'a'
		if rng.IntN(40) == 0 {
			b[i] = 'b'
		}
	}
	text := string(b)
	for _, model := range []string{"gpt-4o", "gpt-4"} {
		for _, size := range []int{2, 5, 16} {
			sh := splitter{text: text, enc: tokens.ForModel(model), size: size, bound: 4 * size, validTo: len(text)}
			for range 800 {
				a := rng.IntN(64) * 211 // few starts: pieces are asked again
				n := 1 + rng.IntN(20*size)
				require.Equal(t, sh.count(a, a+n), sh.countRun(a, a+n, a%2 == 0), "%s: count of [%d, %d)", model, a, a+n)
				lo := a + rng.IntN(n)
				require.Equal(t, sh.search(a, lo, a+n), sh.bisect(a, lo, a+n), "%s/%d: cut of [%d, %d) from %d", model, size, a, a+n, lo)
			}
			assert.Positive(t, sh.runs.hits, "%s/%d: the count memo was never used", model, size)
			assert.Positive(t, sh.cuts.hits, "%s/%d: the cut memo was never used", model, size)
		}
	}
}

// TestCountSegIsCount: countSeg, which counts the prefixes of a run in one
// pass where the text from the segment's start is a single pre-token,
// counts what count does, from starts in texts of runs of letters (mixed
// case, contractions), digits, spaces, newlines and punctuation, to every
// rune start; the pass is taken, and where a prefix is more than one
// pre-token it is not.
func TestCountSegIsCount(t *testing.T) {
	tokens.O200K.Warm()
	tokens.CL100K.Warm()
	pieces := []string{"abc", "xq", "Zeta", "QR", "'s", "'", " ", "  ", "\n", "!!", "=", "12", "é", "日本", "😀"}
	rng := rand.New(rand.NewPCG(9, 10))
	passes := 0
	for iter := range 400 {
		var b strings.Builder
		for b.Len() < 20+rng.IntN(300) {
			if rng.IntN(3) > 0 {
				b.WriteString(pieces[rng.IntN(2)]) // mostly lowercase letters: long single pieces
			} else {
				b.WriteString(pieces[rng.IntN(len(pieces))])
			}
		}
		text := b.String()
		model := []string{"gpt-4o", "gpt-4"}[iter%2]
		sh := splitter{text: text, enc: tokens.ForModel(model), size: 16, bound: 64, validTo: len(text)}
		for range 4 {
			s := rng.IntN(len(text))
			for !utf8.RuneStart(text[s]) {
				s--
			}
			for m := s; m <= len(text); m++ {
				if m < len(text) && !utf8.RuneStart(text[m]) {
					continue
				}
				require.Equal(t, sh.count(s, m), sh.countSeg(s, m), "%s: %q from %d to %d", model, text, s, m)
				if sh.preAt == s+1 {
					passes++
				}
			}
		}
	}
	assert.Greater(t, passes, 10000, "the one-pass counts were seldom used")
}

// TestRunMemo: the memo holds at most memoSize entries, empties itself
// when full, and turns itself off when what it held was seldom found again.
func TestRunMemo(t *testing.T) {
	var m runMemo[int]
	for i := range 10 * memoSize {
		m.put(i, i)
		m.get(i) // found again once each: kept on
		assert.LessOrEqual(t, len(m.m), memoSize)
	}
	assert.False(t, m.off)
	v, ok := m.get(10*memoSize - 1)
	assert.True(t, ok)
	assert.Equal(t, 10*memoSize-1, v)

	var cold runMemo[int]
	for i := range memoSize + 1 {
		cold.put(i, i) // never found again
	}
	assert.True(t, cold.off)
	cold.put(-1, 1)
	_, ok = cold.get(-1)
	assert.False(t, ok, "an off memo remembers nothing")
}

func TestValidPrefix(t *testing.T) {
	for s, want := range map[string]int{"": 0, "abc": 3, "界x": 4, "ab\xff界": 2, "界\xe4\xbd": 3, "\xe4\xbd界": 0, "a\xed\xa0\x80": 1} {
		assert.Equal(t, want, validPrefix(s), "%q", s)
	}
	// Longer than a block, with runes across the blocks' ends.
	long := "a" + strings.Repeat("界", 3000) // 9001 bytes: 4096 falls inside a rune
	assert.Equal(t, len(long), validPrefix(long))
	for _, at := range []int{0, 1, 4095, 4096, 4097, 8193, len(long)} {
		bad := long[:at] + "\xff" + long[at:]
		want := at
		for want > 0 && want < len(long) && !utf8.RuneStart(long[want]) {
			want-- // a rune cut by the inserted byte is not valid either
		}
		assert.Equal(t, want, validPrefix(bad), "invalid byte at %d", at)
	}
}

// TestMaxTokenBytes checks maxTokenBytes against both vocabularies.
func TestMaxTokenBytes(t *testing.T) {
	for _, e := range []*bpe.Encoding{bpe.O200K(), bpe.CL100K()} {
		longest := 0
		for _, tok := range e.Tokens() {
			longest = max(longest, len(tok))
		}
		assert.Equal(t, maxTokenBytes, longest, e.Name())
	}
}

// BenchmarkSplit1MiB compares splitting 1 MiB of text into 16-token
// segments with counting the same text, side by side: prose and code (the
// common case), CJK prose, and runs without a pre-token boundary the
// splitter knows, where every segment is cut hard by a search over prefix
// counts: runs that repeat (one letter, a long word repeated, a digit
// pattern, newlines) and runs that do not (random-letters: random
// lowercase letters; random-digits), random hexadecimal digits (letters
// next to digits: boundaries), and indented JSON (json.MarshalIndent)
// in 16-, 256- and 1024-token segments, whose lines meet at a newline
// before indentation.
func BenchmarkSplit1MiB(b *testing.B) {
	tokens.O200K.Count(strings.Repeat("a", 1<<20)) // builds the tables long pieces need
	rng := rand.New(rand.NewPCG(3, 4))
	random := func(alphabet string) string {
		t := make([]byte, 1<<20)
		for i := range t {
			t[i] = alphabet[rng.IntN(len(alphabet))]
		}
		return string(t)
	}
	runs := map[string]string{
		"random-letters": random("abcdefghijklmnopqrstuvwxyz"),
		"random-digits":  random("0123456789"),
		"hex":            random("0123456789abcdef"),
	}
	for _, name := range []string{"prose", "code", "cjk", "one-letter", "long-word", "digits", "newlines", "random-letters", "random-digits", "hex", "json"} {
		src, ok := runs[name]
		if !ok {
			src = corpus()[name]
		}
		text := strings.Repeat(src, (1<<20)/len(src)+1)[:1<<20]
		sizes := []int{16}
		if name == "json" {
			sizes = []int{16, 256, 1024}
		}
		for _, size := range sizes {
			row := name + "/split"
			if size != 16 {
				row = fmt.Sprintf("%s/split-%d", name, size)
			}
			b.Run(row, func(b *testing.B) {
				b.SetBytes(int64(len(text)))
				for b.Loop() {
					Split(text, size, "gpt-4o")
				}
			})
		}
		b.Run(name+"/count", func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				tokens.O200K.Count(text)
			}
		})
	}
}
