package policytest

import (
	"net/http"
	"slices"
	"strings"
	"testing"
)

func chat(words int) *http.Request {
	body := `{"model":"gpt-5.5-codex","messages":[{"role":"user","content":"` + strings.Repeat("word ", words) + `"}]}`
	req, _ := http.NewRequest("POST", "https://api.example/v1/chat/completions", strings.NewReader(body))
	return req
}

func TestPolicy(t *testing.T) {
	r, err := NewRouter()
	if err != nil {
		t.Fatal(err)
	}
	codex := []string{"codex-eu", "codex-us"}
	cases := []struct {
		name   string
		words  int
		model  string
		bucket string
		first  string // the route's own upstream; "" when the codex regions come first
	}{
		{"tiny prompt stays", 10, "gpt-5.5-codex", "short", ""},
		{"hot window goes fast", 150, "gemini-2.5-flash", "short", "flash"},
		{"mid goes cheap", 500, "deepseek-v3.2", "mid", "deepseek"},
		{"long stays", 2000, "gpt-5.5-codex", "long", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := r.Decide(chat(c.words))
			if err != nil {
				t.Fatal(err)
			}
			if d.Route.Model != c.model || d.Request.Bucket != c.bucket {
				t.Errorf("%d words (%d tokens): got model %s bucket %s; want %s %s",
					c.words, d.Request.PromptTokens, d.Route.Model, d.Request.Bucket, c.model, c.bucket)
			}
			// The codex regions follow (or lead) in the order the prompt's
			// affinity key ranks them; which one leads is the hash's choice.
			rest := d.Upstreams
			if c.first != "" {
				if len(rest) == 0 || rest[0] != c.first {
					t.Fatalf("upstreams %v: want %s first", d.Upstreams, c.first)
				}
				rest = rest[1:]
			}
			got := slices.Sorted(slices.Values(rest))
			if !slices.Equal(got, codex) {
				t.Errorf("upstreams %v: want %s then the codex regions", d.Upstreams, c.first)
			}
		})
	}
}
