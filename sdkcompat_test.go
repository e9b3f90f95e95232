package relay

import (
	"context"
	"io"
	"net"
	"net/http"
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

	"github.com/tokenrelay/relay/relaytest"
)

// What go-openai's and openai-go's own tests expect of an http.Client, kept
// true with the router as its Transport: a deadline is a timeout however the
// SDK looks at it, and a stream whose every choice finished is a clean end.

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
		up := newGatedUpstream(t) // never answers
		r, _ := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}}})
		ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
		defer cancel()
		return call(ctx, r)
	}},
	{"deadline passes during backoff", func(t *testing.T, call func(context.Context, http.RoundTripper) error) error {
		srvs := newServers(t, 1)
		srvs[0].SetDefault(relaytest.Fault{Status: 503})
		clock := newFakeClock()
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
		clock := newFakeClock()
		r, reps := newTestRouter(t, Config{
			Clock:     clock,
			Upstreams: []Upstream{{Name: "a", BaseURL: srvs[0].URL, RPM: 1}},
			Limits:    LimitConfig{MaxWait: 2 * time.Minute},
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
		clock := newFakeClock()
		clock.now = time.Now() // the context's deadline is on the real clock
		r, reps := newTestRouter(t, Config{
			Clock:     clock,
			Upstreams: []Upstream{{Name: "a", BaseURL: srvs[0].URL, RPM: 1}},
			Limits:    LimitConfig{MaxWait: 2 * time.Minute},
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
		a, b := newGatedUpstream(t), newGatedUpstream(t) // neither answers
		r, reps, clock := hedgeRouter(t, HedgeConfig{Delay: time.Second, Budget: 1}, a.URL, b.URL)
		r.hedges.bal.Store(hedgeBudgetCap)
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

const (
	chatHi     = `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}`
	chatStop   = `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`
	chatHi1    = `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[{"index":1,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null}]}`
	chatStop1  = `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[{"index":1,"delta":{},"finish_reason":"length"}]}`
	complHi    = `{"id":"1","object":"text_completion","created":1,"model":"gpt-3.5-turbo-instruct","choices":[{"text":"Hi","index":0,"logprobs":null,"finish_reason":null}]}`
	complStop  = `{"id":"1","object":"text_completion","created":1,"model":"gpt-3.5-turbo-instruct","choices":[{"text":"!","index":0,"logprobs":null,"finish_reason":"length"}]}`
	complNoIdx = `{"id":"1","object":"completion","created":1598069254,"model":"gpt-3.5-turbo-instruct","choices":[{"text":"Hi","finish_reason":"max_tokens"}]}`
)

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
	} {
		t.Run(c.name, func(t *testing.T) {
			up := newSSEUpstream(t, []byte(c.body))
			r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL + "/v1"}}})
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
			r, _ := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL + "/v1"}}})
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
				b.WriteString("event: " + string(firstType([]byte(d))) + "\n")
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
			r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL + "/v1"}}})
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
