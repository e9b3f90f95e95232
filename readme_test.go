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

// TestReadmeSnippetsAreCompiled: every Go block of the README and of the
// guides in docs/ follows a "<!-- snippet: NAME -->" line and is, to the
// byte, the code between "// README:NAME" and "// README:end" in an
// example*_test.go file (of this module or of a sub-module), which the
// compiler checks; and every such marked snippet is quoted in one of those
// documents.
func TestReadmeSnippetsAreCompiled(t *testing.T) {
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
	guides, err := filepath.Glob("docs/*.md")
	require.NoError(t, err)
	docs := append([]string{"README.md"}, guides...)
	goBlock := regexp.MustCompile("(?s)(<!-- snippet: ([\\w-]+) -->\n)?```go\n(.*?)```\n")
	seen := map[string]bool{}
	for _, doc := range docs {
		text, err := os.ReadFile(doc)
		require.NoError(t, err)
		blocks := goBlock.FindAllStringSubmatch(string(text), -1)
		if doc == "README.md" {
			require.NotEmpty(t, blocks, "the README has no Go block")
		}
		for _, b := range blocks {
			name, code := b[2], b[3]
			if !assert.NotEmpty(t, name, "a Go block of %s is not a compiled snippet:\n%s", doc, code) {
				continue
			}
			want, ok := snippets[name]
			if assert.True(t, ok, "%s quotes %q: no // README:%s in example*_test.go", doc, name, name) {
				assert.Equal(t, want, code, "%s: snippet %q", doc, name)
			}
			seen[name] = true
		}
	}
	for name := range snippets {
		assert.True(t, seen[name], "// README:%s is quoted in neither the README nor docs/*.md", name)
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
