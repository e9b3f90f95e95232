package interop

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	goopenai "github.com/sashabaranov/go-openai"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	. "github.com/tokenrelay/relay"
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
	clk := newTestClock()
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

// passingDeadline is a context whose deadline passes when the test says so:
// from then on Done is closed and Err is context.DeadlineExceeded, as for a
// context.WithDeadline whose time came, with no real timer to wait for.
type passingDeadline struct {
	context.Context
	done chan struct{}
	once sync.Once
}

func newPassingDeadline() *passingDeadline {
	return &passingDeadline{Context: context.Background(), done: make(chan struct{})}
}

func openAIGoClient(r http.RoundTripper) openai.Client {
	return openai.NewClient(
		option.WithBaseURL("http://relay.invalid/v1/"),
		option.WithAPIKey("sk-caller"),
		option.WithHTTPClient(&http.Client{Transport: r}),
		option.WithMaxRetries(0),
	)
}

// sdkChat makes one non-streaming chat call through an SDK and returns its
// error.
type sdkChat struct {
	name string
	call func(ctx context.Context, rt http.RoundTripper) error
}

var sdkChats = []sdkChat{
	{"go-openai", func(ctx context.Context, rt http.RoundTripper) error {
		_, err := goOpenAIClient(rt).CreateChatCompletion(ctx, goopenai.ChatCompletionRequest{
			Model:    "gpt-4.1",
			Messages: []goopenai.ChatCompletionMessage{{Role: "user", Content: "x"}},
		})
		return err
	}},
	{"openai-go", func(ctx context.Context, rt http.RoundTripper) error {
		client := openAIGoClient(rt)
		_, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:    "gpt-4.1",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("x")},
		})
		return err
	}},
}

// callAsync runs call on its own goroutine.
func callAsync(ctx context.Context, rt http.RoundTripper, call func(context.Context, http.RoundTripper) error) <-chan error {
	errc := make(chan error, 1)
	go func() { errc <- call(ctx, rt) }()
	return errc
}

// reportOp is the Op of the *Error in a report.
func reportOp(t *testing.T, rep Report) string {
	t.Helper()
	var rerr *Error
	require.ErrorAs(t, rep.Err, &rerr)
	return rerr.Op
}

