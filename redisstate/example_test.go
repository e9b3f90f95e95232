package redisstate_test

import (
	"context"
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
	ctx := context.Background()
	// README:redisstate
	client := redis.NewClient(&redis.Options{
		Addr:                  os.Getenv("REDIS_ADDR"),
		ContextTimeoutEnabled: true, // deadlines reach the connection
		DialerRetries:         1,    // a refused connection fails at once
		PoolSize:              128,  // a connection for each caller that may wait on one
		MinIdleConns:          32,   // opened by Load, before traffic
	})
	state := redisstate.New(client, redisstate.WithPrefix("checkout"))
	if err := state.Load(ctx); err != nil { // loads the scripts, opens the connections
		log.Fatal(err)
	}
	router, err := relay.New(relay.Config{
		Upstreams: upstreams,
		State:     state,
		Replicas:  8, // at least the number of replicas: each one's share while Redis does not answer
	})
	if err != nil {
		log.Fatal(err)
	}
	httpClient := &http.Client{Transport: router} // give it to any OpenAI-compatible SDK
	// README:end
	defer client.Close()
	_ = httpClient
}
