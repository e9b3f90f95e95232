package jsonscan

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var samples = []string{
	`{"model":"gpt-4o","messages":[{"role":"user","content":"hi \"there\" \\ end"}],"stream":true,"n":2}`,
	`{"a":{"b":[1,2,{"c":"}"}]},"d":null,"e":-1.5e3,"f":"\u00e9\ud83d\ude00"}`,
	`[1, "two", {"three": 3}, [4], true, false, null]`,
	`{ "spaced" :  "value" , "k2" : [ ] }`,
	`{"escaped\"key":1,"x":"a\\\\"}`,
	`{}`, `[]`, `"just a string"`, `42`,
}

// TestEachMatchesGJSON: the members Each finds are gjson's, raw.
func TestEachMatchesGJSON(t *testing.T) {
	for _, s := range samples {
		checkEach(t, s)
	}
}

func checkEach(t *testing.T, s string) {
	t.Helper()
	root := gjson.Parse(s)
	if !root.IsObject() && !root.IsArray() {
		n := 0
		Each(s, 0, func(_, _ string) bool { n++; return true })
		assert.Zero(t, n, s)
		return
	}
	var want, got [][2]string
	root.ForEach(func(k, v gjson.Result) bool {
		key := ""
		if root.IsObject() {
			key = k.Raw[1 : len(k.Raw)-1]
		}
		want = append(want, [2]string{key, v.Raw})
		return true
	})
	Each(s, 0, func(k, v string) bool {
		got = append(got, [2]string{k, v})
		return true
	})
	assert.Equal(t, want, got, s)
	// The same over bytes.
	var gotB [][2]string
	Each([]byte(s), 0, func(k, v []byte) bool {
		gotB = append(gotB, [2]string{string(k), string(v)})
		return true
	})
	assert.Equal(t, got, gotB)
}

func TestFieldPickFindString(t *testing.T) {
	s := samples[0]
	assert.Equal(t, `"gpt-4o"`, Field(s, "model"))
	assert.Equal(t, "", Field(s, "absent"))
	var vals [2]string
	Pick(`{"a":1,"b":2,"a":3}`, []string{"a", "b"}, vals[:])
	assert.Equal(t, [2]string{"3", "2"}, vals, "the last of a repeated key, as decoders do")
	raw, ok := FindString(`{"x":{"delta":"he\"llo"}}`, "delta")
	require.True(t, ok)
	assert.Equal(t, `he\"llo`, raw)
	_, ok = FindString(`{"delta":5}`, "delta")
	assert.False(t, ok)
}

