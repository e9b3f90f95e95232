package interop

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
	goopenai "github.com/sashabaranov/go-openai"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	. "github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relaytest"
)

const fullText = "Hello from relaytest. Hello from relaytest."

// failoverFleet starts upstreams u0 and u1 and a router that tries them in
// that order, retrying at once.
func failoverFleet(t *testing.T, cfg Config) ([]*relaytest.Server, *Router, *reports) {
	srvs := newServers(t, 2)
	cfg.Upstreams = []Upstream{{Name: "u0", BaseURL: srvs[0].URL}, {Name: "u1", BaseURL: srvs[1].URL}}
	cfg.Retry.Backoff = func(int) time.Duration { return 0 }
	r, reps := newTestRouter(t, cfg)
	return srvs, r, reps
}

// earlyFaults are the ways a stream fails before its first content.
var earlyFaults = []struct {
	name  string
	fault relaytest.Fault
}{
	{"server error event", relaytest.Fault{EarlyError: 500}},
	{"rate limit event", relaytest.Fault{EarlyError: 429}},
	{"cut after the first event", relaytest.Fault{CutAfter: 1}},
	{"malformed chunk", relaytest.Fault{Malformed: true}},
}

// TestGoOpenAIStreamFailover: through go-openai, a chat stream that fails
// before its first content is retried on the next upstream, and the SDK
// reads the whole answer, with no error; with FailoverWindow off, the same
// failure is the SDK's error.
func TestGoOpenAIStreamFailover(t *testing.T) {
	req := goopenai.ChatCompletionRequest{Model: "gpt-4.1", Stream: true,
		Messages: []goopenai.ChatCompletionMessage{{Role: "user", Content: "Say hello"}}}
	for _, c := range earlyFaults {
		srvs, r, reps := failoverFleet(t, Config{})
		srvs[0].Script(c.fault)
		s, err := goOpenAIClient(r).CreateChatCompletionStream(context.Background(), req)
		require.NoError(t, err, c.name)
		text, err := recvAll(s)
		require.NoError(t, err, c.name)
		assert.Equal(t, fullText, text, c.name)
		rep := reps.all()[0]
		assert.Equal(t, "u1", rep.Upstream, c.name)
		assert.Equal(t, 2, rep.Attempts, c.name)
		assert.NoError(t, rep.Err, c.name)

		srvs, r, _ = failoverFleet(t, Config{Stream: StreamConfig{FailoverWindow: -1}})
		srvs[0].Script(c.fault)
		s, err = goOpenAIClient(r).CreateChatCompletionStream(context.Background(), req)
		require.NoError(t, err, c.name)
		_, err = recvAll(s)
		assert.Error(t, err, "%s: without the hold, the SDK gets the failure", c.name)
	}

	// An invalid request's error event is not retried: go-openai returns
	// its APIError.
	srvs, r, reps := failoverFleet(t, Config{})
	srvs[0].Script(relaytest.Fault{EarlyError: 400})
	s, err := goOpenAIClient(r).CreateChatCompletionStream(context.Background(), req)
	require.NoError(t, err)
	_, err = recvAll(s)
	var apiErr *goopenai.APIError
	assert.ErrorAs(t, err, &apiErr)
	assert.Equal(t, 1, reps.all()[0].Attempts)
}

// TestOpenAIGoStreamFailover: through openai-go, chat and Responses streams
// that fail before their first content (an error event, response.failed,
// a cut, a malformed event) are retried on the next upstream, and the SDK
// reads the whole answer.
func TestOpenAIGoStreamFailover(t *testing.T) {
	ctx := context.Background()
	chat := func(client openai.Client) (string, error) {
		s := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "gpt-4.1",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello")}})
		defer s.Close()
		var acc openai.ChatCompletionAccumulator
		for s.Next() {
			acc.AddChunk(s.Current())
		}
		if len(acc.Choices) == 0 {
			return "", errors.Join(s.Err(), errors.New("no choice"))
		}
		return acc.Choices[0].Message.Content, s.Err()
	}
	respond := func(client openai.Client) (string, error) {
		s := client.Responses.NewStreaming(ctx, responsesParams("Say hello"))
		defer s.Close()
		text, completed := "", false
		for s.Next() {
			switch ev := s.Current(); ev.Type {
			case "response.output_text.delta":
				text += ev.Delta
			case "response.completed":
				completed = true
			case "error", "response.failed":
				return text, errors.New("the stream failed: " + ev.Type)
			}
		}
		if !completed {
			return text, errors.Join(s.Err(), errors.New("not completed"))
		}
		return text, s.Err()
	}
	faults := append(earlyFaults, struct {
		name  string
		fault relaytest.Fault
	}{"response.failed", relaytest.Fault{EarlyError: 503, FailedEvent: true}})
	for _, call := range []struct {
		name string
		do   func(openai.Client) (string, error)
	}{{"chat", chat}, {"responses", respond}} {
		for _, c := range faults {
			srvs, r, reps := failoverFleet(t, Config{})
			srvs[0].Script(c.fault)
			text, err := call.do(openAIGoClient(r))
			require.NoError(t, err, "%s: %s", call.name, c.name)
			assert.Equal(t, fullText, text, "%s: %s", call.name, c.name)
			rep := reps.all()[0]
			assert.Equal(t, "u1", rep.Upstream, "%s: %s", call.name, c.name)
			assert.Equal(t, 2, rep.Attempts, "%s: %s", call.name, c.name)

			srvs, r, _ = failoverFleet(t, Config{Stream: StreamConfig{FailoverWindow: -1}})
			srvs[0].Script(c.fault)
			_, err = call.do(openAIGoClient(r))
			assert.Error(t, err, "%s: %s: without the hold, the SDK gets the failure", call.name, c.name)
		}
	}
}

