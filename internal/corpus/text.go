// Package corpus makes the texts and request bodies that the tests and
// benchmarks of relay share with those of its interop module: each is
// deterministic, generated in memory or from the files embedded here (and,
// for GoSource, the Go distribution's sources).
package corpus

import (
	"bufio"
	"bytes"
	_ "embed"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
)

var mixedParts = []string{
	"The relay forwards requests to the upstream model provider and counts tokens on the way. ",
	"It's important that we'll never under-count; they'd notice the bill.\n\n",
	"func (r *Router) Route(ctx context.Context, req *Request) (*Response, error) {\n\tif req == nil {\n\t\treturn nil, errNilRequest\n\t}\n\treturn r.next.Do(ctx, req)\n}\n",
	`{"model":"gpt-4o","messages":[{"role":"user","content":"Summarize: 12345 items, 3.5% off"}],"max_tokens":256,"stream":true}` + "\n",
	"## Usage\n\n1. Install with `go get`.\n2. Run `relay serve --port 8080`.\n\n| key | value |\n|-----|-------|\n| a   | 1     |\n",
	"日本語の文章をトークン化します。これはテストです。", "Съешь же ещё этих мягких французских булок, да выпей чаю. ",
	"هذا نص عربي للاختبار. ", "यह एक परीक्षण वाक्य है। ", "นี่คือประโยคทดสอบภาษาไทย ", "👋 Hello 👨‍👩‍👧‍👦! Great job 👍🏽🎉\n",
	"    def compute(self, x):\r\n        return x ** 2  # square\r\n", "<|endoftext|>", "   \n\t\n",
}

// Mixed deterministically generates about n bytes of mixed text: prose,
// code, JSON, Markdown, several scripts, emoji and special tokens.
func Mixed(n int) string {
	rng := rand.New(rand.NewPCG(42, uint64(n)))
	var sb strings.Builder
	for sb.Len() < n {
		sb.WriteString(mixedParts[rng.IntN(len(mixedParts))])
	}
	s := sb.String()[:n]
	for len(s) > 0 && !isRuneStart(s[len(s)-1]) {
		s = s[:len(s)-1]
	}
	return s
}

func isRuneStart(b byte) bool { return b < 0x80 }

// CutRunes returns s cut to at most n bytes at a rune boundary.
func CutRunes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.RuneStart(s[len(s)-1]) {
		s = s[:len(s)-1]
	}
	if len(s) > 0 {
		if r, size := utf8.DecodeLastRuneInString(s); r == utf8.RuneError && size == 1 {
			s = s[:len(s)-1]
		}
	}
	return s
}

// wordList is a word frequency list: words and their cumulative counts.
type wordList struct {
	words []string
	cum   []int
}

//go:embed english-words.txt
var englishWordsFile []byte

// englishWords is the word frequency list of english-words.txt.
var englishWords = sync.OnceValue(func() wordList {
	var words []string
	var cum []int // cumulative counts
	total := 0
	sc := bufio.NewScanner(bytes.NewReader(englishWordsFile))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		w, c, ok := strings.Cut(line, " ")
		n, err := strconv.Atoi(c)
		if !ok || err != nil || n <= 0 {
			panic("corpus: english-words.txt: bad line " + strconv.Quote(line))
		}
		total += n
		words = append(words, w)
		cum = append(cum, total)
	}
	return wordList{words, cum}
})

// Prose generates n bytes of English prose: words drawn with their
// frequencies in a real book (Zipf-distributed, about 4,300 distinct words,
// a third of them seen once there), in sentences of 6 to 30 words with
// commas and semicolons, sentences capitalized, paragraphs separated by a
// blank line. It simulates natural-language prompts and documents.
func Prose(n int) string {
	wl := englishWords()
	words, cum := wl.words, wl.cum
	total := cum[len(cum)-1]
	rng := rand.New(rand.NewPCG(11, 12))
	var sb strings.Builder
	for sb.Len() < n {
		for range 3 + rng.IntN(5) { // sentences per paragraph
			nw := 6 + rng.IntN(25)
			for i := range nw {
				w := words[sort.SearchInts(cum, rng.IntN(total)+1)]
				if i == 0 {
					r, size := utf8.DecodeRuneInString(w)
					sb.WriteString(strings.ToUpper(string(r)))
					sb.WriteString(w[size:])
				} else {
					sb.WriteByte(' ')
					sb.WriteString(w)
				}
				if i < nw-1 {
					switch p := rng.IntN(100); {
					case p < 7:
						sb.WriteByte(',')
					case p < 8:
						sb.WriteByte(';')
					}
				}
			}
			switch p := rng.IntN(100); {
			case p < 90:
				sb.WriteString(". ")
			case p < 96:
				sb.WriteString("? ")
			default:
				sb.WriteString("! ")
			}
		}
		sb.WriteString("\n\n")
	}
	return CutRunes(sb.String(), n)
}

