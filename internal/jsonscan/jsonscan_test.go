package jsonscan

import (
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
