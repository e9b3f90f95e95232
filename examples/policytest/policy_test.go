package policytest

import (
	"net/http"
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
	cases := []struct {
		name      string
		words     int
		model     string
		bucket    string
		upstreams []string
	}{
		{"tiny prompt stays", 10, "gpt-5.5-codex", "short", []string{"codex-us", "codex-eu"}},
		{"hot window goes fast", 150, "gemini-2.5-flash", "short", []string{"flash", "codex-us", "codex-eu"}},
		{"mid goes cheap", 500, "deepseek-v3.2", "mid", []string{"deepseek", "codex-us", "codex-eu"}},
		{"long stays", 2000, "gpt-5.5-codex", "long", []string{"codex-us", "codex-eu"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := r.Decide(chat(c.words))
			if err != nil {
				t.Fatal(err)
			}
			if d.Route.Model != c.model || d.Request.Bucket != c.bucket || strings.Join(d.Upstreams, ",") != strings.Join(c.upstreams, ",") {
				t.Errorf("%d words (%d tokens): got model %s bucket %s upstreams %v; want %s %s %v",
					c.words, d.Request.PromptTokens, d.Route.Model, d.Request.Bucket, d.Upstreams, c.model, c.bucket, c.upstreams)
			}
		})
	}
}
