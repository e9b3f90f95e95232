// Package interop holds relay's tests against the OpenAI SDKs (go-openai
// and openai-go) and its benchmarks against peer libraries (tiktoken-go,
// tiktoken-go/tokenizer, failsafe-go, go-retryablehttp). It is a module of
// its own so that the core module requires none of them: an application
// that imports relay keeps the versions of these libraries it chose.
//
// It has no code of its own; run it with the other modules of the
// workspace:
//
//	go test ./interop/...
package interop
