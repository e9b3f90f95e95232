package relaytest

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
)

func goOpenAIClient(s *Server) *openai.Client {
	cfg := openai.DefaultConfig("sk-test")
	cfg.BaseURL = s.URL
	cfg.HTTPClient = s.Client()
	return openai.NewClientWithConfig(cfg)
}

var goOpenAIRequest = openai.ChatCompletionRequest{
	Model:    openai.GPT4o,
	Messages: []openai.ChatCompletionMessage{{Role: openai.ChatMessageRoleUser, Content: "Hello"}},
}

func TestGoOpenAIChat(t *testing.T) {
	s := newServer(t, WithName("eu"))
	c := goOpenAIClient(s)
	resp, err := c.CreateChatCompletion(context.Background(), goOpenAIRequest)
	require.NoError(t, err)
	assert.Equal(t, "gpt-4o", resp.Model)
	require.Len(t, resp.Choices, 1)
	assert.Equal(t, "Hello from relaytest. Hello from relaytest.", resp.Choices[0].Message.Content)
	assert.Equal(t, openai.FinishReasonStop, resp.Choices[0].FinishReason)
	assert.Equal(t, 8, resp.Usage.PromptTokens)
	assert.Equal(t, 8, resp.Usage.CompletionTokens)
	assert.Equal(t, 16, resp.Usage.TotalTokens)
	assert.Equal(t, "eu", resp.Header().Get(NameHeader))
	assert.Equal(t, "Bearer sk-test", s.Requests()[0].Header.Get("Authorization"))

	s.Script(Fault{Status: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {"1"}}})
	_, err = c.CreateChatCompletion(context.Background(), goOpenAIRequest)
	var apiErr *openai.APIError
	require.True(t, errors.As(err, &apiErr), "err = %v", err)
	assert.Equal(t, http.StatusTooManyRequests, apiErr.HTTPStatusCode)
	assert.Equal(t, "rate_limit_exceeded", apiErr.Code)
}

func TestGoOpenAIChatStream(t *testing.T) {
	s := newServer(t)
	s.Script(Fault{CachedTokens: 2}, Fault{EventLines: true}, Fault{ErrorEvent: true})
	c := goOpenAIClient(s)
	req := goOpenAIRequest
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
