package bpe

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestNames(t *testing.T) {
	first, second := CL100K(), CL100K()
	if first.Name() != "cl100k_base" || O200K().Name() != "o200k_base" || first != second {
		t.Fatal("bad names or encodings not cached")
	}
}

func TestLoadTime(t *testing.T) {
	for _, name := range []string{"cl100k_base", "o200k_base"} {
		start := time.Now()
		e := mustLoad(name, name == "o200k_base")
		t.Logf("%s: loaded %d byte arena in %v", name, len(e.ranks.arena), time.Since(start))
		// A fresh load is the same table as the cached encoding's.
		cached := CL100K()
		if name == "o200k_base" {
			cached = O200K()
		}
		if len(e.ranks.arena) != len(cached.ranks.arena) || e.Count(mixedCorpus(4<<10)) != cached.Count(mixedCorpus(4<<10)) {
			t.Fatalf("%s: a fresh load differs from the cached encoding", name)
		}
	}
}

// Published vectors (tiktoken's own test suite and README).
func TestKnownVectors(t *testing.T) {
	cl, o := CL100K(), O200K()
	// cl100k_base: "hello world" -> [15339, 1917]
	eq(t, 2, cl.Count("hello world"))
	eq(t, uint32(15339), cl.ranks.get("hello"))
	eq(t, uint32(1917), cl.ranks.get(" world"))
	// cl100k_base: "tiktoken is great!" -> [83, 1609, 5963, 374, 2294, 0]
	eq(t, 6, cl.Count("tiktoken is great!"))
	// "<|endoftext|>" as ordinary text: [27, 91, 8862, 728, 428, 91, 29]
	eq(t, 7, cl.Count("<|endoftext|>"))
	// o200k_base: "hello world" -> [24912, 2375]
	eq(t, 2, o.Count("hello world"))
	eq(t, uint32(24912), o.ranks.get("hello"))
	eq(t, uint32(2375), o.ranks.get(" world"))
	eq(t, 0, cl.Count(""))
	eq(t, 0, o.Count(""))
	// cl100k_base: "\n" -> [198], "  \n" -> [720]
	eq(t, 1, cl.Count("\n"))
	eq(t, uint32(198), cl.ranks.get("\n"))
}

func checkParity(t *testing.T, inputs []string) {
	t.Helper()
	for _, e := range encodings() {
		ref := reference(t, e.Name())
		bad := 0
		for _, in := range inputs {
			want := len(ref.EncodeOrdinary(in))
			if got := e.Count(in); got != want {
				bad++
				if bad <= 10 {
					t.Errorf("%s: Count(%q) = %d, tiktoken-go = %d", e.Name(), in, got, want)
				}
			}
		}
		if bad > 0 {
			t.Errorf("%s: %d/%d mismatches", e.Name(), bad, len(inputs))
		}
	}
}

var handCorpus = []string{
	"hello world", "Hello World", "HELLO WORLD", "hello, world!", "  hello   world  ",
	"The quick brown fox jumps over the lazy dog.",
	"It's a dog's life; we'll see, they'd've, I'm, you're, they've, she'll, he'd",
	"IT'S WE'LL THEY'D I'M YOU'RE THEY'VE SHE'LL", "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D",
	"'sup 'Sup don'T CAN'T O'Neil rock'n'roll ''s '''", "x'S y'Ll z'rE", "'", "''", "' s", "'\n",
	"func main() {\n\tfmt.Println(\"hi\")\n}\n", "if (a && b) { return x->y; } // comment",
	"for i := 0; i < 10; i++ {\r\n\tsum += i\r\n}\r\n",
	`{"name": "relay", "tokens": [1, 2, 3], "nested": {"ok": true, "pi": 3.14159}}`,
	"# Title\n\n- item one\n- item two\n\n```go\nx := 1\n```\n\n> quote\n\n| a | b |\n|---|---|\n",
	"日本語のテキストです。漢字とひらがなとカタカナ。", "中文测试，这是一个句子。", "한국어 문장입니다.",
	"Привет, мир! Как дела? ПРИВЕТ", "مرحبا بالعالم، كيف حالك؟", "नमस्ते दुनिया, आप कैसे हैं?",
	"สวัสดีชาวโลก ภาษาไทย", "Ελληνικά κείμενα ΚΕΦΑΛΑΙΑ", "עברית טקסט", "Ünïcödé çàfé naïve résumé",
	"👋🌍 hello 👨‍👩‍👧‍👦 family 👍🏽 thumbs 🏳️‍🌈 flag", "🇺🇸🇫🇷🇯🇵", "😀😃😄😁😆😅😂🤣",
	"e\u0301 a\u0300 o\u0308 combining: \u0301\u0301\u0301x", "\u0301abc", " \u0301", "A\u0301BC\u0300d",
	"Ǆǅǆ ǈǉ titlecase ǅungla", "ʰʲʷ modifier ˈlɛtər", "ABCdef ABC abcDEF aBcDeF",
	"1234567890 12 123 1234 12345 123456789012345678901234567890", "٣٤٥ ١٢٣ ४५६ Ⅻ ½ ²³",
	"3.14159 1,000,000 $100 50% #1 v1.2.3", "a1b2c3 abc123def",
	" ", "  ", "\t", "\n", "\r\n", "\n\n\n", " \n", "\n ", " \n ", "  \n  \n  x", "a  b", "a\tb", "a \tb",
	"a\n\nb", "a \n\n b", "trailing   ", "trailing\n\n  ", "\t\t\tindent", "   leading", "x\u00a0y", "x\u3000y",
	"a\u2028b\u2029c", "\v\f", " \u0085 ", "mixed \t \n \r\n \r \t end",
	"<|endoftext|>", "<|endoftext|> hi <|fim_prefix|><|fim_middle|><|fim_suffix|><|endofprompt|>",
	"!!!???...---", " !!!\n\n", "a/b/c //path/ x//\n/", "http://example.com/a?b=c&d=e#f",
	"!\n/\n/", "?/\r\n", " ...\r\n\r\n", "\xff", "abc\xffdef", "\xe2\x82", "\xe2\x82\xac", "\xed\xa0\x80",
	"\xf0\x9f\x98", "caf\xc3", "\xc3\x28", "hello\x80world", "\x80\x81\x82 \xfe\xff", "\uFFFD literal",
	"ab\x00cd", "\x00\x01\x02\x1f\x7f",
	strings.Repeat("a", 100), strings.Repeat("ab", 60), strings.Repeat(" ", 70) + "x",
	strings.Repeat("\n", 40), strings.Repeat("😀", 30), strings.Repeat("1", 50), strings.Repeat("!", 70),
	strings.Repeat("Ab", 50), strings.Repeat("\u0301", 40), strings.Repeat("日本", 40),
	strings.Repeat(" \n", 30) + "z", strings.Repeat("\t ", 30), strings.Repeat("x ", 40),
}

