package relay

import (
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

// overLines prints JSON data over several data lines, each under 256 KiB
// but together over it, cut after commas.
func overLines(data string) []string {
	var lines []string
	for len(data) > 100<<10 {
		i := strings.IndexByte(data[100<<10:], ',') + 100<<10 + 1
		lines = append(lines, data[:i])
		data = data[i:]
	}
	return append(lines, data)
}

// TestStreamLongEventReadAtItsEnds: an event over 256 KiB still passes
// through unparsed, but its type is read from its first bytes (or its
// event: line) and a usage object from its last: a Responses stream whose
// response.completed repeats a long output ends cleanly with that usage, a
// long response.failed reports its error, and a long chat chunk that ends
// with usage gives it; a usage printed inside a string is not read. (Before,
// the long terminal event was missed: the report estimated the usage and
// ended with an unexpected-EOF error.)
func TestStreamLongEventReadAtItsEnds(t *testing.T) {
	want := Usage{PromptTokens: 12, CompletionTokens: 99000, CachedTokens: 4, ReasoningTokens: 7}
	delta := "event: response.output_text.delta\n" + event(`{"type":"response.output_text.delta","delta":"All"}`)
	completed := longResponse("response.completed", "completed", "")
	longChat := `{"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"` + longText + `"},"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":5,"completion_tokens":70000,"total_tokens":70005}}`
	cases := []struct {
		name, path, req, body string
		usage                 Usage // the report's usage; zero: estimated
		errMsg                string
	}{
		{name: "response.completed, event lines", path: "responses", req: responsesStreamReq,
			body: delta + "event: response.completed\n" + event(completed), usage: want},
		{name: "response.completed, no event lines", path: "responses", req: responsesStreamReq,
			body: event(`{"type":"response.output_text.delta","delta":"All"}`) + event(completed), usage: want},
		{name: "response.completed over data lines", path: "responses", req: responsesStreamReq,
			body: delta + event(overLines(completed)...), usage: want},
		{name: "response.incomplete, at the end, no line end", path: "responses", req: responsesStreamReq,
			body: delta + "event: response.incomplete\ndata: " + longResponse("response.incomplete", "incomplete", ""), usage: want},
		{name: "response.failed", path: "responses", req: responsesStreamReq,
			body:  delta + "event: response.failed\n" + event(longResponse("response.failed", "failed", `"error":{"code":"server_error","message":"boom"},`)),
			usage: want, errMsg: "server_error: boom"},
		{name: "chat chunk ending with usage", path: "chat/completions", req: chatStreamUsageReq,
			body: event(chatHi) + event(longChat) + "data: [DONE]\n\n", usage: Usage{PromptTokens: 5, CompletionTokens: 70000}},
		{name: "chat chunk, usage only inside a string", path: "chat/completions", req: chatStreamUsageReq,
			body: event(chatHi) + event(strings.Replace(longChat, `,"usage":{"prompt_tokens":5,"completion_tokens":70000,"total_tokens":70005}`, "", 1)) + "data: [DONE]\n\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			type read struct {
				name  string
				split func(io.Reader) io.Reader
				buf   int // the caller's buffer, reused from Read to Read; 0: io.ReadAll
			}
			var cuts []int
			for i := 0; i < len(c.body); i += 4093 {
				cuts = append(cuts, i)
			}
			reads := []read{
				{name: "whole", split: func(r io.Reader) io.Reader { return r }},
				{name: "halves", split: iotest.HalfReader},
				{name: "4093-byte reads", split: func(io.Reader) io.Reader { return &cutReader{b: []byte(c.body), cuts: cuts} }},
				{name: "4 KiB caller buffer", split: func(r io.Reader) io.Reader { return r }, buf: 4 << 10},
			}
			for _, rd := range reads {
				r, reps := bodyRouter(t, Config{}, func() io.Reader { return rd.split(strings.NewReader(c.body)) })
				var got []byte
				var err error
				if rd.buf == 0 {
					got, err = stream(t, r, c.path, c.req)
				} else {
					got, err = streamBuf(t, r, c.path, c.req, rd.buf)
				}
				require.NoError(t, err, rd.name)
				assert.True(t, c.body == string(got), "%s: the caller reads the upstream's bytes", rd.name)
				require.Len(t, reps.all(), 1)
				rep := reps.all()[0]
				if c.usage == (Usage{}) {
					assert.True(t, rep.Usage.Estimated, rd.name)
					assert.Greater(t, rep.Usage.CompletionTokens, 10000, "%s: the long chunk counted as content", rd.name)
				} else {
					assert.Equal(t, c.usage, rep.Usage, rd.name)
				}
				if c.errMsg != "" {
					assert.ErrorIs(t, rep.Err, ErrStreamError, rd.name)
					assert.ErrorContains(t, rep.Err, c.errMsg, rd.name)
				} else {
					assert.NoError(t, rep.Err, rd.name)
				}
			}
		})
	}
}

