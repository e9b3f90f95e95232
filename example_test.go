package relay_test

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"strings"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relaytest"
)

// Decide answers for a request without sending it, so a routing policy can be
// unit-tested in-process (docs/testing.md quotes the lines between the
// markers).
func ExampleRouter_Decide() {
	// README:decide
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
	// README:end

	// Output: 188 short gemini-2.5-flash [gpt-5.5-codex] [flash codex]
}

// A per-team daily budget: each request reserves its worst case before it
// goes out and settles its actual cost when it is done; a request that does
// not fit is refused with ErrBudgetExceeded, without an upstream call.
func ExampleBudget() {
	srv := relaytest.NewServer() // a fake OpenAI-compatible upstream on loopback
	defer srv.Close()
	// README:budgets
	router, err := relay.New(relay.Config{
		Upstreams: []relay.Upstream{{Name: "main", BaseURL: srv.URL}},
		Prices:    map[string]relay.Price{"gpt-4.1": {InputPerMTok: 2, OutputPerMTok: 8}},
		Budgets: []relay.Budget{{
			Name:   "team",
			Scope:  relay.PerHeader("X-Relay-Budget"), // one ledger per team
			Limit:  0.01,                              // USD a day
			Window: relay.Window{Calendar: relay.Day},
		}},
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, maxTokens := range []int{100, 2000} { // a worst case of $0.0008, then $0.016
		body := fmt.Sprintf(`{"model":"gpt-4.1","max_tokens":%d,"messages":[{"role":"user","content":"hi"}]}`, maxTokens)
		req, _ := http.NewRequest("POST", srv.URL+"/chat/completions", strings.NewReader(body))
		req.Header.Set("X-Relay-Budget", "team-a")
		resp, err := router.RoundTrip(req)
		if errors.Is(err, relay.ErrBudgetExceeded) {
			fmt.Println("refused:", err)
			continue
		}
		if err != nil {
			log.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body) // the report, and the settlement, come at the end of the body
		resp.Body.Close()
		fmt.Println("sent:", resp.Status)
	}
	for _, s := range router.Spend() {
		fmt.Printf("%s %s: spent $%.6f of $%.2f\n", s.Budget, s.Key, s.Spent, s.Limit)
	}
	// README:end

	// Output:
	// sent: 200 OK
	// refused: relay: admit model gpt-4.1 budget team: budget exceeded
	// team team-a: spent $0.000080 of $0.01
}

// An answer a content filter stopped is retried on a fallback model, and
// the report says so (docs/resilience.md quotes the lines between the
// markers).
func ExampleRetryConfig_badAnswerFallbacks() {
	azure, openai := relaytest.NewServer(), relaytest.NewServer() // fake upstreams on loopback
	defer azure.Close()
	defer openai.Close()
	azure.Script(relaytest.Fault{ContentFilter: true})
	azureURL, openaiURL := azure.URL, openai.URL
	// README:bad-answer
	router, err := relay.New(relay.Config{
		Upstreams: []relay.Upstream{
			{Name: "azure", BaseURL: azureURL, Models: []string{"gpt-4.1"}},
			{Name: "openai", BaseURL: openaiURL, Models: []string{"gpt-4o"}},
		},
		Retry: relay.RetryConfig{BadAnswerFallbacks: []string{"gpt-4o"}},
		OnReport: func(r relay.Report) {
			if r.BadAnswer != "" {
				fmt.Printf("%s answer set aside; %s answered\n", r.BadAnswer, r.Model)
			}
		},
	})
	// README:end
	if err != nil {
		log.Fatal(err)
	}
	body := `{"model":"gpt-4.1","messages":[{"role":"user","content":"hi"}]}`
	req, _ := http.NewRequest("POST", azureURL+"/chat/completions", strings.NewReader(body))
	resp, err := router.RoundTrip(req)
	if err != nil {
		log.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	fmt.Println(resp.Header.Get(relay.HeaderModel))

	// Output:
	// content_filter answer set aside; gpt-4o answered
	// gpt-4o
}
