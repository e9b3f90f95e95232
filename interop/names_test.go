package interop

import (
	"context"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	goopenai "github.com/sashabaranov/go-openai"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	. "github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relaytest"
)

const (
	namesAPIVersion = "2024-10-21"
	namesKey        = "upstream-key-0123456789"
)

// namedUpstream starts a fake upstream of one naming style, which checks
// its key the way its API wants it, and the Upstream that reaches it: an
// OpenRouter-style prefix ("openai/gpt-4.1"), or Azure deployments
// ("prod-41"), through the deployment API or Azure's v1 API.
func namedUpstream(t *testing.T, style string) (Upstream, *relaytest.Server) {
	t.Helper()
	deployments := map[string]string{"gpt-4.1": "prod-41", "text-embedding-3-small": "emb"}
	switch style {
	case "openrouter":
		srv := newFakeServer(t, relaytest.WithAPIKey(namesKey))
		return Upstream{Name: style, BaseURL: srv.URL, APIKey: namesKey,
			ModelNames: map[string]string{"gpt-4.1": "openai/gpt-4.1", "text-embedding-3-small": "openai/text-embedding-3-small"}}, srv
	case "azure":
		srv := newFakeServer(t, relaytest.WithAzure(namesAPIVersion, "prod-41", "emb"), relaytest.WithAPIKey(namesKey))
		return Upstream{Name: style, BaseURL: srv.AzureURL, APIKey: namesKey, ModelNames: deployments,
			Azure: &AzureConfig{APIVersion: namesAPIVersion}}, srv
	case "azure-v1":
		srv := newFakeServer(t, relaytest.WithAzure(namesAPIVersion), relaytest.WithAPIKey(namesKey))
		return Upstream{Name: style, BaseURL: srv.AzureURL + "/openai/v1", APIKey: namesKey, ModelNames: deployments}, srv
	}
	panic(style)
}

// eachNamedStyle runs test once per naming style, with a router to a fake
// upstream of that style.
func eachNamedStyle(t *testing.T, test func(t *testing.T, style string, r *Router, reps *reports, srv *relaytest.Server)) {
	for _, style := range []string{"openrouter", "azure", "azure-v1"} {
		t.Run(style, func(t *testing.T) {
			up, srv := namedUpstream(t, style)
			r, reps := newTestRouter(t, Config{Upstreams: []Upstream{up}})
			test(t, style, r, reps, srv)
		})
	}
}

// sentName is the name a style's upstream expects for model.
func sentName(style, model string) string {
	switch {
	case style == "openrouter":
		return "openai/" + model
	case model == "gpt-4.1":
		return "prod-41"
	}
	return "emb"
}

// checkNamed checks that the i-th call reached srv under the upstream's
// name at the path its API wants, and that its report keeps the caller's
// model beside the name sent, with the upstream's usage.
func checkNamed(t *testing.T, style string, srv *relaytest.Server, rep Report, i int, endpoint, model string) {
	t.Helper()
	got := srv.Requests()[i]
	want := sentName(style, model)
	assert.Equal(t, endpoint, got.Endpoint)
	assert.Equal(t, want, got.Model)
	switch style {
	case "azure":
		path := "/openai/deployments/" + want + "/" + endpoint
		if endpoint == EndpointResponses {
			path = "/openai/responses"
		}
		assert.Equal(t, path, got.Path)
		assert.Equal(t, "api-version="+namesAPIVersion, got.RawQuery)
		assert.Equal(t, namesKey, got.Header.Get("Api-Key"))
		assert.Empty(t, got.Header.Get("Authorization"), "the SDK's key stays home")
	case "azure-v1":
		assert.Equal(t, "/openai/v1/"+endpoint, got.Path)
	default:
		assert.Equal(t, "/v1/"+endpoint, got.Path)
	}
	assert.NoError(t, rep.Err)
	assert.Equal(t, model, rep.RequestedModel)
	assert.Equal(t, model, rep.Model)
	assert.Equal(t, want, rep.UpstreamModel)
	assert.False(t, rep.Usage.Estimated)
	assert.Positive(t, rep.Usage.PromptTokens)
	assert.True(t, rep.Priced, "priced by the caller's name")
}

// TestGoOpenAIModelNames: go-openai, configured for OpenAI, reaches an
// OpenRouter-style, an Azure and an Azure v1 upstream through the router,
// streaming and not; each call goes under the upstream's name and the
// reports keep both names.
func TestGoOpenAIModelNames(t *testing.T) {
	eachNamedStyle(t, func(t *testing.T, style string, r *Router, reps *reports, srv *relaytest.Server) {
		client := goOpenAIClient(r)
		ctx := context.Background()
		chat := goopenai.ChatCompletionRequest{Model: "gpt-4.1", Messages: []goopenai.ChatCompletionMessage{{Role: "user", Content: "Say hello"}}}

		resp, err := client.CreateChatCompletion(ctx, chat)
		require.NoError(t, err)
		assert.Equal(t, "Hello from relaytest. Hello from relaytest.", resp.Choices[0].Message.Content)
		assert.Equal(t, "gpt-4.1", resp.Header().Get(HeaderModel))
		checkNamed(t, style, srv, reps.all()[0], 0, EndpointChat, "gpt-4.1")

		chat.Stream = true
		s, err := client.CreateChatCompletionStream(ctx, chat)
		require.NoError(t, err)
		text, err := recvAll(s)
		require.NoError(t, err)
		assert.Equal(t, "Hello from relaytest. Hello from relaytest.", text)
		checkNamed(t, style, srv, reps.all()[1], 1, EndpointChat, "gpt-4.1")

		emb, err := client.CreateEmbeddings(ctx, goopenai.EmbeddingRequest{Model: "text-embedding-3-small", Input: []string{"hello"}})
		require.NoError(t, err)
		assert.NotEmpty(t, emb.Data)
		checkNamed(t, style, srv, reps.all()[2], 2, EndpointEmbeddings, "text-embedding-3-small")
	})
}

