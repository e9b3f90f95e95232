package relay

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
)

// BenchmarkClamp measures the clamp's cost on the router's own path (a
// Base that answers from memory): a 4 KiB chat request that fits its
// model's window with the clamp off ("off") and on ("on-fits": the check
// alone), and one whose max_tokens is over the window, clamped and
// rewritten in the body ("on-clamped"). Compare the sub-benchmarks of one
// run.
func BenchmarkClamp(b *testing.B) {
	answer := fixture(b, "chat_response_default.json")
	base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		io.Copy(io.Discard, req.Body)
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
			Body: io.NopCloser(bytes.NewReader(answer)), ContentLength: int64(len(answer)), Request: req}, nil
	})
	prices := map[string]Price{"gpt-4.1": {InputPerMTok: 2, OutputPerMTok: 8, MaxInputTokens: 1 << 20, MaxOutputTokens: 1000}}
	router := func(clamp bool) *Router {
		r, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://mem/v1"}}, Base: base, Prices: prices,
			Clamp: ClampConfig{MaxTokens: clamp}})
		if err != nil {
			b.Fatal(err)
		}
		return r
	}
	prompt := benchPrompt(4 << 10)
	body := func(maxTokens string) string {
		return `{"model":"gpt-4.1","max_tokens":` + maxTokens + `,"messages":[{"role":"user","content":"` + prompt + `"}]}`
	}
	run := func(r *Router, body string) func(*testing.B) {
		return func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(body))
				resp, err := r.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
	}
	b.Run("off", run(router(false), body("500")))
	b.Run("on-fits", run(router(true), body("500")))
	b.Run("on-clamped", run(router(true), body("5000")))
}
