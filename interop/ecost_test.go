package interop

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	goopenai "github.com/sashabaranov/go-openai"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	. "github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relaytest"
)

// A conversation through go-openai under StrategyExpectedCost: its second
// turn goes to the upstream that served the first, with the predicted
// cached tokens in the report beside those the upstream reported.
func TestGoOpenAIExpectedCost(t *testing.T) {
	srvs := newServers(t, 3)
	byName := map[string]*relaytest.Server{}
	var ups []Upstream
	for i, s := range srvs {
		name := []string{"u0", "u1", "u2"}[i]
		byName[name] = s
		ups = append(ups, Upstream{Name: name, BaseURL: s.URL})
	}
	clock := relaytest.NewClock(time.Time{})
	r, reps := newTestRouter(t, Config{Upstreams: ups, Strategy: StrategyExpectedCost, Clock: clock})
	client := goOpenAIClient(r)

	system := strings.Repeat("You answer questions about the product notes below. ", 200)
	msgs := []goopenai.ChatCompletionMessage{{Role: "system", Content: system}, {Role: "user", Content: "First question?"}}
	resp, err := client.CreateChatCompletion(context.Background(), goopenai.ChatCompletionRequest{Model: "gpt-4.1", Messages: msgs})
	require.NoError(t, err)
	home := resp.Header().Get(HeaderUpstream)
	require.NotEmpty(t, home)
	first := reps.all()[0]
	assert.Zero(t, first.PredictedCached, "nothing served yet")

	msgs = append(msgs, resp.Choices[0].Message, goopenai.ChatCompletionMessage{Role: "user", Content: "Second question?"})
	byName[home].Script(relaytest.Fault{CachedTokens: 1024})
	resp, err = client.CreateChatCompletion(context.Background(), goopenai.ChatCompletionRequest{Model: "gpt-4.1", Messages: msgs})
	require.NoError(t, err)
	assert.Equal(t, home, resp.Header().Get(HeaderUpstream), "the warm upstream answers the next turn")
	second := reps.all()[1]
	assert.Equal(t, home, second.Upstream)
	assert.GreaterOrEqual(t, second.PredictedCached, 1024)
	assert.Zero(t, second.PredictedCached%128, "OpenAI's steps of 128")
	assert.LessOrEqual(t, second.PredictedCached, second.PromptTokens)
	assert.Equal(t, 1024, second.Usage.CachedTokens)
	assert.Equal(t, resp.Usage.PromptTokensDetails.CachedTokens, second.Usage.CachedTokens)

	// Decide shows the prediction per candidate: only the home is warm.
	body := `{"model":"gpt-4.1","messages":[{"role":"system","content":"` + system + `"},{"role":"user","content":"Third?"}]}`
	req, err := http.NewRequest("POST", "http://relay.invalid/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	d, err := r.Decide(req)
	require.NoError(t, err)
	require.Len(t, d.Candidates, 3)
	assert.Equal(t, home, d.Candidates[0].Upstream)
	assert.Positive(t, d.Candidates[0].PredictedCached)
	assert.Zero(t, d.Candidates[1].PredictedCached+d.Candidates[2].PredictedCached)
}
