package tokens

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestForModel(t *testing.T) {
	for model, want := range map[string]Encoding{
		"gpt-4o": O200K, "gpt-4.1": O200K, "gpt-5": O200K, "o3-mini": O200K, "claude-sonnet-4.5": O200K, "": O200K,
		"gpt-4": CL100K, "gpt-4-turbo": CL100K, "gpt-3.5-turbo": CL100K, "text-embedding-3-small": CL100K, "openai/gpt-4": CL100K,
	} {
		assert.Equal(t, want, ForModel(model), model)
	}
	assert.Equal(t, "o200k_base", O200K.String())
	assert.Equal(t, "cl100k_base", CL100K.String())
}

// TestSafeCutsAddUp: cutting at every position the rule accepts keeps the
// count, in both encodings.
func TestSafeCutsAddUp(t *testing.T) {
	for _, text := range []string{
		"The quick brown fox, again. And again!\n\nNew paragraph: 3.14 and example.com/path",
		"你好，世界。東京は晴れです。 mixed words 123 456",
		"func add(a, b int) int {\n\treturn a + b // adds\n}\n",
		"don't won't I'll  spaced   out\r\n\r\nend",
	} {
		for _, enc := range []Encoding{O200K, CL100K} {
			sum, last := 0, 0
			for p := 1; p < len(text); p++ {
				if SafeAt(text, p) {
					sum += enc.Count(text[last:p])
					last = p
				}
			}
			sum += enc.Count(text[last:])
			assert.Equal(t, enc.Count(text), sum, "%s %q", enc, text)
		}
	}
	assert.Zero(t, O200K.Count(""))
}
