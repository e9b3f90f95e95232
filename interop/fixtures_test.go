package interop

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	goopenai "github.com/sashabaranov/go-openai"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	. "github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relaytest"
)

// TestErrorFixturesThroughGoOpenAI serves every recorded API error through
// the router with one attempt: go-openai parses the error, with the
// upstream's status and message.
func TestErrorFixturesThroughGoOpenAI(t *testing.T) {
	files, err := filepath.Glob("testdata/openai-wire/error_*.json")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			var fx struct { // the shape of openai-wire/error_*.json
				Status  int               `json:"status"`
				Headers map[string]string `json:"headers"`
				Body    json.RawMessage   `json:"body"`
			}
			require.NoError(t, json.Unmarshal(fixture(t, filepath.Base(file)), &fx))
			srv := newFakeServer(t)
			header := http.Header{}
			for k, v := range fx.Headers {
				header.Set(k, v)
			}
			srv.SetDefault(relaytest.Fault{Status: fx.Status, Header: header, Body: string(fx.Body), ContentType: "application/json"})
			r, _ := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL}}, Retry: RetryConfig{MaxAttempts: 1}})
			cfg := goopenai.DefaultConfig("sk-caller")
			cfg.BaseURL = "http://relay.invalid/v1"
			cfg.HTTPClient = &http.Client{Transport: r}
			_, err = goopenai.NewClientWithConfig(cfg).CreateChatCompletion(context.Background(), goopenai.ChatCompletionRequest{
				Model: "gpt-4o", Messages: []goopenai.ChatCompletionMessage{{Role: "user", Content: "x"}},
			})
			var apiErr *goopenai.APIError
			require.ErrorAs(t, err, &apiErr)
			assert.Equal(t, fx.Status, apiErr.HTTPStatusCode)
			var want struct {
				Error struct{ Message string } `json:"error"`
			}
			require.NoError(t, json.Unmarshal(fx.Body, &want))
			assert.Equal(t, want.Error.Message, apiErr.Message)
		})
	}
}

// TestContextWindowThroughGoOpenAI: a prompt that fits no model's window
// is ErrContextWindow through go-openai, with no upstream call.
func TestContextWindowThroughGoOpenAI(t *testing.T) {
	up := newFakeServer(t)
	r, reps := newTestRouter(t, Config{
		Prices:    map[string]Price{"small": {InputPerMTok: 1, OutputPerMTok: 1, MaxInputTokens: 100, MaxOutputTokens: 50}},
		Upstreams: []Upstream{{Name: "small", BaseURL: up.URL, Models: []string{"small"}}},
	})
	cfg := goopenai.DefaultConfig("")
	cfg.HTTPClient = &http.Client{Transport: r}
	_, err := goopenai.NewClientWithConfig(cfg).CreateChatCompletion(context.Background(), goopenai.ChatCompletionRequest{
		Model: "small", Messages: []goopenai.ChatCompletionMessage{{Role: "user", Content: strings.Repeat("word ", 20000)}}})
	require.ErrorIs(t, err, ErrContextWindow)
	assert.Zero(t, up.Calls(), "no upstream call")
	require.Len(t, reps.all(), 1)
	assert.ErrorIs(t, reps.all()[0].Err, ErrContextWindow)
}
