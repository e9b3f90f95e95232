package interop

import (
	"context"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	. "github.com/tokenrelay/relay"
)

// TestServiceTierThroughOpenAIGo: a chat openai-go sends with service_tier
// "flex" is charged at gpt-5's flex rates when the answer names no tier (a
// stream whose chunks carry none), and at the standard rates when the
// answer says it was served at "default".
func TestServiceTierThroughOpenAIGo(t *testing.T) {
	up := newFakeServer(t)
	gpt5 := DefaultPrices()["gpt-5"]
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}}})
	client := openAIGoClient(r)
	params := openai.ChatCompletionNewParams{
		Model: "gpt-5", ServiceTier: openai.ChatCompletionNewParamsServiceTierFlex,
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	}
	stream := client.Chat.Completions.NewStreaming(context.Background(), params)
	for stream.Next() {
	}
	require.NoError(t, stream.Err())
	require.NoError(t, stream.Close())

	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{}
	resp, err := client.Chat.Completions.New(context.Background(), params)
	require.NoError(t, err)
	assert.EqualValues(t, "default", resp.ServiceTier)

	list := reps.all()
	require.Len(t, list, 2)
	for i, want := range []struct{ reported, charged string }{{"", "flex"}, {"default", "default"}} {
		rep := list[i]
		assert.Equal(t, want.reported, rep.Usage.ServiceTier, "report %d", i)
		require.Positive(t, rep.Usage.PromptTokens+rep.Usage.CompletionTokens)
		u := rep.Usage
		u.ServiceTier = want.charged
		assert.InDelta(t, gpt5.Cost(u), rep.CostUSD, 1e-15, "report %d at %s rates", i, want.charged)
		u.ServiceTier = ""
		flexCost := gpt5.Cost(Usage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, CachedTokens: u.CachedTokens, ServiceTier: "flex"})
		assert.InDelta(t, gpt5.Cost(u)/2, flexCost, 1e-15, "flex is half the standard rates")
	}
}
