package relay_test

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relaytest"
)

// A key rotated and a region added while the router serves: the clients
// keep their transport, and us-east keeps what the router learned of it
// (docs/resilience.md quotes the lines between the markers).
func ExampleRouter_Update() {
	east, west := relaytest.NewServer(), relaytest.NewServer()
	defer east.Close()
	defer west.Close()
	oldKey, newKey := "sk-east-2025", "sk-east-2026"
	// README:update
	cfg := relay.Config{Upstreams: []relay.Upstream{
		{Name: "us-east", BaseURL: east.URL, APIKey: oldKey, RPM: 500},
	}}
	r, err := relay.New(cfg)
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: r} // made once: the router stays

	// Later, with requests in flight: a new key, a new region.
	cfg.Upstreams = []relay.Upstream{
		{Name: "us-east", BaseURL: east.URL, APIKey: newKey, RPM: 500}, // same Name: same breaker, limits, latencies
		{Name: "eu-west", BaseURL: west.URL, APIKey: "sk-west-2026", Models: []string{"gpt-4.1-mini"}},
	}
	if err := r.Update(cfg); err != nil {
		panic(err) // New's errors (or ErrNotUpdatable): nothing changed
	}
	resp, err := client.Post(east.URL+"/chat/completions", "application/json",
		strings.NewReader(`{"model":"gpt-4.1","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	for _, s := range r.Stats() {
		fmt.Println(s.Name, s.Requests, s.Breaker)
	}
	// README:end
	fmt.Println("sent with the new key:", east.Requests()[0].Header.Get("Authorization") == "Bearer "+newKey)

	// Output:
	// us-east 1 closed
	// eu-west 0 closed
	// sent with the new key: true
}
