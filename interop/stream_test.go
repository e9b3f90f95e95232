package interop

import (
	"context"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	goopenai "github.com/sashabaranov/go-openai"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	. "github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relaytest"
)

// event builds one SSE event whose data is split over the given data lines.
func event(lines ...string) string {
	var b strings.Builder
	for _, l := range lines {
		b.WriteString("data: " + l + "\n")
	}
	b.WriteString("\n")
	return b.String()
}

// Events whose data is split over several data: lines, as the SSE
// specification allows (here, JSON printed over several lines).
var (
	// the usage chunk, printed over four lines
	usageSplit = event(`{`, `  "id": "c1", "object": "chat.completion.chunk", "choices": [],`, `  "usage": {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}`, `}`)
	// the last chunk, its finish_reason on the second line
	finishSplit = event(`{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},`, `"finish_reason":"stop"}]}`)
)

// longText is ~440 KB of output text with, inside it, the JSON of a usage
// object as a string holds it (escaped): a decoy that must not be read.
var longText = strings.Repeat("All work and no play makes a long answer. ", 10000) +
	`\"usage\":{\"input_tokens\":1,\"output_tokens\":1}` + strings.Repeat(" and more", 100)

// longResponse is the data of a terminal Responses event that repeats a
// long output before its usage, as response.completed does.
func longResponse(typ, status, errJSON string) string {
	return `{"type":"` + typ + `","sequence_number":9,"response":{"id":"resp_1","object":"response","status":"` + status + `",` + errJSON +
		`"model":"gpt-4o","output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"` + longText + `"}]}],` +
		`"tools":[],"usage":{"input_tokens":12,"input_tokens_details":{"cached_tokens":4},"output_tokens":99000,` +
		`"output_tokens_details":{"reasoning_tokens":7},"total_tokens":99012},"user":null,"metadata":{"usage":"a string, not a usage"}}}`
}

// TestGoOpenAIStreamMultiLineUsageChunk: a go-openai caller that did not ask
// for usage reads its stream through the router when the upstream prints the
// usage chunk the router asked for over several data lines: the chunk is
// removed, go-openai (which parses each data line alone) reads the content
// and a clean end, and the report has the usage. (The chunk reached
// go-openai, whose Recv failed on "{".)
func TestGoOpenAIStreamMultiLineUsageChunk(t *testing.T) {
	up := newSSEUpstream(t, []byte(event(chatHi)+event(chatStop)+usageSplit+"data: [DONE]\n\n"))
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}}})
	s, err := goOpenAIClient(r).CreateChatCompletionStream(context.Background(), goopenai.ChatCompletionRequest{
		Model: "gpt-4.1", Stream: true, Messages: []goopenai.ChatCompletionMessage{{Role: "user", Content: "Say hi"}},
	})
	require.NoError(t, err)
	text, err := recvAll(s)
	require.NoError(t, err)
	assert.Equal(t, "Hi", text)
	rep := reps.all()[0]
	assert.NoError(t, rep.Err)
	assert.Equal(t, Usage{PromptTokens: 5, CompletionTokens: 6}, rep.Usage)
}

// TestOpenAIGoStreamMultiLineData: openai-go joins an event's data lines;
// the router now reads the same events, so the usage it reports is the
// usage openai-go's caller gets. (The report estimated it.)
func TestOpenAIGoStreamMultiLineData(t *testing.T) {
	up := newSSEUpstream(t, []byte(event(chatHi)+finishSplit+usageSplit+"data: [DONE]\n\n"))
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}}})
	client := openAIGoClient(r)
	s := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
		Model:         "gpt-4.1",
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hi")},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	defer s.Close()
	var acc openai.ChatCompletionAccumulator
	for s.Next() {
		acc.AddChunk(s.Current())
	}
	require.NoError(t, s.Err())
	require.Len(t, acc.Choices, 1)
	assert.Equal(t, "Hi", acc.Choices[0].Message.Content)
	assert.Equal(t, "stop", acc.Choices[0].FinishReason)
	rep := reps.all()[0]
	assert.NoError(t, rep.Err)
	assert.False(t, rep.Usage.Estimated)
	assert.Equal(t, int(acc.Usage.PromptTokens), rep.Usage.PromptTokens)
	assert.Equal(t, int(acc.Usage.CompletionTokens), rep.Usage.CompletionTokens)
	assert.Equal(t, Usage{PromptTokens: 5, CompletionTokens: 6}, rep.Usage)
}

// TestOpenAIGoResponsesStreamLongCompleted: openai-go reads a Responses
// stream whose response.completed repeats a 440 KB output through the
// router to a clean end, and gets the output; the report has the usage.
// (Its stream failed with an unexpected EOF, and the usage was estimated.)
func TestOpenAIGoResponsesStreamLongCompleted(t *testing.T) {
	body := "event: response.output_text.delta\n" +
		event(`{"type":"response.output_text.delta","sequence_number":1,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"All"}`) +
		"event: response.completed\n" + event(longResponse("response.completed", "completed", ""))
	up := newSSEUpstream(t, []byte(body))
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}}})
	client := openAIGoClient(r)
	s := client.Responses.NewStreaming(context.Background(), responsesParams("Say it"))
	defer s.Close()
	var final string
	for s.Next() {
		if ev := s.Current(); ev.Type == "response.completed" {
			final = ev.Response.OutputText()
		}
	}
	require.NoError(t, s.Err())
	assert.Equal(t, len(strings.ReplaceAll(longText, `\"`, `"`)), len(final), "the whole output text")
	require.Len(t, reps.all(), 1)
	assert.NoError(t, reps.all()[0].Err)
	assert.Equal(t, Usage{PromptTokens: 12, CompletionTokens: 99000, CachedTokens: 4, ReasoningTokens: 7}, reps.all()[0].Usage)
}

func goopenaiReq() goopenai.ChatCompletionRequest {
	return goopenai.ChatCompletionRequest{Model: "gpt-4.1", Stream: true,
		Messages: []goopenai.ChatCompletionMessage{{Role: "user", Content: "x"}}}
}

// A deadline that passes mid-stream: the read error is a timeout and wraps
// context.DeadlineExceeded, through go-openai's stream reader.
func TestStreamDeadlineMidBodyIsTimeout(t *testing.T) {
	srv := newFakeServer(t)
	srv.SetDefault(relaytest.Fault{ChunkDelay: 200 * time.Millisecond})
	r, _ := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL}}})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	st, err := goOpenAIClient(r).CreateChatCompletionStream(ctx, goopenaiReq())
	require.NoError(t, err)
	_, err = recvAll(st)
	require.Error(t, err)
	t.Logf("%T %v", err, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.True(t, os.IsTimeout(err), "os.IsTimeout")
	var ne net.Error
	if assert.ErrorAs(t, err, &ne) {
		assert.True(t, ne.Timeout())
	}
}

func TestStreamCancelMidBodyIsCanceled(t *testing.T) {
	srv := newFakeServer(t)
	srv.SetDefault(relaytest.Fault{ChunkDelay: 200 * time.Millisecond})
	r, _ := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL}}})
	ctx, cancel := context.WithCancel(context.Background())
	st, err := goOpenAIClient(r).CreateChatCompletionStream(ctx, goopenaiReq())
	require.NoError(t, err)
	time.AfterFunc(300*time.Millisecond, cancel)
	_, err = recvAll(st)
	require.Error(t, err)
	t.Logf("%T %v", err, err)
	assert.ErrorIs(t, err, context.Canceled)
}