// Each case makes one call through an SDK whose deadline ends it, and
// returns the SDK's error.
var deadlineCases = []struct {
	name string
	run  func(t *testing.T, call func(context.Context, http.RoundTripper) error) error
}{
	{"1ns deadline before headers", func(t *testing.T, call func(context.Context, http.RoundTripper) error) error {
		up := newSilentUpstream(t)
		r, _ := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}}})
		ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
		defer cancel()
		return call(ctx, r)
	}},
	{"deadline passes during backoff", func(t *testing.T, call func(context.Context, http.RoundTripper) error) error {
		srvs := newServers(t, 1)
		srvs[0].SetDefault(relaytest.Fault{Status: 503})
		clock := newTestClock()
		r, reps := newTestRouter(t, Config{Clock: clock, Upstreams: []Upstream{{Name: "a", BaseURL: srvs[0].URL}}})
		ctx := newPassingDeadline()
		defer ctx.pass()
		errc := callAsync(ctx, r, call)
		<-clock.armed // the 503 came; in backoff now
		ctx.pass()
		err := <-errc
		require.Len(t, reps.all(), 1)
		assert.Equal(t, "backoff", reportOp(t, reps.all()[0]))
		return err
	}},
	{"deadline passes during limiter wait", func(t *testing.T, call func(context.Context, http.RoundTripper) error) error {
		srvs := newServers(t, 1)
		clock := newTestClock()
		r, reps := newTestRouter(t, Config{
			Clock:     clock,
			Upstreams: []Upstream{{Name: "a", BaseURL: srvs[0].URL, RPM: 1}},
			Limits:    Limits{MaxWait: 2 * time.Minute},
		})
		require.NoError(t, call(context.Background(), r))
		ctx := newPassingDeadline()
		defer ctx.pass()
		errc := callAsync(ctx, r, call)
		require.Equal(t, time.Minute, <-clock.armed, "the second request waits for the RPM bucket")
		ctx.pass()
		err := <-errc
		assert.Equal(t, 1, srvs[0].Calls())
		require.Len(t, reps.all(), 2)
		assert.Equal(t, "acquire", reportOp(t, reps.all()[1]))
		return err
	}},
	{"deadline sooner than the limiter wait", func(t *testing.T, call func(context.Context, http.RoundTripper) error) error {
		// The wait (a minute) is within MaxWait but past the deadline (30 s):
		// the router refuses at once rather than wait for nothing.
		srvs := newServers(t, 1)
		clock := newTestClock()
		clock.now = time.Now() // the context's deadline is on the real clock
		r, reps := newTestRouter(t, Config{
			Clock:     clock,
			Upstreams: []Upstream{{Name: "a", BaseURL: srvs[0].URL, RPM: 1}},
			Limits:    Limits{MaxWait: 2 * time.Minute},
		})
		require.NoError(t, call(context.Background(), r))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := call(ctx, r)
		assert.ErrorIs(t, err, ErrRateLimited, "still says why")
		assert.Equal(t, 1, srvs[0].Calls())
		require.Len(t, reps.all(), 2)
		assert.ErrorIs(t, reps.all()[1].Err, context.DeadlineExceeded)
		return err
	}},
	{"deadline passes during hedge", func(t *testing.T, call func(context.Context, http.RoundTripper) error) error {
		a, b := newSilentUpstream(t), newSilentUpstream(t)
		clock := newTestClock()
		r, reps := newTestRouter(t, Config{ // with a budget of 1, the first request may hedge
			Clock:     clock,
			Hedge:     HedgeConfig{Delay: time.Second, Budget: 1},
			Upstreams: []Upstream{{Name: "a", BaseURL: a.URL}, {Name: "b", BaseURL: b.URL}},
		})
		ctx := newPassingDeadline()
		defer ctx.pass()
		errc := callAsync(ctx, r, call)
		require.Equal(t, time.Second, <-clock.armed)
		require.Eventually(t, func() bool { return a.Calls() == 1 }, 5*time.Second, time.Millisecond)
		clock.Advance(time.Second)
		require.Eventually(t, func() bool { return b.Calls() == 1 }, 5*time.Second, time.Millisecond)
		ctx.pass()
		err := <-errc
		require.Len(t, reps.all(), 1)
		assert.True(t, reps.all()[0].Hedged)
		assert.Equal(t, "send", reportOp(t, reps.all()[0]))
		return err
	}},
}

func TestSDKDeadlineIsTimeout(t *testing.T) {
	for _, c := range deadlineCases {
		for _, sdk := range sdkChats {
			t.Run(c.name+"/"+sdk.name, func(t *testing.T) {
				err := c.run(t, sdk.call)
				require.Error(t, err)
				assert.True(t, os.IsTimeout(err), "os.IsTimeout(%v)", err)
				assert.ErrorIs(t, err, context.DeadlineExceeded)
				var ne net.Error
				if assert.ErrorAs(t, err, &ne, "a net.Error") {
					assert.True(t, ne.Timeout(), "net.Error %T: Timeout()", ne)
				}
			})
		}
	}
}

// sseOf builds an event stream of data payloads, each preceded by "event:
// message" when withEvent is set.
func sseOf(withEvent bool, data ...string) string {
	var b strings.Builder
	for _, d := range data {
		if withEvent {
			b.WriteString("event: message\n")
		}
		b.WriteString("data: " + d + "\n\n")
	}
	return b.String()
}

