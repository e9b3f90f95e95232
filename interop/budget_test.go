package interop

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	goopenai "github.com/sashabaranov/go-openai"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	. "github.com/tokenrelay/relay"
)

// TestBudgetRefusalThroughSDKs: a refusal is ErrBudgetExceeded through
// go-openai and openai-go, with no upstream call.
func TestBudgetRefusalThroughSDKs(t *testing.T) {
	up := newFakeServer(t)
	r, reps := newTestRouter(t, Config{Prices: map[string]Price{"m": {InputPerMTok: 1e6, OutputPerMTok: 1e6}}, Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}},
		Budgets: []Budget{{Name: "tiny", Limit: 0.5, Window: Window{Every: time.Hour}}}})
	cfg := goopenai.DefaultConfig("")
	cfg.HTTPClient = &http.Client{Transport: r}
	_, err := goopenai.NewClientWithConfig(cfg).CreateChatCompletion(context.Background(), goopenai.ChatCompletionRequest{
		Model: "m", Messages: []goopenai.ChatCompletionMessage{{Role: "user", Content: "hi"}}})
	require.ErrorIs(t, err, ErrBudgetExceeded)
	var rerr *Error
	require.True(t, errors.As(err, &rerr))
	assert.Equal(t, "tiny", rerr.Budget)
	assert.Contains(t, err.Error(), "budget tiny")

	client := openAIGoClient(r)
	_, err = client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model: "m", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	require.ErrorIs(t, err, ErrBudgetExceeded)
	assert.Zero(t, up.Calls(), "no upstream call")
	for _, rep := range reps.all() {
		assert.Equal(t, "tiny", rep.Budget)
		assert.ErrorIs(t, rep.Err, ErrBudgetExceeded)
	}
}
