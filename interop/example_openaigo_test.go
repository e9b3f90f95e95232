package interop_test

import (
	"log"
	"net/http"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tokenrelay/relay"
)

// A router under openai-go, as the README shows it.
func Example_openAIGo() {
	router, err := relay.New(relay.Config{Upstreams: []relay.Upstream{{Name: "us-east", BaseURL: "https://us.example.com/v1"}}})
	if err != nil {
		log.Fatal(err)
	}
	// README:openai-go
	client := openai.NewClient(
		option.WithHTTPClient(&http.Client{Transport: router}),
		option.WithMaxRetries(0), // the router retries, on other upstreams
	)
	// README:end
	_ = client
}