// goSourceFiles is the fixed list of files of the Go distribution whose
// concatenation, in this order, is the Go source corpus.
var goSourceFiles = []string{
	"net/http/server.go", "net/http/transport.go", "net/http/request.go", "runtime/proc.go",
	"go/parser/parser.go", "go/printer/nodes.go", "encoding/json/decode.go", "encoding/json/encode.go",
	"fmt/print.go", "strings/strings.go", "bytes/bytes.go", "sort/sort.go", "strconv/quote.go",
	"text/template/exec.go", "regexp/syntax/parse.go", "time/format.go", "os/file.go", "bufio/bufio.go",
	"context/context.go", "database/sql/sql.go", "net/url/url.go", "crypto/tls/conn.go",
}

// GoSource returns n bytes of Go source: goSourceFiles concatenated
// from GOROOT/src (deterministic for a given Go release). It simulates code
// in prompts. ok is false when GOROOT's sources do not add up to n bytes.
func GoSource(n int) (text string, ok bool) {
	var buf bytes.Buffer
	for _, name := range goSourceFiles {
		data, err := os.ReadFile(filepath.Join(runtime.GOROOT(), "src", filepath.FromSlash(name)))
		if err != nil {
			continue
		}
		buf.Write(data)
		if buf.Len() >= n {
			return CutRunes(buf.String(), n), true
		}
	}
	return "", false
}

// CJK words and emoji for cjkEmojiCorpus.
var (
	zhWords = strings.Fields(`我们 你们 他们 这个 那个 什么 为什么 怎么 可以 已经 因为 所以 但是 如果 虽然 然后 现在
		今天 明天 昨天 时间 问题 方法 系统 数据 模型 用户 服务器 网络 请求 响应 计算 结果 文件 程序 代码 函数 测试 性能 速度
		提高 减少 增加 使用 需要 进行 发现 开始 结束 完成 处理 分析 研究 学习 工作 公司 市场 经济 社会 国家 政府 人民 城市
		历史 文化 语言 文字 中文 英文 翻译 理解 知道 认为 觉得 希望 喜欢 朋友 家人 孩子 老师 学生 学校 大学 医院 医生 天气
		春天 夏天 秋天 冬天 山 水 风 雨 雪 花 树 鸟 鱼 猫 狗 吃饭 喝茶 咖啡 早上 晚上 中午 一个 两个 三个 很多 一些 非常
		特别 比较 重要 简单 复杂 容易 困难 新 旧 大 小 高 低 快 慢 好 坏 的 了 在 是 有 和 就 也 都 不 没有 会 能 要 说 看 想
		做 去 来 到 从 对 把 被 让 给 向 里 上 下 中 前 后 人工智能 机器学习 深度学习 自然语言 处理器 内存 硬盘 操作系统`)
	jaWords = strings.Fields(`私 あなた 彼 彼女 これ それ あれ ここ そこ 今日 明日 昨日 時間 問題 方法 システム データ
		モデル ユーザー サーバー ネットワーク リクエスト レスポンス 計算 結果 ファイル プログラム コード 関数 テスト 性能 速度
		東京 大阪 日本 日本語 英語 翻訳 勉強 仕事 会社 学校 先生 学生 友達 家族 天気 雨 雪 桜 山 川 海 猫 犬 食べる 飲む
		見る 行く 来る する ある いる なる できる 思う 言う 使う 作る 分かる は が を に で と の も や から まで より です ます
		でした ました ません ください しています について ために ような こと もの とき ところ 新しい 古い 大きい 小さい 高い
		早い 遅い 良い 悪い とても 少し たくさん もっと すぐ まだ もう いつも ラーメン コーヒー お茶 ありがとう すみません`)
	koWords = strings.Fields(`나는 너는 그는 우리는 이것은 그것은 오늘 내일 어제 시간 문제 방법 시스템 데이터 모델 사용자
		서버 네트워크 요청 응답 계산 결과 파일 프로그램 코드 함수 테스트 성능 속도 서울 한국 한국어 영어 번역 공부 회사
		학교 선생님 학생 친구 가족 날씨 비 눈 산 바다 고양이 강아지 먹다 마시다 보다 가다 오다 하다 있다 없다 되다 좋다
		나쁘다 크다 작다 많이 조금 아주 정말 빨리 천천히 그리고 하지만 그래서 때문에 감사합니다 안녕하세요 했습니다 합니다`)
	emojis = strings.Fields(`😀 😂 🤣 😊 😍 🤔 😅 😭 🙏 👍 👍🏽 👏 🎉 🔥 ✨ ❤️ 💡 🚀 ✅ ❌ ⚠️ 📈 📉 💰 🌸 🌏 🍜 ☕ 🐱 🐶
		👨‍💻 👩‍🔬 👨‍👩‍👧‍👦 🏳️‍🌈 🇨🇳 🇯🇵 🇰🇷 🇺🇸 😀😀 🎉🎉🎉 👍👍`)
)

