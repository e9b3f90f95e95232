package interop

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	goopenai "github.com/sashabaranov/go-openai"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	. "github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relaytest"
)

// TestGoOpenAIRetriesAndFailover: go-openai's call succeeds after the
// router retried a 429 and failed over a 503; when every attempt is rate
// limited, go-openai gets the last 429 as its APIError.
func TestGoOpenAIRetriesAndFailover(t *testing.T) {
	srvs := newServers(t, 2)
	srvs[0].Script(relaytest.Fault{Status: 429, Header: http.Header{"Retry-After-Ms": {"5"}}})
	srvs[1].Script(relaytest.Fault{Status: 503})
	clock := newTestClock()
	clock.jump = true // every wait ends at once
	r, reps := newTestRouter(t, Config{Clock: clock, Retry: RetryConfig{RandomizationFactor: -1},
		Upstreams: []Upstream{{Name: "u0", BaseURL: srvs[0].URL}, {Name: "u1", BaseURL: srvs[1].URL}}})
	cfg := goopenai.DefaultConfig("sk-caller")
	cfg.BaseURL = "http://relay.invalid/v1"
	cfg.HTTPClient = &http.Client{Transport: r}
	client := goopenai.NewClientWithConfig(cfg)
	resp, err := client.CreateChatCompletion(context.Background(), goopenai.ChatCompletionRequest{
		Model: "gpt-4.1", Messages: []goopenai.ChatCompletionMessage{{Role: "user", Content: "hi"}},
	})
	require.NoError(t, err)
	assert.Equal(t, "u0", resp.Header().Get(HeaderUpstream))
	assert.Equal(t, 3, reps.all()[0].Attempts)

	// When every attempt is rate limited, go-openai gets the 429 as its APIError.
	for _, s := range srvs {
		s.SetDefault(relaytest.Fault{Status: 429})
	}
	_, err = client.CreateChatCompletion(context.Background(), goopenai.ChatCompletionRequest{
		Model: "gpt-4.1", Messages: []goopenai.ChatCompletionMessage{{Role: "user", Content: "hi"}},
	})
	var apiErr *goopenai.APIError
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, 429, apiErr.HTTPStatusCode)
	assert.Equal(t, "rate_limit_exceeded", fmt.Sprint(apiErr.Code))
}
