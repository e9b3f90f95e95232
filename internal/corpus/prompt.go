package corpus

import "strings"

// promptParts are the sentences of Prompt: prose, code, figures, and
// accented and CJK text.
var promptParts = []string{
	"The quick brown fox jumps over the lazy dog while the router counts every token. ",
	"func add(a, b int) int { return a + b } // adds two numbers; see issue 1234. ",
	"Revenue grew 17.5% to 4,321,000 USD in Q3 2026, up from 3,678,000 a year earlier. ",
	"Überprüfen Sie die Konfiguration: naïve café résumé, 東京 の 天気 は 晴れ です。 ",
}

// Prompt returns n bytes of mixed prose, code and numbers that need no
// JSON escaping.
func Prompt(n int) string {
	var sb strings.Builder
	for i := 0; sb.Len() < n; i++ {
		sb.WriteString(promptParts[i%len(promptParts)])
	}
	s := sb.String()
	for len(s) > n { // cut on a rune boundary
		s = s[:n]
		for len(s) > 0 && s[len(s)-1]&0xC0 == 0x80 {
			s = s[:len(s)-1]
		}
		if len(s) > 0 && s[len(s)-1] >= 0xC0 {
			s = s[:len(s)-1]
		}
	}
	return s
}

// PromptTexts are the four contents of Chat (system, user, assistant, user:
// 1,400, 840, 700 and 420 bytes of mixed prose, code, figures and accented
// and CJK text, in lines of 80 bytes that each start with a nine-digit
// number), each cut through a multi-byte rune read as one U+FFFD.
func PromptTexts() [][]byte {
	text := Prompt(8 << 10)
	var out [][]byte
	for _, r := range [][2]int{{0, 1400}, {2000, 840}, {4000, 700}, {6000, 420}} {
		s := text[r[0] : r[0]+r[1]]
		var b []byte
		for len(s) >= 70 {
			b = append(b, "000000000 "...)
			b = append(b, strings.ToValidUTF8(s[:70], "\uFFFD")...)
			b = append(b, '\n')
			s = s[70:]
		}
		out = append(out, b)
	}
	return out
}