// A chat or completions stream that ends, without data: [DONE], once every
// choice has its finish_reason is complete: go-openai's Recv gives io.EOF,
// as it does without the router. Cut before that, it is still an error.
func TestGoOpenAIStreamEndsAfterFinishReason(t *testing.T) {
	for _, c := range []struct {
		name     string
		complete bool // a legacy completions stream, else chat
		n        int
		body     string
		want     string
		clean    bool
	}{
		{"chat", false, 0, sseOf(false, chatHi, chatStop), "Hi", true},
		{"chat with event lines", false, 0, sseOf(true, chatHi, chatStop), "Hi", true},
		{"chat finish in the content chunk", false, 0, sseOf(false, strings.Replace(chatHi, `"finish_reason":null`, `"finish_reason":"stop"`, 1)), "Hi", true},
		{"chat n=2, both finished", false, 2, sseOf(false, chatHi, chatHi1, chatStop, chatStop1), "HiHi", true},
		{"completions", true, 0, sseOf(false, complHi, complStop), "Hi!", true},
		{"completions with event lines", true, 0, sseOf(true, complHi, complStop), "Hi!", true},
		{"completions, choice without index", true, 0, sseOf(true, complNoIdx), "Hi", true},
		{"chat cut before finish_reason", false, 0, sseOf(false, chatHi), "Hi", false},
		{"chat cut before finish_reason, event lines", false, 0, sseOf(true, chatHi), "Hi", false},
		{"chat n=2, one choice unfinished", false, 2, sseOf(false, chatHi, chatHi1, chatStop), "HiHi", false},
		{"completions cut before finish_reason", true, 0, sseOf(true, complHi), "Hi", false},
		// Not SSE, but go-openai reads it line by line, and so does the router.
		{"chat without blank lines", false, 0, "data: " + chatHi + "\ndata: " + chatStop + "\n", "Hi", true},
		{"chat without blank lines, cut before finish_reason", false, 0, "data: " + chatHi + "\ndata: " + chatHi + "\n", "HiHi", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := newSSEUpstream(t, []byte(c.body))
			r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}}})
			client := goOpenAIClient(r)
			ctx := context.Background()
			var (
				got  strings.Builder
				last error
			)
			if c.complete {
				s, err := client.CreateCompletionStream(ctx, goopenai.CompletionRequest{
					Model: "gpt-3.5-turbo-instruct", Prompt: "Say hi", MaxTokens: 10, N: c.n, Stream: true,
				})
				require.NoError(t, err)
				defer s.Close()
				for {
					resp, err := s.Recv()
					if err != nil {
						last = err
						break
					}
					for _, ch := range resp.Choices {
						got.WriteString(ch.Text)
					}
				}
			} else {
				s, err := client.CreateChatCompletionStream(ctx, goopenai.ChatCompletionRequest{
					Model: "gpt-4.1", N: c.n, Stream: true,
					Messages: []goopenai.ChatCompletionMessage{{Role: "user", Content: "Say hi"}},
				})
				require.NoError(t, err)
				defer s.Close()
				for {
					resp, err := s.Recv()
					if err != nil {
						last = err
						break
					}
					for _, ch := range resp.Choices {
						got.WriteString(ch.Delta.Content)
					}
				}
			}
			assert.Equal(t, c.want, got.String())
			require.Len(t, reps.all(), 1)
			if c.clean {
				assert.Equal(t, io.EOF, last, "a clean end: %v", last)
				assert.NoError(t, reps.all()[0].Err)
				return
			}
			assert.ErrorIs(t, last, io.ErrUnexpectedEOF)
			assert.ErrorIs(t, reps.all()[0].Err, io.ErrUnexpectedEOF)
		})
	}
}

