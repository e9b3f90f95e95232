package relay

import (
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNoBlankLinesAfterLongLine: an upstream that sends no blank lines
// between chunks (read line by line, as go-openai reads it) and whose first
// chunk line is longer than streamLineMax (a big tool-call delta): the
// lines after it are read as chunks of their own, so [DONE], finish_reason
// and usage are found and the injected usage chunk is removed. (Every later
// line was joined into the long line's event and never read: a clean
// stream was reported cut, with an estimated usage, and the injected usage
// chunk reached the caller.)
func TestNoBlankLinesAfterLongLine(t *testing.T) {
	long := `{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"` +
		strings.Repeat("x", 300<<10) + `"}}]},"finish_reason":null}]}`
	usage := `{"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":6,"total_tokens":11}}`
	body := "data: " + long + "\n" + "data: " + chatStop + "\n" + "data: " + usage + "\n" + "data: [DONE]\n"
	readsToCleanEnd(t, body, long[:64]) // the long line passes through
}

// readsToCleanEnd streams body (an upstream without blank lines, ending in
// a usage chunk of 5 + 6 tokens) through a router, once with the caller's
// own usage option and once with the injected one, and checks a clean end,
// the usage, the injected chunk removed and keep passed through.
func readsToCleanEnd(t *testing.T, body, keep string) {
	t.Helper()
	for _, req := range []string{chatStreamUsageReq, chatStreamReq} {
		r, reps := bodyRouter(t, Config{}, func() io.Reader { return strings.NewReader(body) })
		got, err := stream(t, r, "chat/completions", req)
		assert.NoError(t, err, "req %s", req)
		if req == chatStreamReq {
			assert.NotContains(t, string(got), `"usage"`, "injected usage chunk removed")
		}
		assert.Contains(t, string(got), keep)
		require.Len(t, reps.all(), 1)
		rep := reps.all()[0]
		assert.NoError(t, rep.Err)
		assert.Equal(t, Usage{PromptTokens: 5, CompletionTokens: 6}, rep.Usage)
	}
}

// TestNoBlankLinesAfterHeartbeat: the same after a short data line that is
// not JSON (a heartbeat), which no later line can continue into JSON; the
// heartbeat passes through.
func TestNoBlankLinesAfterHeartbeat(t *testing.T) {
	usage := `{"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":6,"total_tokens":11}}`
	body := "data: " + chatHi + "\n" + "data: ping\n" + "data: " + chatStop + "\n" + "data: " + usage + "\n" + "data: [DONE]\n"
	readsToCleanEnd(t, body, "data: ping\n")
}