func TestParityHandWritten(t *testing.T) {
	checkParity(t, handCorpus)
}

// interesting runes covering all character classes the splitters use.
var runePool = []rune{
	'a', 'b', 'z', 'A', 'Z', 'e', 's', 'S', 't', 'r', 'l', 'L', 'd', 'm', 'v', 'E', '0', '5', '9',
	' ', ' ', ' ', '\t', '\n', '\r', '\v', '\f', '\'', '\'', '"', '.', ',', '!', '?', '/', '-', '_',
	'(', ')', '{', '}', '<', '|', '>', '#', '$', '%', '&', '*', '+', '=', ':', ';', '@', '\\', '`', '~',
	0x00, 0x1f, 0x7f, 0x85, 0xa0, 0xad, 'é', 'ß', 'ñ', 'Ö', 'ǅ', 'ʰ', 'ª', 'º', 0x0301, 0x0308, 0x20dd,
	0x0903, 'Ж', 'ж', 'Ω', 'ω', 'ا', 'ب', '٣', 'न', 'म', 'े', '्', '४', 'ก', 'ั', '日', '本', 'の', 'ア', '한',
	'。', '，', 0x2028, 0x2029, 0x3000, 0x200b, 0x200d, 0xfe0f, 0x1680, 0x2009, '½', '²', 'Ⅻ',
	0x1F600, 0x1F44D, 0x1F3FD, 0x1F1FA, 0x1F1F8, 0x1F468, 0x20000, 0x30000, 0xE0100, 0xE0001, 0x1D400,
	0x10400, 0x10428, 0x1E900, 0xFFFD, 0x1F3F3,
}

var wordPool = []string{
	"the", "The", "THE", " of", " and", "ing", "tion", "hello", "world", "don't", "I'M", "we'll",
	"func", "return", "{", "}", "()", "\"key\"", ": ", ", ", "\n", "\r\n", "  ", "\t", "12345", "3.14",
	"日本語", "Привет", "مرحبا", "नमस्ते", "สวัสดี", "👨‍👩‍👧", "👍🏽", "e\u0301", "<|endoftext|>", "//", "...",
	"\xff", "\xe2\x82", "'s", "'LL", " '", "ǅ", "ʰ", "ABCdef",
}

func genInput(rng *rand.Rand, maxLen int) string {
	var sb strings.Builder
	n := rng.IntN(maxLen) + 1
	for sb.Len() < n {
		switch rng.IntN(4) {
		case 0, 1:
			sb.WriteRune(runePool[rng.IntN(len(runePool))])
		case 2:
			sb.WriteString(wordPool[rng.IntN(len(wordPool))])
		default:
			c := rng.IntN(6) + 1
			r := runePool[rng.IntN(len(runePool))]
			for range c {
				sb.WriteRune(r)
			}
		}
	}
	return sb.String()
}

func TestParityRandomStructured(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	inputs := make([]string, 3000)
	for i := range inputs {
		inputs[i] = genInput(rng, 60)
	}
	checkParity(t, inputs)
}