// TestBadAnswerFallbackThroughSDKs: an answer a content filter stopped, or
// an empty one, is retried on Retry.BadAnswerFallbacks' model: go-openai and
// openai-go get the fallback's answer, plain and streamed.
func TestBadAnswerFallbackThroughSDKs(t *testing.T) {
	ctx := context.Background()
	newRouter := func(t *testing.T) ([]*relaytest.Server, *Router, *reports) {
		srvs := newServers(t, 2)
		r, reps := newTestRouter(t, Config{
			Upstreams: []Upstream{{Name: "u0", BaseURL: srvs[0].URL, Models: []string{"gpt-4.1"}},
				{Name: "u1", BaseURL: srvs[1].URL, Models: []string{"gpt-4o"}}},
			Retry: RetryConfig{BadAnswerFallbacks: []string{"gpt-4o"}},
		})
		return srvs, r, reps
	}
	chatReq := goopenai.ChatCompletionRequest{Model: "gpt-4.1",
		Messages: []goopenai.ChatCompletionMessage{{Role: "user", Content: "Say hello"}}}
	calls := []struct {
		name string
		do   func(rt http.RoundTripper) (text, model string, err error)
	}{
		{"go-openai chat", func(rt http.RoundTripper) (string, string, error) {
			resp, err := goOpenAIClient(rt).CreateChatCompletion(ctx, chatReq)
			if err != nil {
				return "", "", err
			}
			return resp.Choices[0].Message.Content, resp.Model, nil
		}},
		{"go-openai chat stream", func(rt http.RoundTripper) (string, string, error) {
			req := chatReq
			req.Stream = true
			s, err := goOpenAIClient(rt).CreateChatCompletionStream(ctx, req)
			if err != nil {
				return "", "", err
			}
			text, err := recvAll(s)
			return text, s.Header().Get(HeaderModel), err
		}},
		{"openai-go chat", func(rt http.RoundTripper) (string, string, error) {
			client := openAIGoClient(rt)
			c, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-4.1",
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello")}})
			if err != nil {
				return "", "", err
			}
			return c.Choices[0].Message.Content, c.Model, nil
		}},
		{"openai-go responses", func(rt http.RoundTripper) (string, string, error) {
			client := openAIGoClient(rt)
			resp, err := client.Responses.New(ctx, responsesParams("Say hello"))
			if err != nil {
				return "", "", err
			}
			return resp.OutputText(), resp.Model, nil
		}},
		{"openai-go responses stream", func(rt http.RoundTripper) (string, string, error) {
			client := openAIGoClient(rt)
			s := client.Responses.NewStreaming(ctx, responsesParams("Say hello"))
			defer s.Close()
			var done responses.Response
			for s.Next() {
				if ev := s.Current(); ev.Type == "response.completed" || ev.Type == "response.incomplete" {
					done = ev.Response
				}
			}
			return done.OutputText(), done.Model, s.Err()
		}},
	}
	for _, call := range calls {
		for _, f := range []relaytest.Fault{{ContentFilter: true}, {Empty: true}} {
			srvs, r, reps := newRouter(t)
			srvs[0].Script(f)
			text, model, err := call.do(r)
			require.NoError(t, err, call.name)
			assert.Equal(t, fullText, text, call.name)
			assert.Equal(t, "gpt-4o", model, call.name)
			rep := reps.all()[0]
			assert.NotEmpty(t, rep.BadAnswer, call.name)
			assert.Equal(t, "gpt-4o", rep.Model, call.name)
			assert.Equal(t, 2, rep.Attempts, call.name)
		}
	}

	// Off by default: the SDK gets the filtered answer.
	srvs := newServers(t, 1)
	srvs[0].Script(relaytest.Fault{ContentFilter: true})
	r, _ := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "u0", BaseURL: srvs[0].URL}}})
	resp, err := goOpenAIClient(r).CreateChatCompletion(ctx, chatReq)
	require.NoError(t, err)
	assert.Equal(t, goopenai.FinishReasonContentFilter, resp.Choices[0].FinishReason)
}
