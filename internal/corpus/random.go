package corpus

import (
	"math/rand/v2"
	"strings"
)

// HandWritten is a corpus of short texts that meet the cases of the split
// patterns one by one: contractions, code, JSON, Markdown, many scripts,
// emoji sequences, combining marks, digits, whitespace runs, special
// tokens, invalid UTF-8 and control bytes, and runs of each.
var HandWritten = []string{
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

// RunePool holds interesting runes, covering all the character classes
// the split patterns use.
var RunePool = []rune{
	'a', 'b', 'z', 'A', 'Z', 'e', 's', 'S', 't', 'r', 'l', 'L', 'd', 'm', 'v', 'E', '0', '5', '9',
	' ', ' ', ' ', '\t', '\n', '\r', '\v', '\f', '\'', '\'', '"', '.', ',', '!', '?', '/', '-', '_',
	'(', ')', '{', '}', '<', '|', '>', '#', '$', '%', '&', '*', '+', '=', ':', ';', '@', '\\', '`', '~',
	0x00, 0x1f, 0x7f, 0x85, 0xa0, 0xad, 'é', 'ß', 'ñ', 'Ö', 'ǅ', 'ʰ', 'ª', 'º', 0x0301, 0x0308, 0x20dd,
	0x0903, 'Ж', 'ж', 'Ω', 'ω', 'ا', 'ب', '٣', 'न', 'म', 'े', '्', '४', 'ก', 'ั', '日', '本', 'の', 'ア', '한',
	'。', '，', 0x2028, 0x2029, 0x3000, 0x200b, 0x200d, 0xfe0f, 0x1680, 0x2009, '½', '²', 'Ⅻ',
	0x1F600, 0x1F44D, 0x1F3FD, 0x1F1FA, 0x1F1F8, 0x1F468, 0x20000, 0x30000, 0xE0100, 0xE0001, 0x1D400,
	0x10400, 0x10428, 0x1E900, 0xFFFD, 0x1F3F3,
}

// WordPool holds words and pieces that the split patterns treat apart.
var WordPool = []string{
	"the", "The", "THE", " of", " and", "ing", "tion", "hello", "world", "don't", "I'M", "we'll",
	"func", "return", "{", "}", "()", "\"key\"", ": ", ", ", "\n", "\r\n", "  ", "\t", "12345", "3.14",
	"日本語", "Привет", "مرحبا", "नमस्ते", "สวัสดี", "👨‍👩‍👧", "👍🏽", "e\u0301", "<|endoftext|>", "//", "...",
	"\xff", "\xe2\x82", "'s", "'LL", " '", "ǅ", "ʰ", "ABCdef",
}

// Random returns a text of 1 to maxLen bytes (and a few more) of runes of
// RunePool, words of WordPool and runs of one rune, drawn by rng.
func Random(rng *rand.Rand, maxLen int) string {
	var sb strings.Builder
	n := rng.IntN(maxLen) + 1
	for sb.Len() < n {
		switch rng.IntN(4) {
		case 0, 1:
			sb.WriteRune(RunePool[rng.IntN(len(RunePool))])
		case 2:
			sb.WriteString(WordPool[rng.IntN(len(WordPool))])
		default:
			c := rng.IntN(6) + 1
			r := RunePool[rng.IntN(len(RunePool))]
			for range c {
				sb.WriteRune(r)
			}
		}
	}
	return sb.String()
}

// FullCacheFiller is 4 MiB of random lowercase words of 2 to 20 letters:
// counted first, its pieces fill every way of every set of the piece
// cache's tables of keys up to 8 and 24 bytes.
func FullCacheFiller() string {
	rng := rand.New(rand.NewPCG(21, 22))
	var sb strings.Builder
	for sb.Len() < 4<<20 {
		sb.WriteByte(' ')
		for range 2 + rng.IntN(19) {
			sb.WriteByte(byte('a' + rng.IntN(26)))
		}
	}
	return sb.String()
}
