package interop

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	goopenai "github.com/sashabaranov/go-openai"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	. "github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relaytest"
)

// heldBase sends through http.DefaultTransport and holds the answers of
// one host until release is closed: the response headers of a JSON
// answer, the first byte of a stream (its first token). A held call ends
// when its context does.
type heldBase struct {
	host    string
	release chan struct{}
}

func (b *heldBase) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil || req.URL.Host != b.host {
		return resp, err
	}
	if resp.Header.Get("Content-Type") == "text/event-stream" {
		resp.Body = &heldBody{ReadCloser: resp.Body, b: b, ctx: req.Context()}
		return resp, nil
	}
	if err := b.wait(req.Context()); err != nil {
		resp.Body.Close()
		return nil, err
	}
	return resp, nil
}

func (b *heldBase) wait(ctx context.Context) error {
	select {
	case <-b.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (b *heldBase) CloseIdleConnections() {
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
}

// heldBody is a stream whose bytes come once its heldBase releases them.
type heldBody struct {
	io.ReadCloser
	b   *heldBase
	ctx context.Context
}

func (h *heldBody) Read(p []byte) (int, error) {
	if err := h.b.wait(h.ctx); err != nil {
		return 0, err
	}
	return h.ReadCloser.Read(p)
}

// chatCall sends one chat request for model through an SDK client over
// rt, streamed or not, and returns the answer's text.
type chatCall func(ctx context.Context, rt http.RoundTripper, model string, stream bool) (string, error)

// checkTimeoutsPerModel: a fast chat model (gpt-4.1, the global 2 s attempt
// and first-token timeouts) and a slow reasoning model (o3, whose
// ModelTimeouts give 2 min to headers and 1 min to the first token),
// through an SDK. The fast model's first upstream hangs (or sends no first
// token): past 2 s the router answers from its second upstream. The
// reasoning model's only upstream answers after 30 s: its own timeouts let
// it finish, on the first attempt.
func checkTimeoutsPerModel(t *testing.T, call chatCall) {
	for _, c := range []struct {
		name   string
		model  string
		stream bool
		fault  relaytest.Fault // of chat-a, the fast model's first upstream
		timers []time.Duration // the waits started before the test moves the clock
		answer string          // the upstream that answers
	}{
		{"fast model", "gpt-4.1", false, relaytest.Fault{Hang: true}, []time.Duration{2 * time.Second}, "chat-b"},
		{"fast model streamed", "gpt-4.1", true, relaytest.Fault{FirstTokenDelay: time.Hour}, []time.Duration{2 * time.Second, 2 * time.Second}, "chat-b"},
		{"reasoning model", "o3", false, relaytest.Fault{}, []time.Duration{2 * time.Minute}, "reasoning"},
		{"reasoning model streamed", "o3", true, relaytest.Fault{}, []time.Duration{2 * time.Minute, time.Minute}, "reasoning"},
	} {
		t.Run(c.name, func(t *testing.T) {
			chatA, chatB, reasoning := newFakeServer(t), newFakeServer(t), newFakeServer(t)
			chatA.Script(c.fault)
			u, err := url.Parse(reasoning.URL)
			require.NoError(t, err)
			held := &heldBase{host: u.Host, release: make(chan struct{})}
			clk := newTestClock()
			r, reps := newTestRouter(t, Config{
				Base:  held,
				Clock: clk,
				Upstreams: []Upstream{
					{Name: "chat-a", BaseURL: chatA.URL, Models: []string{"gpt-4.1"}},
					{Name: "chat-b", BaseURL: chatB.URL, Models: []string{"gpt-4.1"}},
					{Name: "reasoning", BaseURL: reasoning.URL, Models: []string{"o3"}},
				},
				Retry:         RetryConfig{AttemptTimeout: 2 * time.Second, Backoff: func(int) time.Duration { return 0 }},
				Stream:        StreamConfig{FirstTokenTimeout: 2 * time.Second},
				ModelTimeouts: map[string]Timeouts{"o3": {Attempt: 2 * time.Minute, FirstToken: time.Minute}},
			})
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel) // a failed test ends the held calls
			type result struct {
				text string
				err  error
			}
			done := make(chan result, 1)
			go func() {
				text, err := call(ctx, r, c.model, c.stream)
				done <- result{text, err}
			}()
			for _, want := range c.timers {
				select {
				case d := <-clk.armed:
					require.Equal(t, want, d)
				case <-time.After(10 * time.Second):
					t.Fatal("no timer started")
				}
			}
			require.Eventually(t, func() bool { return chatA.Calls()+reasoning.Calls() == 1 }, 10*time.Second, time.Millisecond, "the slow call reached its upstream")
			clk.Advance(30 * time.Second) // past the fast model's timeouts, short of the reasoning model's
			close(held.release)
			var res result
			select {
			case res = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("no answer")
			}
			require.NoError(t, res.err)
			assert.Equal(t, "Hello from relaytest. Hello from relaytest.", res.text)
			all := reps.all()
			require.Len(t, all, 1)
			assert.NoError(t, all[0].Err)
			assert.Equal(t, c.answer, all[0].Upstream)
			assert.Equal(t, map[string]int{"chat-b": 2, "reasoning": 1}[c.answer], all[0].Attempts)
			if c.answer == "reasoning" {
				assert.Equal(t, 1, reasoning.Calls(), "the slow answer was waited for, not retried")
			} else {
				assert.Equal(t, 1, chatA.Calls())
			}
		})
	}
}

func TestGoOpenAITimeoutsPerModel(t *testing.T) {
	checkTimeoutsPerModel(t, func(ctx context.Context, rt http.RoundTripper, model string, stream bool) (string, error) {
		client := goOpenAIClient(rt)
		req := goopenai.ChatCompletionRequest{Model: model, Messages: []goopenai.ChatCompletionMessage{{Role: "user", Content: "hi"}}}
		if !stream {
			resp, err := client.CreateChatCompletion(ctx, req)
			if err != nil {
				return "", err
			}
			return resp.Choices[0].Message.Content, nil
		}
		s, err := client.CreateChatCompletionStream(ctx, req)
		if err != nil {
			return "", err
		}
		return recvAll(s)
	})
}

func TestOpenAIGoTimeoutsPerModel(t *testing.T) {
	checkTimeoutsPerModel(t, func(ctx context.Context, rt http.RoundTripper, model string, stream bool) (string, error) {
		client := openai.NewClient(
			option.WithBaseURL("http://relay.invalid/v1/"),
			option.WithAPIKey("sk-caller"),
			option.WithHTTPClient(&http.Client{Transport: rt}),
			option.WithMaxRetries(0),
		)
		params := openai.ChatCompletionNewParams{Model: model, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}
		if !stream {
			chat, err := client.Chat.Completions.New(ctx, params)
			if err != nil {
				return "", err
			}
			return chat.Choices[0].Message.Content, nil
		}
		s := client.Chat.Completions.NewStreaming(ctx, params)
		defer s.Close()
		var acc openai.ChatCompletionAccumulator
		for s.Next() {
			acc.AddChunk(s.Current())
		}
		if err := s.Err(); err != nil {
			return "", err
		}
		if len(acc.Choices) == 0 {
			return "", errors.New("no choice in the stream")
		}
		return acc.Choices[0].Message.Content, nil
	})
}
