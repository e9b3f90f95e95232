// Package relaytest runs a fake OpenAI-compatible API on loopback, for tests
// of code that talks to OpenAI-style upstreams (the relay router, SDK
// clients, gateways).
//
// A Server answers POST /v1/chat/completions, /v1/responses,
// /v1/completions and /v1/embeddings and GET /v1/models and
// /v1/models/{id} (recognised by their exact path, as the real API does, so
// a BaseURL that misses "/v1" or already ends in an endpoint gets a 404) with bodies shaped like the real API's, streams server-sent events
// for "stream": true, and computes usage from the request: prompt tokens are
// counted with tiktoken's o200k_base (chat: OpenAI's published per-message
// formula), completion tokens come from WithCompletionTokens bounded by the
// request's max tokens. Every request is recorded before it is answered.
//
// WithAzure makes it answer the Azure OpenAI API as well, under its root
// (Server.AzureURL): the deployment paths
// (/openai/deployments/{deployment}/chat/completions?api-version=…, the
// deployment recorded as the request's model) and the v1 API
// (/openai/v1/...). WithAPIKey makes it check the key each API wants
// (Authorization: Bearer, or Azure's Api-Key) and answer 401 without it.
//
// Faults make a call misbehave: an error status with headers, a delay, a
// dropped connection, a hang, a slow, stalled, cut or failing stream, usage
// with cached and reasoning tokens, or none. Script queues faults for the
// next calls, in order; SetDefault sets the fault for the calls after them.
//
// Usage:
//
//	srv := relaytest.NewServer(relaytest.WithName("us-east"))
//	defer srv.Close()
//	srv.Script(
//		relaytest.Fault{Status: 429, Header: http.Header{"Retry-After": {"1"}}},
//		relaytest.Fault{Drop: true},
//	) // the third call and later get normal answers
//	cfg := openai.DefaultConfig("sk-test") // github.com/sashabaranov/go-openai
//	cfg.BaseURL = srv.URL
//	client := openai.NewClientWithConfig(cfg)
//	_, err := client.CreateChatCompletion(ctx, req) // a 429 APIError
//	_, err = client.CreateChatCompletion(ctx, req)  // a connection error
//	resp, err := client.CreateChatCompletion(ctx, req)
//	// resp.Choices[0].Message.Content == "Hello from relaytest. Hello from relaytest."
//	// resp.Usage.CompletionTokens == 8
//	for _, r := range srv.Requests() {
//		fmt.Println(r.Path, r.Model, r.Stream)
//	}
//
// Close never waits for hung or stalled calls: it wakes them first and
// aborts their connections.
//
// WithSchedule hands every call to a function of the test's own before it
// is answered, to queue it, slow it or fail it as the test decides (the
// repository's simulated fleet, examples/simulate/simfleet, is built on
// it); PromptTokens counts a request's prompt as a Server does.
//
// A Fleet is a set of named Servers, for tests of routing over several
// upstreams.
//
// Clock is a fake clock to hand to a relay.Router as Config.Clock: the
// router's limits, breakers, backoffs and hedges then follow Clock.Advance
// instead of the wall clock, so a test of a policy or a limit runs at once
// and gives the same result on any machine (see ExampleClock).
package relaytest
