package relay_test

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/tokenrelay/relay"
)

// A reasoning model beside a chat model: each attempt gets the timeouts of
// its model and upstream, over the global ones, and Decide shows them
// (docs/resilience.md quotes the lines between the markers).
func ExampleTimeouts() {
	// README:timeouts
	r, err := relay.New(relay.Config{
		Upstreams: []relay.Upstream{
			{Name: "openai", BaseURL: "https://api.openai.com/v1"},
			{Name: "azure-eu", BaseURL: "https://eu.example.com/openai/v1",
				Timeouts: relay.Timeouts{Attempt: 20 * time.Second}}, // a slower region
		},
		Retry:  relay.RetryConfig{AttemptTimeout: 10 * time.Second},
		Stream: relay.StreamConfig{FirstTokenTimeout: 3 * time.Second, IdleTimeout: 15 * time.Second},
		ModelTimeouts: map[string]relay.Timeouts{
			// It thinks before its first token: more time, no first-token failover.
			"o3": {Attempt: 5 * time.Minute, FirstToken: -1, Idle: 2 * time.Minute},
		},
	})
	if err != nil {
		panic(err)
	}
	for _, model := range []string{"gpt-4.1-mini", "o3"} {
		body := `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}]}`
		req, _ := http.NewRequest("POST", "https://api.example/v1/chat/completions", strings.NewReader(body))
		d, err := r.Decide(req)
		if err != nil {
			panic(err)
		}
		for _, c := range d.Candidates {
			fmt.Printf("%s on %s: attempt %v, first token %v, idle %v\n",
				c.Model, c.Upstream, c.Timeouts.Attempt, c.Timeouts.FirstToken, c.Timeouts.Idle)
		}
	}
	// README:end

	// Output:
	// gpt-4.1-mini on openai: attempt 10s, first token 3s, idle 15s
	// gpt-4.1-mini on azure-eu: attempt 20s, first token 3s, idle 15s
	// o3 on openai: attempt 5m0s, first token 0s, idle 2m0s
	// o3 on azure-eu: attempt 5m0s, first token 0s, idle 2m0s
}
