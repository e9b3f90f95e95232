package interop

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	openai "github.com/sashabaranov/go-openai"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay/relaytest"
)

// fakeClient is a go-openai client of the fake server s, with no router.
func fakeClient(s *relaytest.Server) *openai.Client {
	cfg := openai.DefaultConfig("sk-test")
	cfg.BaseURL = s.URL
	cfg.HTTPClient = s.Client()
	return openai.NewClientWithConfig(cfg)
}

var fakeRequest = openai.ChatCompletionRequest{
	Model:    openai.GPT4o,
	Messages: []openai.ChatCompletionMessage{{Role: openai.ChatMessageRoleUser, Content: "Hello"}},
}

// TestGoOpenAIChat: go-openai reads the fake server's chat answer and its
// errors, without a router.
func TestGoOpenAIChat(t *testing.T) {
	s := newFakeServer(t, relaytest.WithName("eu"))
	c := fakeClient(s)
	resp, err := c.CreateChatCompletion(context.Background(), fakeRequest)
	require.NoError(t, err)
	assert.Equal(t, "gpt-4o", resp.Model)
	require.Len(t, resp.Choices, 1)
	assert.Equal(t, "Hello from relaytest. Hello from relaytest.", resp.Choices[0].Message.Content)
	assert.Equal(t, openai.FinishReasonStop, resp.Choices[0].FinishReason)
	assert.Equal(t, 8, resp.Usage.PromptTokens)
	assert.Equal(t, 8, resp.Usage.CompletionTokens)
	assert.Equal(t, 16, resp.Usage.TotalTokens)
	assert.Equal(t, "eu", resp.Header().Get(relaytest.NameHeader))
	assert.Equal(t, "Bearer sk-test", s.Requests()[0].Header.Get("Authorization"))

	s.Script(relaytest.Fault{Status: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {"1"}}})
	_, err = c.CreateChatCompletion(context.Background(), fakeRequest)
	var apiErr *openai.APIError
	require.True(t, errors.As(err, &apiErr), "err = %v", err)
	assert.Equal(t, http.StatusTooManyRequests, apiErr.HTTPStatusCode)
	assert.Equal(t, "rate_limit_exceeded", apiErr.Code)
}

// TestGoOpenAIChatStream: go-openai reads the fake server's chat streams:
// with usage, with event lines, and with an error inside.
func TestGoOpenAIChatStream(t *testing.T) {
	s := newFakeServer(t)
	s.Script(relaytest.Fault{CachedTokens: 2}, relaytest.Fault{EventLines: true}, relaytest.Fault{ErrorEvent: true})
	c := fakeClient(s)
	req := fakeRequest
	req.Stream = true
	req.StreamOptions = &openai.StreamOptions{IncludeUsage: true}

	read := func() (string, *openai.Usage, error) {
		st, err := c.CreateChatCompletionStream(context.Background(), req)
		if err != nil {
			return "", nil, err
		}
		defer st.Close()
		var text strings.Builder
		var usage *openai.Usage
		for {
			chunk, err := st.Recv()
			if errors.Is(err, io.EOF) {
				return text.String(), usage, nil
			}
			if err != nil {
				return text.String(), usage, err
			}
			if chunk.Usage != nil {
				usage = chunk.Usage
			}
			for _, ch := range chunk.Choices {
				text.WriteString(ch.Delta.Content)
			}
		}
	}

	text, usage, err := read()
	require.NoError(t, err)
	assert.Equal(t, "Hello from relaytest. Hello from relaytest.", text)
	require.NotNil(t, usage)
	assert.Equal(t, 8, usage.PromptTokens)
	assert.Equal(t, 8, usage.CompletionTokens)
	require.NotNil(t, usage.PromptTokensDetails)
	assert.Equal(t, 2, usage.PromptTokensDetails.CachedTokens)

	text, usage, err = read() // event: lines
	require.NoError(t, err)
	assert.Equal(t, "Hello from relaytest. Hello from relaytest.", text)
	assert.NotNil(t, usage)

	text, _, err = read() // error inside the stream
	require.Error(t, err)
	assert.Equal(t, "Hello", text)
	assert.Contains(t, err.Error(), "The server had an error")
}