func TestParityRandomBytes(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	inputs := make([]string, 1500)
	for i := range inputs {
		b := make([]byte, rng.IntN(40)+1)
		for j := range b {
			switch rng.IntN(3) {
			case 0:
				b[j] = byte(rng.IntN(256))
			case 1:
				b[j] = " \n\tabcAB'1.!\r/"[rng.IntN(14)]
			default:
				b[j] = byte(0x80 + rng.IntN(0x80))
			}
		}
		inputs[i] = string(b)
	}
	checkParity(t, inputs)
}

// Every single code point class, in context.
func TestParityAllRuneClasses(t *testing.T) {
	seen := map[uint8]bool{}
	var inputs []string
	tbl := classTable()
	for r := rune(0); r <= utf8.MaxRune; r++ {
		var c uint8
		if r < tableLimit {
			c = tbl[r]
		} else {
			c = slowClass(r)
		}
		if r >= 0xD800 && r <= 0xDFFF {
			continue
		}
		key := c
		if r < 0x80 || !seen[key] {
			seen[key] = true
			for _, ctx := range []string{"%c", "a%c", "A%c", " %c", "%cb", "%cB", "%c's", "1%c2", "%c%c", "!%c", "\n%c", "%c \n"} {
				inputs = append(inputs, strings.ReplaceAll(fmt.Sprintf(ctx, r), "%!(EXTRA int32=", ""))
			}
		}
	}
	checkParity(t, inputs)
}

func TestParityLongerDocuments(t *testing.T) {
	doc := mixedCorpus(6 << 10)
	var inputs []string
	for i := 0; i+512 <= len(doc); i += 700 {
		inputs = append(inputs, doc[i:i+512])
	}
	inputs = append(inputs, doc)
	checkParity(t, inputs)
}

func TestConcurrent(t *testing.T) {
	doc := mixedCorpus(4 << 10)
	want := [2]int{CL100K().Count(doc), O200K().Count(doc)}
	done := make(chan bool)
	for g := range 4 {
		go func() {
			ok := true
			for range 20 {
				ok = ok && CL100K().Count(doc) == want[0] && O200K().Count(doc) == want[1]
				ok = ok && CL100K().Count(strings.Repeat("a", 100+g)) > 0
			}
			done <- ok
		}()
	}
	for range 4 {
		if !<-done {
			t.Error("concurrent count mismatch")
		}
	}
}

func eq[T comparable](t *testing.T, want, got T) {
	t.Helper()
	if want != got {
		t.Errorf("want %v, got %v", want, got)
	}
}

func TestBacktrackerBuildTime(t *testing.T) {
	for _, e := range encodings() {
		start := time.Now()
		bt := buildBacktracker(&e.ranks)
		t.Logf("%s: backtracker built in %v (%d trie nodes)", e.Name(), time.Since(start), len(bt.trie.nodeTok))
	}
}

// The benchmark corpora agree with tiktoken-go (the first 64 KiB of each,
// to keep the quadratic reference fast); the one-letter corpus, a single
// 256 KiB pre-token, agrees with the heap merge.
func TestParityCorpora(t *testing.T) {
	for _, c := range benchCorpora(t) {
		if c.quadratic {
			for _, e := range encodings() {
				if got, want := e.Count(c.text), e.mergeHeap(c.text, new(scratch)); got != want {
					t.Errorf("%s/%s: Count = %d, heap merge %d", c.name, e.Name(), got, want)
				}
			}
			continue
		}
		checkParity(t, []string{cutRunes(c.text, 64<<10)})
	}
}

// TestAppendPieces: at each pre-token end AppendPieces reports the count of
// the text up to it, the ends rise to the text's end, a batch stops when
// dst is full, and the next one continues from its last piece as one call
// with room for all would.
func TestAppendPieces(t *testing.T) {
	text := "Hello, world! It's 12345 tokens\n\n  東京の天気 😀👍🏽 don't /path ok"
	for _, e := range []*Encoding{O200K(), CL100K()} {
		all := e.AppendPieces(make([]Piece, 0, len(text)), text, 0, 0)
		prev := 0
		for _, pc := range all {
			if int(pc.End) <= prev {
				t.Fatalf("%s: end %d after %d", e.Name(), pc.End, prev)
			}
			if want := e.Count(text[:pc.End]); int(pc.Cum) != want {
				t.Fatalf("%s: cum %d at %d, Count gives %d", e.Name(), pc.Cum, pc.End, want)
			}
			prev = int(pc.End)
		}
		if prev != len(text) || len(all) < 10 {
			t.Fatalf("%s: last end %d of %d after %d pieces", e.Name(), prev, len(text), len(all))
		}
		var batched []Piece
		i, cum := 0, 0
		for {
			ps := e.AppendPieces(make([]Piece, 0, 3), text, i, cum)
			if len(ps) == 0 {
				break
			}
			if len(ps) < 3 && int(ps[len(ps)-1].End) != len(text) {
				t.Fatalf("%s: a batch of %d pieces before the text's end", e.Name(), len(ps))
			}
			batched = append(batched, ps...)
			i, cum = int(ps[len(ps)-1].End), int(ps[len(ps)-1].Cum)
		}
		if !slices.Equal(batched, all) {
			t.Fatalf("%s: batches of 3 give %v, one batch %v", e.Name(), batched, all)
		}
	}
}