// TestOpenAIGoModelNames: the same through openai-go, with the Responses
// API as well.
func TestOpenAIGoModelNames(t *testing.T) {
	eachNamedStyle(t, func(t *testing.T, style string, r *Router, reps *reports, srv *relaytest.Server) {
		client := openAIGoClient(r)
		ctx := context.Background()
		params := openai.ChatCompletionNewParams{Model: "gpt-4.1", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello")}}

		chat, err := client.Chat.Completions.New(ctx, params)
		require.NoError(t, err)
		assert.Equal(t, "Hello from relaytest. Hello from relaytest.", chat.Choices[0].Message.Content)
		checkNamed(t, style, srv, reps.all()[0], 0, EndpointChat, "gpt-4.1")

		s := client.Chat.Completions.NewStreaming(ctx, params)
		var acc openai.ChatCompletionAccumulator
		for s.Next() {
			acc.AddChunk(s.Current())
		}
		require.NoError(t, s.Err())
		s.Close()
		require.Len(t, acc.Choices, 1)
		assert.Equal(t, "Hello from relaytest. Hello from relaytest.", acc.Choices[0].Message.Content)
		checkNamed(t, style, srv, reps.all()[1], 1, EndpointChat, "gpt-4.1")

		resp, err := client.Responses.New(ctx, responsesParams("Say hello"))
		require.NoError(t, err)
		assert.Equal(t, "Hello from relaytest. Hello from relaytest.", resp.OutputText())
		checkNamed(t, style, srv, reps.all()[2], 2, EndpointResponses, "gpt-4.1")

		rs := client.Responses.NewStreaming(ctx, responsesParams("Say hello"))
		completed := false
		for rs.Next() {
			completed = completed || rs.Current().Type == "response.completed"
		}
		require.NoError(t, rs.Err())
		rs.Close()
		assert.True(t, completed)
		checkNamed(t, style, srv, reps.all()[3], 3, EndpointResponses, "gpt-4.1")

		emb, err := client.Embeddings.New(ctx, openai.EmbeddingNewParams{
			Model: "text-embedding-3-small",
			Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("hello")},
		})
		require.NoError(t, err)
		assert.NotEmpty(t, emb.Data)
		checkNamed(t, style, srv, reps.all()[4], 4, EndpointEmbeddings, "text-embedding-3-small")
	})
}

// TestModelNamesFailoverThroughSDKs: an Azure deployment that fails hands
// the call to an OpenRouter-style upstream under its own name for the same
// model, for a go-openai stream and an openai-go call; a deployment the
// resource does not have reaches the SDK as its 404 error.
func TestModelNamesFailoverThroughSDKs(t *testing.T) {
	azure, azSrv := namedUpstream(t, "azure")
	or, orSrv := namedUpstream(t, "openrouter")
	noWait := func(int) time.Duration { return 0 }
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{azure, or}, Retry: RetryConfig{Backoff: noWait}})
	ctx := context.Background()

	azSrv.Script(relaytest.Fault{Status: 503})
	s, err := goOpenAIClient(r).CreateChatCompletionStream(ctx, goopenai.ChatCompletionRequest{
		Model: "gpt-4.1", Stream: true, Messages: []goopenai.ChatCompletionMessage{{Role: "user", Content: "Say hello"}},
	})
	require.NoError(t, err)
	text, err := recvAll(s)
	require.NoError(t, err)
	assert.Equal(t, "Hello from relaytest. Hello from relaytest.", text)
	assert.Equal(t, "prod-41", azSrv.Requests()[0].Model)
	rep := reps.all()[0]
	assert.Equal(t, "openrouter", rep.Upstream)
	assert.Equal(t, 2, rep.Attempts)
	checkNamed(t, "openrouter", orSrv, rep, 0, EndpointChat, "gpt-4.1")

	azSrv.Script(relaytest.Fault{Status: 503})
	oa := openAIGoClient(r)
	chat, err := oa.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: "gpt-4.1", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello")},
	})
	require.NoError(t, err)
	assert.NotEmpty(t, chat.Choices[0].Message.Content)
	checkNamed(t, "openrouter", orSrv, reps.all()[1], 1, EndpointChat, "gpt-4.1")

	// A deployment the resource lacks: Azure's 404, which is not retried.
	gone, goneSrv := namedUpstream(t, "azure")
	gone.ModelNames = map[string]string{"gpt-4.1": "retired-41"}
	r2, reps2 := newTestRouter(t, Config{Upstreams: []Upstream{gone}})
	_, err = goOpenAIClient(r2).CreateChatCompletion(ctx, goopenai.ChatCompletionRequest{
		Model: "gpt-4.1", Messages: []goopenai.ChatCompletionMessage{{Role: "user", Content: "x"}},
	})
	var apiErr *goopenai.APIError
	require.ErrorAs(t, err, &apiErr)
	assert.Equal(t, 404, apiErr.HTTPStatusCode)
	assert.Equal(t, "DeploymentNotFound", apiErr.Code)
	oa2 := openAIGoClient(r2)
	_, err = oa2.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model: "gpt-4.1", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")},
	})
	var oaErr *openai.Error
	require.ErrorAs(t, err, &oaErr)
	assert.Equal(t, 404, oaErr.StatusCode)
	assert.Equal(t, 2, goneSrv.Calls())
	for _, rep := range reps2.all() {
		assert.Equal(t, "retired-41", rep.UpstreamModel)
		assert.Equal(t, 404, rep.StatusCode)
	}
}
