package relay_test

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/tokenrelay/relay"
)

// Decide answers for a request without sending it, so a routing policy can be
// unit-tested in-process.
func ExampleRouter_Decide() {
	r, err := relay.New(relay.Config{
		Upstreams: []relay.Upstream{
			{Name: "flash", BaseURL: "https://flash.example/v1", Models: []string{"gemini-2.5-flash"}},
			{Name: "codex", BaseURL: "https://codex.example/v1", Models: []string{"gpt-5.5-codex"}},
		},
		Policy: relay.ClusterPolicy{Fast: "gemini-2.5-flash"},
	})
	if err != nil {
		panic(err)
	}
	prompt := strings.Repeat("Summarise the diff. ", 30)
	body := `{"model":"gpt-5.5-codex","messages":[{"role":"user","content":"` + prompt + `"}]}`
	req, _ := http.NewRequest("POST", "https://api.example/v1/chat/completions", strings.NewReader(body))
	d, err := r.Decide(req)
	if err != nil {
		panic(err)
	}
	fmt.Println(d.Request.PromptTokens, d.Request.Bucket, d.Route.Model, d.Route.Fallbacks, d.Upstreams)
	// Output: 188 short gemini-2.5-flash [gpt-5.5-codex] [flash codex]
}
