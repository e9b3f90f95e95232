package relay_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relaytest"
)

// StrategyExpectedCost sends a conversation's next turn where its history
// is cached: the upstream that answered the turn before predicts it
// (docs/routing.md quotes the lines between the markers).
func ExampleStrategyExpectedCost() {
	east, west := relaytest.NewServer(), relaytest.NewServer()
	defer east.Close()
	defer west.Close()
	// README:expected-cost
	r, err := relay.New(relay.Config{
		Strategy: relay.StrategyExpectedCost,
		Upstreams: []relay.Upstream{
			{Name: "east", BaseURL: east.URL}, // OpenAI's caching rules: the zero CacheRules
			{Name: "west", BaseURL: west.URL, Cache: relay.CacheRules{Step: 1024, TTL: time.Hour}},
		},
		OnReport: func(rep relay.Report) {
			fmt.Println(rep.Upstream, "predicted", rep.PredictedCached, "reported", rep.Usage.CachedTokens)
		},
	})
	// README:end
	if err != nil {
		panic(err)
	}
	system := strings.Repeat("Answer from the product notes. ", 300)
	turn := func(question string) *http.Request {
		body := `{"model":"gpt-4.1","messages":[{"role":"system","content":"` + system + `"},{"role":"user","content":"` + question + `"}]}`
		req, _ := http.NewRequest("POST", "https://api.example/v1/chat/completions", strings.NewReader(body))
		return req
	}
	resp, err := r.RoundTrip(turn("First question?"))
	if err != nil {
		panic(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	d, err := r.Decide(turn("Second question?"))
	if err != nil {
		panic(err)
	}
	for _, c := range d.Candidates {
		fmt.Println(c.Upstream, c.PredictedCached)
	}
	// Output:
	// west predicted 0 reported 0
	// west 1024
	// east 0
}
