package redisstate_test

import (
	"log"
	"net/http"
	"os"

	"github.com/redis/go-redis/v9"
	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/redisstate"
)

// Eight replicas of a service share their upstreams' limits, holds,
// circuits and budgets on one Redis.
func ExampleNew() {
	upstreams := []relay.Upstream{
		{Name: "us-east", BaseURL: "https://us.example.com/v1", APIKey: os.Getenv("US_KEY"), RPM: 600, TPM: 400_000},
	}
	// README:redisstate
	client := redis.NewClient(&redis.Options{
		Addr:                  os.Getenv("REDIS_ADDR"),
		ContextTimeoutEnabled: true, // deadlines reach the connection
		DialerRetries:         1,    // a refused connection fails at once
	})
	router, err := relay.New(relay.Config{
		Upstreams: upstreams,
		State:     redisstate.New(client, redisstate.WithPrefix("checkout")),
		Replicas:  8, // while Redis is unreachable, each keeps to 1/8 of RPM and TPM
	})
	if err != nil {
		log.Fatal(err)
	}
	httpClient := &http.Client{Transport: router} // give it to any OpenAI-compatible SDK
	// README:end
	defer client.Close()
	_ = httpClient
}
