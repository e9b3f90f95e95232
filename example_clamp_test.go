package relay_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"strings"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relaytest"
)

// With the clamp on, a request its budget cannot pay for at its
// max_tokens goes out with the max_tokens what is left pays for, and the
// report says so (docs/budgets.md quotes the lines between the markers).
func ExampleClampConfig() {
	srv := relaytest.NewServer() // a fake OpenAI-compatible upstream on loopback
	defer srv.Close()
	// README:clamp
	router, err := relay.New(relay.Config{
		Upstreams: []relay.Upstream{{Name: "main", BaseURL: srv.URL}},
		Prices:    map[string]relay.Price{"gpt-4.1": {InputPerMTok: 2, OutputPerMTok: 8}},
		Budgets:   []relay.Budget{{Name: "team", Limit: 0.01, Window: relay.Window{Calendar: relay.Day}}},
		Clamp:     relay.ClampConfig{MaxTokens: true}, // shorten instead of refusing
		OnReport: func(rep relay.Report) {
			if c := rep.Clamp; c.Reason != "" {
				fmt.Printf("max_tokens %d -> %d (%s %s)\n", c.From, c.To, c.Reason, c.Budget)
			}
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, maxTokens := range []int{100, 2000} { // a worst case of $0.0008, then $0.016
		body := fmt.Sprintf(`{"model":"gpt-4.1","max_tokens":%d,"messages":[{"role":"user","content":"hi"}]}`, maxTokens)
		req, _ := http.NewRequest("POST", srv.URL+"/chat/completions", strings.NewReader(body))
		resp, err := router.RoundTrip(req)
		if err != nil {
			log.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		fmt.Println("sent:", resp.Status)
	}
	// README:end

	// Output:
	// sent: 200 OK
	// max_tokens 2000 -> 1238 (budget team)
	// sent: 200 OK
}
