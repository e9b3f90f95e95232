package relay

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
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

// TestReadmeConfigTable: the README's configuration tables list every field
// of Config (and of its nested settings: Retry.MaxAttempts, Breaker.P99...)
// and of Upstream, each in a row's first cell with a default beside it.
func TestReadmeConfigTable(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	section := regexp.MustCompile(`(?s)\n## Configuration\n(.*?)\n## `).FindSubmatch(readme)
	require.NotNil(t, section, "the README has no section \"## Configuration\"")
	listed := map[string]bool{}
	name := regexp.MustCompile("`([\\w.]+)`")
	for _, line := range strings.Split(string(section[1]), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || strings.HasPrefix(cells[1], "---") {
			continue
		}
		if !assert.NotEmpty(t, strings.TrimSpace(cells[2]), "README row without a default: %s", line) {
			continue
		}
		prefix := ""
		for _, m := range name.FindAllStringSubmatch(cells[1], -1) {
			if parent, _, ok := strings.Cut(m[1], "."); ok {
				prefix = parent + "."
				listed[m[1]] = true
				continue
			}
			listed[prefix+m[1]] = true
		}
	}
	var want []string
	for _, typ := range []reflect.Type{reflect.TypeFor[Config](), reflect.TypeFor[Upstream]()} {
		for f := range typ.Fields() {
			ft := f.Type
			if ft.Kind() == reflect.Struct && (strings.HasSuffix(ft.Name(), "Config") || ft.Name() == "Buckets" || ft.Name() == "Limits") {
				for sub := range ft.Fields() {
					want = append(want, f.Name+"."+sub.Name)
				}
				continue
			}
			want = append(want, f.Name)
		}
	}
	for _, w := range want {
		assert.True(t, listed[w], "the README's configuration tables do not list %s", w)
	}
}

// TestReadmeErrorsTable: the README's "When things go wrong" has a row for
// every exported sentinel error of the package (every package-level Err...
// variable), saying when it comes and what to do.
func TestReadmeErrorsTable(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	section := regexp.MustCompile(`(?s)\n## When things go wrong\n(.*?)\n## `).FindSubmatch(readme)
	require.NotNil(t, section, "the README has no section \"## When things go wrong\"")
	rows := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(Err\\w+)` \\|[^|]+\\|[^|]*\\w[^|]*\\|$").FindAllSubmatch(section[1], -1) {
		rows[string(m[1])] = true
	}
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	var sentinels []string
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		for _, decl := range file.Decls {
			if gd, ok := decl.(*ast.GenDecl); ok && gd.Tok == token.VAR {
				for _, spec := range gd.Specs {
					for _, id := range spec.(*ast.ValueSpec).Names {
						if strings.HasPrefix(id.Name, "Err") {
							sentinels = append(sentinels, id.Name)
						}
					}
				}
			}
		}
	}
	require.NotEmpty(t, sentinels)
	for _, s := range sentinels {
		assert.True(t, rows[s], "the README's \"When things go wrong\" has no row for %s", s)
	}
}