func TestAppendUnescapedMatchesGJSON(t *testing.T) {
	for _, raw := range []string{`caf\u00e9 \ud83d\ude00 \n\t\"\\\/`, `plain`, `\u0041\u00`, `\ud83d alone`, `trailing\`} {
		got := string(AppendUnescaped(nil, raw, 1<<20))
		if gjson.Valid(`"` + raw + `"`) {
			assert.Equal(t, gjson.Parse(`"`+raw+`"`).Str, got, raw)
		} else {
			assert.NotPanics(t, func() { AppendUnescaped(nil, raw, 1<<20) })
		}
	}
	assert.Equal(t, "ab", string(AppendUnescaped(nil, `abcdef`, 2)))
}

func TestValidBoundsDepth(t *testing.T) {
	assert.Equal(t, 2, Depth(`{"a":["[[[[{{{{"]}`))
	assert.True(t, Valid(`{"a":"`+strings.Repeat("[", 2000)+`"}`))
	assert.False(t, Valid(strings.Repeat("[", 600)+strings.Repeat("]", 600)))
	assert.True(t, Valid(strings.Repeat("[", 100)+strings.Repeat("]", 100)))
}

// FuzzEach: on any valid JSON, Each finds gjson's members; on any input it
// never panics.
func FuzzEach(f *testing.F) {
	for _, s := range samples {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		Each(s, 0, func(k, v string) bool { Field(v, "x"); return true })
		FindString(s, "a")
		if Valid(s) {
			checkEach(t, s)
		}
	})
}

// refValid is the definition Valid implements: gjson's validator, and a
// nesting of at most MaxDepth (checked first: gjson recurses per level).
func refValid(s string) bool {
	return Depth(s) <= MaxDepth && gjson.Valid(s)
}

// eachValid is Object with every member's value checked by ValidValue
// and handed to f, raw: the reader that only needs the top level. It
// panics when Object says a name has escapes and it has none, or the
// reverse.
func eachValid(s string, f func(key, val string)) bool {
	return Object(s, func(key string, esc bool, j, depth int) (int, bool) {
		if esc != strings.Contains(key, `\`) {
			panic(fmt.Sprintf("name %q: esc %v", key, esc))
		}
		e, ok := ValidValue(s, j, depth)
		if ok {
			f(key, s[j:e])
		}
		return e, ok
	})
}

// checkEachValid checks eachValid on s, valid (as refValid says) or not: it
// accepts exactly the valid objects, and gives the members Each gives.
func checkEachValid(t *testing.T, s string, valid bool) {
	t.Helper()
	var got, want []string
	ok := eachValid(s, func(k, v string) { got = append(got, k, v) })
	obj := valid && strings.HasPrefix(strings.TrimLeft(s, " \t\r\n"), "{")
	if ok != obj {
		t.Fatalf("eachValid(%q) = %v, want %v", s, ok, obj)
	}
	if !ok {
		return
	}
	Each(s, 0, func(k, v string) bool { want = append(want, k, v); return true })
	if !slices.Equal(got, want) {
		t.Fatalf("eachValid(%q) members %q, Each %q", s, got, want)
	}
}

func TestEachValid(t *testing.T) {
	for _, s := range validCases {
		checkEachValid(t, s, refValid(s))
	}
	var n int
	assert.True(t, eachValid(` {"a" : [1,{"b":2}] , "c\"d":"e" } `, func(k, v string) { n++ }))
	assert.Equal(t, 2, n)
	assert.False(t, eachValid(`{"a":1} x`, func(string, string) {}))
}

// membersValid checks s by reading every object with Members, as a reader
// that picks fields out of nested objects does, and everything else with
// ValidValue.
func membersValid(s string) bool {
	var member func(key string, esc bool, j, depth int) (int, bool)
	member = func(_ string, _ bool, j, depth int) (int, bool) {
		if s[j] == '{' {
			return Members(s, j, depth, member)
		}
		return ValidValue(s, j, depth)
	}
	return Object(s, member)
}

// TestMembers checks that reading objects member by member accepts what
// Valid accepts, the nesting bound included.
func TestMembers(t *testing.T) {
	cases := slices.Clone(validCases)
	for _, n := range []int{MaxDepth - 1, MaxDepth, MaxDepth + 1} {
		cases = append(cases, strings.Repeat(`{"a":`, n-1)+"{}"+strings.Repeat("}", n-1),
			strings.Repeat(`{"a":[`, n/2)+"1"+strings.Repeat("]}", n/2))
	}
	for _, c := range cases {
		obj := strings.HasPrefix(strings.TrimLeft(c, " \t\r\n"), "{")
		if got, want := membersValid(c), obj && refValid(c); got != want {
			t.Errorf("membersValid(%.40q) = %v, want %v", c, got, want)
		}
	}
}

var validCases = []string{
	``, ` `, `{}`, ` {} `, `[]`, `[ ]`, `{ }`, `{"a":1}`, `{"a":1,}`, `{,"a":1}`, `{"a" 1}`, `{"a":}`, `{a:1}`,
	`[1,2]`, `[1,]`, `[,1]`, `[1 2]`, `"x"`, `"x`, `"\"`, `"\\"`, `"\u00e9"`, `"\u00g9"`, `"\u00e"`, `"\x"`, `"\/"`,
	"\"a\tb\"", "\"a\x1fb\"", "\"a\x7fb\"", "\"\xff\xfe\"", `0`, `-0`, `01`, `-`, `-a`, `1.`, `1.5`, `.5`, `1e5`, `1E+5`,
	`1e`, `1e+`, `-1.5e-10`, `+1`, `true`, `tru`, `truex`, `false`, `null`, `nul`, `NaN`, `Infinity`, `[true,false,null]`,
	`{"a":[{"b":{"c":[]}}]}`, `{"a":[}`, `{"a":]}`, `[{]}`, `{"a":{"b":1}}}`, `[[]]]`, `{"a":1}x`, "{\"a\":1}\n\t\r ",
	"\v{}", `{"a":"b"}{}`, `{"a\"b":1}`, `{"\u0061":1}`, `"1234567\"90abcdef\\\\"`, `"12345678901234567890\n"`,
	"\"0123456789abcdef\x00\"", `[-]`, `[1,-2,3e3,0.0]`, `{"a":tru}`, `{"":0}`, "\"\u2028\"",
}

func TestValid(t *testing.T) {
	for _, c := range validCases {
		if got, want := Valid(c), refValid(c); got != want {
			t.Errorf("Valid(%q) = %v, want %v", c, got, want)
		}
		if got, want := Valid([]byte(c)), refValid(c); got != want {
			t.Errorf("Valid([]byte(%q)) = %v, want %v", c, got, want)
		}
	}
}

// TestValidDeep checks the nesting bound without recursion: a million
// levels neither overflow the stack nor pass.
func TestValidDeep(t *testing.T) {
	nest := func(n int, open, close string) string {
		return strings.Repeat(open, n) + strings.Repeat(close, n)
	}
	for _, c := range []struct {
		s    string
		want bool
	}{
		{nest(MaxDepth, "[", "]"), true},
		{nest(MaxDepth+1, "[", "]"), false},
		{nest(MaxDepth-1, `{"a":`, "}") + "", false}, // not closed right: {"a":}
		{`{"a":` + nest(MaxDepth-1, "[", "]") + `}`, true},
		{`{"a":` + nest(MaxDepth, "[", "]") + `}`, false},
		{nest(1_000_000, "[", "]"), false},
		{strings.Repeat("[", 1_000_000), false},
		{strings.Repeat(`{"a":`, 1_000_000), false},
		{`["` + strings.Repeat("[", 10_000) + `"]`, true}, // brackets in a string do not nest
	} {
		if got := Valid(c.s); got != c.want {
			t.Errorf("Valid(%.40q... %d bytes) = %v, want %v", c.s, len(c.s), got, c.want)
		}
	}
	for _, depth := range []int{0, 1, MaxDepth - 1, MaxDepth} {
		end, ok := ValidValue("[[]]", 0, depth)
		if want := depth+2 <= MaxDepth; ok != want || (ok && end != 4) {
			t.Errorf("ValidValue at depth %d = %d, %v", depth, end, ok)
		}
	}
}

// TestSpecial8First checks that the lowest flag special8 raises is the
// first special byte of the word (a quote, a backslash or a byte below
// 0x20), as ValidString relies on: for every byte value at every place,
// after bytes that are not special and before bytes of every kind.
func TestSpecial8First(t *testing.T) {
	kinds := []byte{0, 0x1f, 0x20, '"', '\\', 'a', 0x7f, 0x80, 0xff, '!', '#', '[', ']'}
	special := func(c byte) bool { return c == '"' || c == '\\' || c < 0x20 }
	var w [8]byte
	for p := range 8 {
		for b := range 256 {
			for _, before := range []byte{'a', 0x20, 0x7f, 0xff, '#', ']'} {
				for _, after := range kinds {
					for k := range w {
						switch {
						case k < p:
							w[k] = before
						case k == p:
							w[k] = byte(b)
						default:
							w[k] = after
						}
					}
					want := 8
					for k, c := range w {
						if special(c) {
							want = k
							break
						}
					}
					got := 8 // no flag
					if m := special8(binary.LittleEndian.Uint64(w[:])); m != 0 {
						got = bits.TrailingZeros64(m) >> 3
					}
					require.Equal(t, want, got, "% x", w)
				}
			}
		}
	}
}

// TestSkipSpace holds SkipSpace to a byte loop on runs of every length of
// every white space byte mix, starting anywhere, with and without text
// after them, as strings and as byte slices.
func TestSkipSpace(t *testing.T) {
	ref := func(s string, i int) int {
		for i < len(s) && strings.IndexByte(" \t\n\r", s[i]) >= 0 {
			i++
		}
		return i
	}
	for _, fill := range []string{" ", "\n", " \t", "\r\n  ", "      \n"} {
		for n := range 40 {
			run := strings.Repeat(fill, n+1)[:n]
			for _, after := range []string{"", "x", "\x00", "\"", "\v", "\xa0"} {
				for _, before := range []string{"", "{", "ab"} {
					s := before + run + after
					for i := 0; i <= len(s); i++ {
						require.Equal(t, ref(s, i), SkipSpace(s, i), "%q from %d", s, i)
						require.Equal(t, ref(s, i), SkipSpace([]byte(s), i), "%q from %d", s, i)
					}
				}
			}
		}
	}
}

func TestValidString(t *testing.T) {
	for _, c := range []struct {
		s       string
		end     int
		esc, ok bool
	}{
		{`"abc"`, 5, false, true},
		{`"a\"c"x`, 6, true, true},
		{`"0123456789abcdefghij"`, 22, false, true},
		{`"0123456789\nbcdefghij"`, 23, true, true},
		{`"0123456789abcdefghij`, 21, false, false},
		{"\"0123456789\x01", 11, false, false},
	} {
		end, esc, ok := ValidString(c.s, 0)
		if end != c.end || esc != c.esc || ok != c.ok {
			t.Errorf("ValidString(%q) = %d, %v, %v; want %d, %v, %v", c.s, end, esc, ok, c.end, c.esc, c.ok)
		}
	}
}

func FuzzValid(f *testing.F) {
	for _, c := range validCases {
		f.Add(c)
	}
	f.Add(strings.Repeat("[", 600) + strings.Repeat("]", 600))
	f.Fuzz(func(t *testing.T, s string) {
		want := refValid(s)
		if got := Valid(s); got != want {
			t.Fatalf("Valid(%q) = %v, want %v", s, got, want)
		}
		checkEachValid(t, s, want)
	})
}

func BenchmarkValid(b *testing.B) {
	body := `{"model":"gpt-4.1","messages":[{"role":"system","content":"` + strings.Repeat(`You are a helpful assistant.\n`, 64) +
		`"},{"role":"user","content":"` + strings.Repeat("What is the weather like in Boston today? ", 48) + `"}],"max_tokens":256}`
	b.Run("jsonscan", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if !Valid(body) {
				b.Fatal("invalid")
			}
		}
	})
	b.Run("gjson", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			if !gjson.Valid(body) {
				b.Fatal("invalid")
			}
		}
	})
}

// refValidString is ValidString as it was before it used
// strings.IndexByte: eight bytes at a time while none is a quote, a
// backslash or a control character, then byte by byte.
func refValidString(s string, i int) (end int, esc, ok bool) {
	i++
	for {
		for b := []byte(s); i+8 <= len(b) && special8(binary.LittleEndian.Uint64(b[i:i+8])) == 0; {
			i += 8
		}
		for i < len(s) && s[i] != '"' && s[i] != '\\' && s[i] >= 0x20 {
			i++
		}
		if i >= len(s) {
			return i, esc, false
		}
		switch c := s[i]; {
		case c == '"':
			return i + 1, esc, true
		case c == '\\':
			esc = true
			if i+1 >= len(s) {
				return i + 1, esc, false
			}
			switch s[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(s) || !isHex(s[i+2]) || !isHex(s[i+3]) || !isHex(s[i+4]) || !isHex(s[i+5]) {
					return i, esc, false
				}
				i += 6
			default:
				return i, esc, false
			}
		case c < 0x20:
			return i, esc, false
		}
	}
}

func FuzzValidString(f *testing.F) {
	for _, s := range []string{`"abc"`, `"a\"c"x`, `"0123456789\nbcdefghij"`, "\"0123456789\x01", `"\u12`, `"\u12x4"`, `"ab\\"cd"`,
		`"` + strings.Repeat(`long text without escapes `, 9) + `\"quoted\" \\ \u00e9"`, `"\"`, `"\`, "\"\t\"", `"abc\"\"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if s == "" || s[0] != '"' {
			s = `"` + s
		}
		end, esc, ok := ValidString(s, 0)
		wEnd, wEsc, wOK := refValidString(s, 0)
		if end != wEnd || esc != wEsc || ok != wOK {
			t.Fatalf("ValidString(%q) = %d, %v, %v; the reference gives %d, %v, %v", s, end, esc, ok, wEnd, wEsc, wOK)
		}
	})
}

// BenchmarkValidString checks a member name and 4 KB JSON strings: prose
// without escapes,
// prose with a \n escape every 80 bytes (as chat prompts are), and CJK
// text; "ref" is the eight-bytes-at-a-time scan ValidString replaced.
func BenchmarkValidString(b *testing.B) {
	line := strings.Repeat("the quick brown fox jumps over the lazy dog ", 2)[:78]
	for _, c := range []struct{ name, s string }{
		{"name", `"prompt_tokens_details":{"cached_tokens":0}`},
		{"plain", `"` + strings.Repeat(line+"  ", 52) + `"`},
		{"lines", `"` + strings.Repeat(line+`\n`, 52) + `"`},
		{"cjk", `"` + strings.Repeat("日本語のテキストと絵文字😀", 120) + `"`},
	} {
		for _, f := range []struct {
			name string
			fn   func(string, int) (int, bool, bool)
		}{{"jsonscan", ValidString}, {"ref", refValidString}} {
			b.Run(c.name+"/"+f.name, func(b *testing.B) {
				b.SetBytes(int64(len(c.s)))
				for b.Loop() {
					if _, _, ok := f.fn(c.s, 0); !ok {
						b.Fatal("invalid")
					}
				}
			})
		}
	}
}