// The same through openai-go: its stream ends with no error once every
// choice finished, and with one when cut before.
func TestOpenAIGoChatStreamEndsAfterFinishReason(t *testing.T) {
	for _, c := range []struct {
		name  string
		body  string
		clean bool
	}{
		{"finished", sseOf(false, chatHi, chatStop), true},
		{"finished, event lines", sseOf(true, chatHi, chatStop), true},
		{"cut before finish_reason", sseOf(false, chatHi), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := newSSEUpstream(t, []byte(c.body))
			r, _ := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}}})
			client := openAIGoClient(r)
			s := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
				Model:    "gpt-4.1",
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hi")},
			})
			defer s.Close()
			var got strings.Builder
			for s.Next() {
				for _, ch := range s.Current().Choices {
					got.WriteString(ch.Delta.Content)
				}
			}
			assert.Equal(t, "Hi", got.String())
			if c.clean {
				assert.NoError(t, s.Err())
				return
			}
			assert.ErrorIs(t, s.Err(), io.ErrUnexpectedEOF)
		})
	}
}

// A Responses stream ends at response.completed: nothing after it (no
// [DONE]) is needed for a clean end through openai-go; cut before it, the
// stream is an error.
func TestOpenAIGoResponsesStreamEndsAtCompleted(t *testing.T) {
	const (
		created   = `{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","created_at":1,"status":"in_progress","model":"gpt-4.1","output":[]}}`
		delta     = `{"type":"response.output_text.delta","sequence_number":1,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hi"}`
		completed = `{"type":"response.completed","sequence_number":2,"response":{"id":"resp_1","object":"response","created_at":1,"status":"completed","model":"gpt-4.1","output":[],"usage":{"input_tokens":3,"output_tokens":1,"total_tokens":4}}}`
	)
	events := func(withEvent bool, data ...string) string {
		var b strings.Builder
		for _, d := range data {
			if withEvent {
				b.WriteString("event: " + gjson.Get(d, "type").String() + "\n")
			}
			b.WriteString("data: " + d + "\n\n")
		}
		return b.String()
	}
	for _, c := range []struct {
		name  string
		body  string
		clean bool
	}{
		{"completed", events(false, created, delta, completed), true},
		{"completed, event lines", events(true, created, delta, completed), true},
		{"cut before completed", events(true, created, delta), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := newSSEUpstream(t, []byte(c.body))
			r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}}})
			client := openAIGoClient(r)
			s := client.Responses.NewStreaming(context.Background(), responsesParams("Say hi"))
			defer s.Close()
			var got strings.Builder
			for s.Next() {
				if ev := s.Current(); ev.Type == "response.output_text.delta" {
					got.WriteString(ev.Delta)
				}
			}
			assert.Equal(t, "Hi", got.String())
			require.Len(t, reps.all(), 1)
			if c.clean {
				assert.NoError(t, s.Err())
				assert.NoError(t, reps.all()[0].Err)
				assert.Equal(t, Usage{PromptTokens: 3, CompletionTokens: 1}, reps.all()[0].Usage)
				return
			}
			assert.ErrorIs(t, s.Err(), io.ErrUnexpectedEOF)
			assert.ErrorIs(t, reps.all()[0].Err, io.ErrUnexpectedEOF)
		})
	}
}

func (c *passingDeadline) Done() <-chan struct{} { return c.done }

func (c *passingDeadline) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

func (c *passingDeadline) pass() { c.once.Do(func() { close(c.done) }) }

const (
	chatHi     = `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}`
	chatStop   = `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`
	chatHi1    = `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[{"index":1,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}`
	chatStop1  = `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[{"index":1,"delta":{},"finish_reason":"length"}]}`
	complHi    = `{"id":"1","object":"text_completion","created":1,"model":"gpt-3.5-turbo-instruct","choices":[{"text":"Hi","index":0,"logprobs":null,"finish_reason":null}]}`
	complStop  = `{"id":"1","object":"text_completion","created":1,"model":"gpt-3.5-turbo-instruct","choices":[{"text":"!","index":0,"logprobs":null,"finish_reason":"length"}]}`
	complNoIdx = `{"id":"1","object":"completion","created":1598069254,"model":"gpt-3.5-turbo-instruct","choices":[{"text":"Hi","finish_reason":"max_tokens"}]}`
)
