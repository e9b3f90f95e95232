// Command gopenai sends one chat completion through the relay router with
// the go-openai client and prints the answer and the router's report.
//
// Without OPENAI_API_KEY and RELAY_BASE_URL it runs against relaytest, a
// fake OpenAI-compatible server on loopback, so it needs no key and no
// network. With them set it talks to the real endpoint:
//
//	RELAY_BASE_URL=https://api.openai.com/v1 OPENAI_API_KEY=sk-... go run ./examples/gopenai
package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relaytest"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run() error {
	baseURL, key := os.Getenv("RELAY_BASE_URL"), os.Getenv("OPENAI_API_KEY")
	model := os.Getenv("RELAY_MODEL")
	if baseURL == "" && key == "" {
		srv := relaytest.NewServer(relaytest.WithName("fake-us-east"))
		defer srv.Close()
		baseURL = srv.URL
		fmt.Println("no OPENAI_API_KEY or RELAY_BASE_URL: using relaytest's fake server at", baseURL)
	}
	if baseURL == "" {
		baseURL = "https://api.openai.com/v1"
	}
	if model == "" {
		model = "gpt-4.1-mini"
	}

	router, err := relay.New(relay.Config{
		Upstreams: []relay.Upstream{{Name: "primary", BaseURL: baseURL, APIKey: key}},
		OnReport: func(r relay.Report) {
			fmt.Printf("report: model=%s upstream=%s bucket=%s prompt=%d usage=%+v cost=$%.6f priced=%v latency=%s attempts=%d status=%d err=%v\n",
				r.Model, r.Upstream, r.Bucket, r.PromptTokens, r.Usage, r.CostUSD, r.Priced,
				r.Latency.Round(time.Microsecond), r.Attempts, r.StatusCode, r.Err)
		},
	})
	if err != nil {
		return err
	}
	defer router.CloseIdleConnections()

	cfg := openai.DefaultConfig(key)
	cfg.BaseURL = baseURL
	cfg.HTTPClient = &http.Client{Transport: router}
	client := openai.NewClientWithConfig(cfg)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	resp, err := client.CreateChatCompletion(ctx, openai.ChatCompletionRequest{
		Model: model,
		Messages: []openai.ChatCompletionMessage{
			{Role: openai.ChatMessageRoleSystem, Content: "You are terse."},
			{Role: openai.ChatMessageRoleUser, Content: "Say hello in five words."},
		},
	})
	if err != nil {
		return err
	}
	fmt.Printf("answer: %q (via %s, %s prompt tokens counted by the router)\n",
		resp.Choices[0].Message.Content, resp.Header().Get(relay.HeaderUpstream), resp.Header().Get(relay.HeaderPromptTokens))
	return nil
}
