package relay

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReadmeSnippetsAreCompiled: every Go block of the README that follows
// a "<!-- snippet: NAME -->" line is, to the byte, the code between
// "// README:NAME" and "// README:end" in an example*_test.go file (of this
// module or of a sub-module), which the compiler checks; and every Go
// block of the README has such a line.
func TestReadmeSnippetsAreCompiled(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	files, err := filepath.Glob("example*_test.go")
	require.NoError(t, err)
	more, err := filepath.Glob("*/example*_test.go") // the sub-modules'
	require.NoError(t, err)
	files = append(files, more...)
	snippets := map[string]string{}
	marked := regexp.MustCompile(`(?s)\n[ \t]*// README:([\w-]+)\n(.*?)\n[ \t]*// README:end\n`)
	for _, f := range files {
		src, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range marked.FindAllStringSubmatch(string(src), -1) {
			snippets[m[1]] = dedent(m[2])
		}
	}
	blocks := regexp.MustCompile("(?s)(<!-- snippet: ([\\w-]+) -->\n)?```go\n(.*?)```\n").FindAllStringSubmatch(string(readme), -1)
	require.NotEmpty(t, blocks)
	seen := map[string]bool{}
	for _, b := range blocks {
		name, code := b[2], b[3]
		if !assert.NotEmpty(t, name, "a Go block of the README is not a compiled snippet:\n%s", code) {
			continue
		}
		want, ok := snippets[name]
		if assert.True(t, ok, "no // README:%s in example*_test.go", name) {
			assert.Equal(t, want, code, "README snippet %q", name)
		}
		seen[name] = true
	}
	for name := range snippets {
		assert.True(t, seen[name], "// README:%s is not quoted in the README", name)
	}
}

// dedent removes the indentation of the first line from every line.
func dedent(s string) string {
	lines := strings.Split(s, "\n")
	indent := lines[0][:len(lines[0])-len(strings.TrimLeft(lines[0], "\t"))]
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, indent)
	}
	return strings.Join(lines, "\n") + "\n"
}
