package interop

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
	goopenai "github.com/sashabaranov/go-openai"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	. "github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relaytest"
)

// TestClampThroughSDKs: with Config.Clamp, a limit larger than the model's
// output window (50) goes out as 50 in the field each SDK wrote: go-openai's
// max_tokens and max_completion_tokens, plain and streamed; openai-go's
// max_completion_tokens (streamed) and Responses' max_output_tokens
// (streamed). The upstream answers within it, the SDKs parse the answers,
// and every report says what was clamped.
func TestClampThroughSDKs(t *testing.T) {
	up := newFakeServer(t, relaytest.WithCompletionTokens(100)) // answers with the smaller of 100 and the limit
	r, reps := newTestRouter(t, Config{Clamp: ClampConfig{MaxTokens: true},
		Prices:    map[string]Price{"small": {InputPerMTok: 1, OutputPerMTok: 1, MaxInputTokens: 1000, MaxOutputTokens: 50}},
		Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}}})
	ctx := context.Background()
	goClient := goOpenAIClient(r)
	msgs := []goopenai.ChatCompletionMessage{{Role: "user", Content: "hi"}}

	resp, err := goClient.CreateChatCompletion(ctx, goopenai.ChatCompletionRequest{Model: "small", Messages: msgs, MaxTokens: 500})
	require.NoError(t, err)
	assert.Equal(t, 50, resp.Usage.CompletionTokens)
	resp, err = goClient.CreateChatCompletion(ctx, goopenai.ChatCompletionRequest{Model: "small", Messages: msgs, MaxCompletionTokens: 500})
	require.NoError(t, err)
	assert.Equal(t, 50, resp.Usage.CompletionTokens)

	st, err := goClient.CreateChatCompletionStream(ctx, goopenai.ChatCompletionRequest{Model: "small", Messages: msgs, MaxTokens: 500, Stream: true})
	require.NoError(t, err)
	_, err = recvAll(st)
	require.NoError(t, err)

	client := openAIGoClient(r)
	cs := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "small",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxCompletionTokens: openai.Int(500)})
	for cs.Next() {
	}
	require.NoError(t, cs.Err())
	cs.Close()

	params := responsesParams("hi")
	params.Model, params.MaxOutputTokens = "small", openai.Int(500)
	rs := client.Responses.NewStreaming(ctx, params)
	var usage responses.ResponseUsage
	for rs.Next() {
		if ev := rs.Current(); ev.Type == "response.completed" {
			usage = ev.Response.Usage
		}
	}
	require.NoError(t, rs.Err())
	rs.Close()
	assert.EqualValues(t, 50, usage.OutputTokens)

	fields := []string{"max_tokens", "max_completion_tokens", "max_tokens", "max_completion_tokens", "max_output_tokens"}
	got := up.Requests()
	require.Len(t, got, len(fields))
	for i, f := range fields {
		assert.EqualValues(t, 50, gjson.GetBytes(got[i].Body, f).Int(), "%s: %s", f, got[i].Body)
	}
	require.Len(t, reps.all(), len(fields))
	for _, rep := range reps.all() {
		assert.Equal(t, Clamp{From: 500, To: 50, Reason: ConstraintContextWindow}, rep.Clamp)
		assert.NoError(t, rep.Err)
	}
}

// TestClampBudgetThroughSDKs: a request a budget cannot pay for at its
// limit goes out with the limit the budget's remainder pays for, through
// both SDKs; one that could only get less than the minimum is refused with
// ErrBudgetExceeded, as without the clamp.
func TestClampBudgetThroughSDKs(t *testing.T) {
	up := newFakeServer(t, relaytest.WithCompletionTokens(1000))
	newRouter := func(limit float64) (*Router, *reports) {
		return newTestRouter(t, Config{Clamp: ClampConfig{MaxTokens: true}, Clock: newTestClock(),
			Prices:    map[string]Price{"m": {InputPerMTok: 1e6, OutputPerMTok: 1e6}}, // $1 a token
			Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}},
			Budgets:   []Budget{{Name: "cap", Limit: limit, Window: Window{Every: time.Hour}}}})
	}
	ctx := context.Background()
	r, reps := newRouter(100)
	resp, err := goOpenAIClient(r).CreateChatCompletion(ctx, goopenai.ChatCompletionRequest{
		Model: "m", Messages: []goopenai.ChatCompletionMessage{{Role: "user", Content: "hi"}}, MaxTokens: 500})
	require.NoError(t, err)
	rep := reps.all()[0]
	want := 100 - rep.PromptTokens
	assert.Equal(t, Clamp{From: 500, To: want, Reason: ConstraintBudget, Budget: "cap"}, rep.Clamp)
	assert.Equal(t, want, resp.Usage.CompletionTokens)
	assert.EqualValues(t, want, gjson.GetBytes(up.Requests()[0].Body, "max_tokens").Int())

	r, reps = newRouter(100)
	params := responsesParams("hi")
	params.Model, params.MaxOutputTokens = "m", openai.Int(500)
	client := openAIGoClient(r)
	res, err := client.Responses.New(ctx, params)
	require.NoError(t, err)
	rep = reps.all()[0]
	want = 100 - rep.PromptTokens
	assert.Equal(t, Clamp{From: 500, To: want, Reason: ConstraintBudget, Budget: "cap"}, rep.Clamp)
	assert.EqualValues(t, want, res.Usage.OutputTokens)
	assert.EqualValues(t, want, gjson.GetBytes(up.Requests()[1].Body, "max_output_tokens").Int())

	// Room for less than 16 output tokens: refused, no upstream call.
	r, reps = newRouter(float64(rep.PromptTokens + 5))
	client = openAIGoClient(r)
	_, err = client.Responses.New(ctx, params)
	require.ErrorIs(t, err, ErrBudgetExceeded)
	var rerr *Error
	require.True(t, errors.As(err, &rerr))
	assert.Equal(t, "cap", rerr.Budget)
	assert.Equal(t, 2, up.Calls())
	assert.Zero(t, reps.all()[0].Clamp)
}
