package interop_test

import (
	"log"
	"net/http"
	"os"

	openai "github.com/sashabaranov/go-openai"

	"github.com/tokenrelay/relay"
)

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
	// The router sends each call to its upstream's BaseURL, whatever the
	// client's: a base URL of its own makes errors name the router.
	cfg.BaseURL = "http://relay.local/v1"
	cfg.HTTPClient = &http.Client{Transport: router}
	client := openai.NewClientWithConfig(cfg) // use as usual
	// README:end
	_ = client
}
