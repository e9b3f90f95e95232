package relay

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

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

func goOpenAIClient(r http.RoundTripper) *goopenai.Client {
	cfg := goopenai.DefaultConfig("sk-caller")
	cfg.BaseURL = "http://relay.invalid/v1"
	cfg.HTTPClient = &http.Client{Transport: r}
	return goopenai.NewClientWithConfig(cfg)
}

// recvAll reads a go-openai stream to its end: the content, and the error
// that ended it (nil at a clean io.EOF).
func recvAll(s *goopenai.ChatCompletionStream) (string, error) {
	defer s.Close()
	var b strings.Builder
	for {
		resp, err := s.Recv()
		if errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			return b.String(), nil
		}
		if err != nil {
			return b.String(), err
		}
		for _, c := range resp.Choices {
			b.WriteString(c.Delta.Content)
		}
	}
}

func TestGoOpenAIStreamThroughRouter(t *testing.T) {
	srv := relaytest.NewServer()
	defer srv.Close()
	clk := newFakeClock()
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL}}, Clock: clk})
	client := goOpenAIClient(r)
	req := goopenai.ChatCompletionRequest{
		Model:    "gpt-4.1",
		Stream:   true,
		Messages: []goopenai.ChatCompletionMessage{{Role: "user", Content: "Say hello"}},
	}
	ctx := context.Background()

	s, err := client.CreateChatCompletionStream(ctx, req)
	require.NoError(t, err)
	text, err := recvAll(s)
	require.NoError(t, err)
	assert.Equal(t, "Hello from relaytest. Hello from relaytest.", text)
	rep := reps.all()[0]
	assert.Equal(t, relaytest.DefaultCompletionTokens, rep.Usage.CompletionTokens)
	assert.False(t, rep.Usage.Estimated, "usage came from the injected usage chunk")
	assert.NoError(t, rep.Err)

	// Each failure reaches go-openai's reader as an error, never a clean end.
	srv.Script(relaytest.Fault{CutAfter: 3})
	s, err = client.CreateChatCompletionStream(ctx, req)
	require.NoError(t, err)
	_, err = recvAll(s)
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF, "cut")

	srv.Script(relaytest.Fault{ErrorEvent: true})
	s, err = client.CreateChatCompletionStream(ctx, req)
	require.NoError(t, err)
	_, err = recvAll(s)
	var apiErr *goopenai.APIError
	assert.ErrorAs(t, err, &apiErr, "error event")

	// A clean end without [DONE].
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n")
	}))
	defer up.Close()
	r2, _ := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "b", BaseURL: up.URL}}})
	s, err = goOpenAIClient(r2).CreateChatCompletionStream(ctx, req)
	require.NoError(t, err)
	text, err = recvAll(s)
	assert.Equal(t, "Hi", text)
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF, "no [DONE]")

	// A stall.
	srv.Script(relaytest.Fault{StallAfter: 2})
	s, err = client.CreateChatCompletionStream(ctx, req)
	require.NoError(t, err)
	first, err := s.Recv() // the role chunk
	require.NoError(t, err)
	assert.Equal(t, "assistant", first.Choices[0].Delta.Role)
	second, err := s.Recv()
	require.NoError(t, err)
	assert.Equal(t, "Hello", second.Choices[0].Delta.Content)
	done := make(chan error, 1)
	go func() { _, err := recvAll(s); done <- err }()
	for {
		select {
		case err := <-done:
			assert.ErrorIs(t, err, ErrStreamStalled, "stall")
			assert.Len(t, reps.all(), 4)
			return
		case <-clk.armed:
			clk.Advance(time.Minute)
		case <-time.After(10 * time.Second):
			t.Fatal("stall not surfaced")
		}
	}
}

func TestOpenAIGoStreamThroughRouter(t *testing.T) {
	srv := relaytest.NewServer()
	defer srv.Close()
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL}}})
	client := openai.NewClient(
		option.WithBaseURL("http://relay.invalid/v1/"),
		option.WithAPIKey("sk-caller"),
		option.WithHTTPClient(&http.Client{Transport: r}),
		option.WithMaxRetries(0),
	)
	ctx := context.Background()
	params := openai.ChatCompletionNewParams{
		Model:    "gpt-4.1",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello")},
	}
	chat := func() (string, error) {
		s := client.Chat.Completions.NewStreaming(ctx, params)
		defer s.Close()
		var acc openai.ChatCompletionAccumulator
		for s.Next() {
			acc.AddChunk(s.Current())
		}
		if len(acc.Choices) == 0 {
			return "", s.Err()
		}
		return acc.Choices[0].Message.Content, s.Err()
	}
	text, err := chat()
	require.NoError(t, err)
	assert.Equal(t, "Hello from relaytest. Hello from relaytest.", text)
	assert.False(t, reps.all()[0].Usage.Estimated)

	srv.Script(relaytest.Fault{CutAfter: 3})
	_, err = chat()
	assert.Error(t, err, "cut stream surfaces as an error")

	s := client.Responses.NewStreaming(ctx, responsesParams("Say hello"))
	var out strings.Builder
	completed := false
	for s.Next() {
		ev := s.Current()
		switch ev.Type {
		case "response.output_text.delta":
			out.WriteString(ev.Delta)
		case "response.completed":
			completed = true
		}
	}
	require.NoError(t, s.Err())
	s.Close()
	assert.True(t, completed)
	assert.Equal(t, "Hello from relaytest. Hello from relaytest.", out.String())
	all := reps.all()
	require.Len(t, all, 3)
	assert.Equal(t, relaytest.DefaultCompletionTokens, all[2].Usage.CompletionTokens)
	assert.False(t, all[2].Usage.Estimated)
	assert.Positive(t, all[2].TTFT)
}
