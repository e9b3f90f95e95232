package relay_test

import (
	"fmt"
	"log"
	"net/http"
	"os"
	"strings"

	openai "github.com/sashabaranov/go-openai"

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

// A router under go-openai: the README's "Ten lines with go-openai", compiled
// here (the README quotes the lines between the markers).
func Example_goOpenAI() {
	// README:go-openai
	router, err := relay.New(relay.Config{
		Upstreams: []relay.Upstream{
			{Name: "us-east", BaseURL: "https://us.example.com/v1", APIKey: os.Getenv("US_KEY")},
			{Name: "eu-west", BaseURL: "https://eu.example.com/v1", APIKey: os.Getenv("EU_KEY")},
		},
		Policy: relay.ClusterPolicy{Fast: "gemini-2.5-flash", Cheap: "deepseek-v3.2"},
		OnReport: func(r relay.Report) {
			log.Printf("%s via %s: %d+%d tokens $%.5f in %s", r.Model, r.Upstream,
				r.Usage.PromptTokens, r.Usage.CompletionTokens, r.CostUSD, r.Latency)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	cfg := openai.DefaultConfig("") // the router sets each upstream's key
	cfg.HTTPClient = &http.Client{Transport: router}
	client := openai.NewClientWithConfig(cfg) // use as usual
	// README:end
	_ = client
}
