package relay_test

import (
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/tokenrelay/relay"
)

// One model under three names: gpt-4.1 at OpenAI, a deployment on Azure,
// openai/gpt-4.1 on OpenRouter (docs/routing.md quotes the lines between
// the markers).
func ExampleUpstream_modelNames() {
	// README:model-names
	r, err := relay.New(relay.Config{
		Upstreams: []relay.Upstream{
			{Name: "openai", BaseURL: "https://api.openai.com/v1", APIKey: os.Getenv("OPENAI_API_KEY")},
			{
				Name:       "azure-eu",
				BaseURL:    "https://contoso-eu.openai.azure.com", // the resource endpoint
				APIKey:     os.Getenv("AZURE_OPENAI_API_KEY"),     // sent as Api-Key
				Azure:      &relay.AzureConfig{APIVersion: "2024-10-21"},
				Models:     []string{"gpt-4.1", "gpt-4o-mini"},
				ModelNames: map[string]string{"gpt-4.1": "prod-gpt41", "gpt-4o-mini": "mini"}, // deployments
			},
			{
				Name:       "openrouter",
				BaseURL:    "https://openrouter.ai/api/v1",
				APIKey:     os.Getenv("OPENROUTER_API_KEY"),
				Models:     []string{"gpt-4.1"},
				ModelNames: map[string]string{"gpt-4.1": "openai/gpt-4.1"},
			},
		},
		Strategy: relay.StrategyPriority, // in this order
	})
	if err != nil {
		panic(err)
	}
	body := `{"model":"gpt-4.1","messages":[{"role":"user","content":"Hi"}]}`
	req, _ := http.NewRequest("POST", "https://relay.local/v1/chat/completions", strings.NewReader(body))
	d, err := r.Decide(req)
	if err != nil {
		panic(err)
	}
	for _, c := range d.Candidates {
		fmt.Println(c.Model, c.Upstream, c.UpstreamModel)
	}
	// README:end

	// Output:
	// gpt-4.1 openai gpt-4.1
	// gpt-4.1 azure-eu prod-gpt41
	// gpt-4.1 openrouter openai/gpt-4.1
}
