// Package policytest shows how to unit-test a routing policy in-process:
// build the Router you run in production, hand Router.Decide the requests
// your service sends, and assert the route. Decide needs no network, takes
// no rate-limit tokens and leaves the request body readable.
package policytest

import "github.com/tokenrelay/relay"

// NewRouter is the production configuration under test: prompts in the
// 80–260-token window go to the fast model, mid-size prompts to the cheap
// one, long prompts stay on the flagship.
func NewRouter() (*relay.Router, error) {
	return relay.New(relay.Config{
		Upstreams: []relay.Upstream{
			{Name: "flash", BaseURL: "https://flash.example/v1", Models: []string{"gemini-2.5-flash"}},
			{Name: "deepseek", BaseURL: "https://deepseek.example/v1", Models: []string{"deepseek-v3.2"}},
			{Name: "codex-us", BaseURL: "https://us.codex.example/v1", Models: []string{"gpt-5.5-codex"}},
			{Name: "codex-eu", BaseURL: "https://eu.codex.example/v1", Models: []string{"gpt-5.5-codex"}},
		},
		Policy: relay.ClusterPolicy{Fast: "gemini-2.5-flash", Cheap: "deepseek-v3.2"},
	})
}