// TestTailUsage: the usage object read from the end of a long event's data
// is the last one that is a JSON member, whole within the bytes kept.
func TestTailUsage(t *testing.T) {
	for _, c := range []struct {
		name, tail string
		want       Usage
		ok         bool
	}{
		{"member", `xx"},"usage":{"input_tokens":3,"output_tokens":4}}}`, Usage{PromptTokens: 3, CompletionTokens: 4}, true},
		{"white space", "a\",\n  \"usage\" :\t{\"prompt_tokens\": 5, \"completion_tokens\": 6}\n}", Usage{PromptTokens: 5, CompletionTokens: 6}, true},
		{"the last one", `,"usage":{"input_tokens":1,"output_tokens":1},"x":{"usage":{"input_tokens":2,"output_tokens":2}}}`, Usage{PromptTokens: 2, CompletionTokens: 2}, true},
		{"a later string value skipped", `,"usage":{"input_tokens":3,"output_tokens":4},"metadata":{"usage":"no"}}`, Usage{PromptTokens: 3, CompletionTokens: 4}, true},
		{"inside a string", `text \"usage\":{\"input_tokens\":3,\"output_tokens\":4} more"}`, Usage{}, false},
		{"the key cut at the start", `usage":{"input_tokens":3,"output_tokens":4}}`, Usage{}, false},
		{"not closed", `,"usage":{"input_tokens":3,"output_tokens":4`, Usage{}, false},
		{"not a usage", `,"usage":{"foo":1}}`, Usage{}, false},
		{"a brace inside a string", `,"usage":{"input_tokens":3,"note":"}{","output_tokens":4}}`, Usage{PromptTokens: 3, CompletionTokens: 4}, true},
	} {
		u, ok := tailUsage([]byte(c.tail))
		assert.Equal(t, c.ok, ok, c.name)
		assert.Equal(t, c.want, u, c.name)
	}
}

// TestStreamLongEventBounded: a 4 MiB response.completed on one line (its
// output repeated) is read at its ends with bounded memory: the stream's
// end and its usage are found, and the router allocates well under the
// event's size for it.
func TestStreamLongEventBounded(t *testing.T) {
	data := strings.Replace(longResponse("response.completed", "completed", ""), longText, strings.Repeat("0123456789abcdef", 4<<16), 1)
	body := "event: response.completed\n" + event(data)
	r, reps := bodyRouter(t, Config{}, func() io.Reader { return iotest.HalfReader(strings.NewReader(body)) })
	alloc := allocatedBySecondRead(t, r, "responses", responsesStreamReq, body)
	all := reps.all()
	require.Len(t, all, 2)
	assert.NoError(t, all[1].Err)
	assert.Equal(t, 99000, all[1].Usage.CompletionTokens)
	t.Logf("%d bytes allocated reading a %d-byte event", alloc, len(data))
	assert.Less(t, alloc, uint64(3<<19), "bytes allocated reading a %d-byte event", len(data))
}