// CJKEmoji generates n bytes of Chinese, Japanese and Korean text with
// emoji: sentences of random words (so that long runs of letters do not
// repeat), CJK punctuation, an emoji after some clauses, newlines between
// paragraphs. Chinese and Japanese are written without spaces, so their
// pre-tokens are whole clauses; Korean separates words with spaces. It
// simulates chat in East Asian languages.
func CJKEmoji(n int) string {
	rng := rand.New(rand.NewPCG(21, 22))
	var sb strings.Builder
	for sb.Len() < n {
		lang := rng.IntN(10)
		for range 2 + rng.IntN(4) { // sentences per paragraph
			for c := range 1 + rng.IntN(3) { // clauses per sentence
				if c > 0 {
					sb.WriteString([]string{"，", "、", "，"}[rng.IntN(3)])
				}
				for i := range 2 + rng.IntN(7) {
					switch {
					case lang < 5:
						sb.WriteString(zhWords[rng.IntN(len(zhWords))])
					case lang < 8:
						sb.WriteString(jaWords[rng.IntN(len(jaWords))])
					default:
						if i > 0 {
							sb.WriteByte(' ')
						}
						sb.WriteString(koWords[rng.IntN(len(koWords))])
					}
				}
				if rng.IntN(4) == 0 {
					sb.WriteString(emojis[rng.IntN(len(emojis))])
				}
			}
			sb.WriteString([]string{"。", "。", "！", "？", "。"}[rng.IntN(5)])
			if rng.IntN(6) == 0 {
				sb.WriteString(emojis[rng.IntN(len(emojis))])
			}
		}
		sb.WriteByte('\n')
	}
	return CutRunes(sb.String(), n)
}

// Corpus is one corpus of the counter's benchmarks.
type Corpus struct {
	Name string
	Text string
	// Quadratic is true when tiktoken-go (the quadratic reference) cannot
	// count the whole text in reasonable time.
	Quadratic bool
}

// Bench returns the benchmark corpora: English prose (1 MiB), Go
// source (1 MiB, skipped if GOROOT has no sources), CJK and emoji
// (256 KiB), and one letter repeated (256 KiB: a single pre-token, the
// long-piece path).
func Bench(tb testing.TB) []Corpus {
	tb.Helper()
	cs := []Corpus{{Name: "prose", Text: Prose(1 << 20)}}
	if src, ok := GoSource(1 << 20); ok {
		cs = append(cs, Corpus{Name: "gosource", Text: src})
	} else {
		tb.Logf("no Go sources under %s: Go source corpus left out", runtime.GOROOT())
	}
	return append(cs,
		Corpus{Name: "cjkemoji", Text: CJKEmoji(256 << 10)},
		Corpus{Name: "letter", Text: strings.Repeat("a", 256<<10), Quadratic: true},
	)
}
