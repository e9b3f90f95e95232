package relay

import (
	"context"
	"net/http"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	goopenai "github.com/sashabaranov/go-openai"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay/relaytest"
)

func TestGoOpenAIThroughRouter(t *testing.T) {
	srv := relaytest.NewServer(relaytest.WithName("us-east"))
	defer srv.Close()
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "us-east", BaseURL: srv.URL, APIKey: "sk-upstream"}}})

	cfg := goopenai.DefaultConfig("sk-caller")
	cfg.BaseURL = "http://relay.invalid/v1" // never dialled: the router rewrites it
	cfg.HTTPClient = &http.Client{Transport: r}
	client := goopenai.NewClientWithConfig(cfg)
	resp, err := client.CreateChatCompletion(context.Background(), goopenai.ChatCompletionRequest{
		Model:    "gpt-4.1",
		Messages: []goopenai.ChatCompletionMessage{{Role: "user", Content: "Say hello"}},
	})
	require.NoError(t, err)
	assert.Equal(t, "Hello from relaytest. Hello from relaytest.", resp.Choices[0].Message.Content)
	assert.Equal(t, "us-east", resp.Header().Get(HeaderUpstream))

	got := srv.Requests()
	require.Len(t, got, 1)
	assert.Equal(t, "Bearer sk-upstream", got[0].Header.Get("Authorization"))
	rep := reps.all()[0]
	assert.Equal(t, resp.Usage.PromptTokens, rep.Usage.PromptTokens)
	assert.Equal(t, resp.Usage.CompletionTokens, rep.Usage.CompletionTokens)
	assert.Equal(t, rep.PromptTokens, rep.Usage.PromptTokens, "router's count agrees with the upstream's")

	// A final error reaches go-openai as its APIError, with the upstream's status.
	srv.Script(relaytest.Fault{Status: 401})
	_, err = client.CreateChatCompletion(context.Background(), goopenai.ChatCompletionRequest{
		Model: "gpt-4.1", Messages: []goopenai.ChatCompletionMessage{{Role: "user", Content: "x"}},
	})
	var apiErr *goopenai.APIError
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, 401, apiErr.HTTPStatusCode)
	assert.Len(t, reps.all(), 2)
}

func TestOpenAIGoThroughRouter(t *testing.T) {
	srv := relaytest.NewServer()
	defer srv.Close()
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL, APIKey: "sk-upstream"}}})
	client := openai.NewClient(
		option.WithBaseURL("http://relay.invalid/v1/"),
		option.WithAPIKey("sk-caller"),
		option.WithHTTPClient(&http.Client{Transport: r}),
		option.WithMaxRetries(0),
	)
	chat, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model:    "gpt-4.1",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello")},
	})
	require.NoError(t, err)
	assert.NotEmpty(t, chat.Choices[0].Message.Content)

	resp, err := client.Responses.New(context.Background(), responsesParams("Say hello"))
	require.NoError(t, err)
	assert.NotEmpty(t, resp.OutputText())

	emb, err := client.Embeddings.New(context.Background(), openai.EmbeddingNewParams{
		Model: "text-embedding-3-small",
		Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("hello world")},
	})
	require.NoError(t, err)
	assert.NotEmpty(t, emb.Data)

	list := reps.all()
	require.Len(t, list, 3)
	assert.Equal(t, EndpointChat, list[0].Endpoint)
	assert.Equal(t, EndpointResponses, list[1].Endpoint)
	assert.Equal(t, EndpointEmbeddings, list[2].Endpoint)
	for _, rep := range list {
		assert.NoError(t, rep.Err)
		assert.Positive(t, rep.Usage.PromptTokens, rep.Endpoint)
		assert.False(t, rep.Usage.Estimated, rep.Endpoint)
	}
	paths := []string{}
	for _, q := range srv.Requests() {
		paths = append(paths, q.Path)
	}
	assert.Equal(t, []string{"/v1/chat/completions", "/v1/responses", "/v1/embeddings"}, paths)
}
