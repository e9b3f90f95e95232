package prompt

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/tidwall/gjson"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestEndpoint(t *testing.T) {
	for path, want := range map[string]string{
		"/v1/chat/completions": Chat, "/openai/deployments/x/chat/completions/": Chat,
		"/v1/completions": Completions, "/v1/responses": Responses, "/v1/embeddings": Embeddings,
		"/v1/models": "", "/v1/files/abc": "", "": "",
	} {
		assert.Equal(t, want, Endpoint(path), path)
	}
}

// TestCanonical: the same conversation through chat and the Responses API
// has one canonical prompt; system messages and tools come first.
func TestCanonical(t *testing.T) {
	chat := `{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Hi"},{"type":"image_url"}]}]}`
	resp := `{"instructions":"Be brief.","input":[{"role":"user","content":[{"type":"input_text","text":"Hi"},{"type":"input_image"}]}]}`
	c := string(AppendCanonical(nil, Chat, chat, 1<<20))
	assert.Equal(t, "system\nBe brief.\nuser\nHi\n<image>\n", c)
	assert.Equal(t, c, string(AppendCanonical(nil, Responses, resp, 1<<20)))
	tools := `{"messages":[{"role":"user","content":"q"}],"tools":[{"type":"function"}]}`
	assert.Equal(t, "tools\n[{\"type\":\"function\"}]\nuser\nq\n", string(AppendCanonical(nil, Chat, tools, 1<<20)))
	assert.Equal(t, "a\nb", string(AppendCanonical(nil, Embeddings, `{"input":["a","b",[1,2]]}`, 1<<20)))
	assert.Equal(t, "syst", string(AppendCanonical(nil, Chat, chat, 4)), "bounded")
}

// TestAnchor: a conversation past its first turn is anchored on the first
// message after the leading system and developer messages; a first turn, a
// one-shot request and a string input have no anchor.
func TestAnchor(t *testing.T) {
	anchor := func(ep, body string) string {
		want := string(AppendAnchor(nil, ep, body, 1<<20))
		var r Reader
		r.Read(ep, body)
		var c Canon
		c.Limit = 1 << 20
		r.AppendAnchor(&c)
		assert.Equal(t, want, string(c.Buf), "the Reader agrees: %s", body)
		return want
	}
	sys := `{"role":"system","content":"S"},{"role":"developer","content":"D"},`
	for body, want := range map[string]string{
		`{"messages":[` + sys + `{"role":"user","content":"Q"}]}`:                                                                                 "",
		`{"messages":[` + sys + `{"role":"user","content":"Q"},{"role":"assistant","content":"A"}]}`:                                              "user\nQ\n",
		`{"messages":[{"role":"user","content":[{"type":"text","text":"Q"}]},{"role":"user","content":"R"}]}`:                                     "user\nQ\n",
		`{"messages":[` + sys + `{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{}"}}]},{"role":"tool","content":"ok"}]}`: "assistant\nf({})\n",
		`{"messages":[` + sys + `7,{"role":"user","content":"Q"}]}`:                                                                               "",
		`{"messages":"not a list"}`: "",
	} {
		assert.Equal(t, want, anchor(Chat, body), body)
	}
	assert.Equal(t, "user\nQ\n", anchor(Responses, `{"instructions":"S","input":[{"role":"user","content":"Q"},{"type":"function_call_output","output":"x"}]}`))
	assert.Empty(t, anchor(Responses, `{"instructions":"S","input":"Q"}`))
	assert.Empty(t, anchor(Completions, `{"prompt":["a","b"]}`))
	assert.Equal(t, "us", string(AppendAnchor(nil, Chat, `{"messages":[{"role":"user","content":"Q"},{"role":"user","content":"R"}]}`, 2)), "bounded")
}

// TestTokens: the chat formula, with a counter of one token per byte.
func TestTokens(t *testing.T) {
	root := gjson.Parse(`{"messages":[{"role":"user","name":"bob","content":"hi"}]}`)
	f := Fields{Messages: root.Get("messages")}
	// 3 per message + "user" 4 + "bob" 3 + 1 per name + "hi" 2 + 3 reply.
	assert.Equal(t, 3+4+3+1+2+3, Tokens(byteCounter{}, 0, Chat, &f))
}

type byteCounter struct{}

func (byteCounter) Text(s string) int { return len(s) }

func (byteCounter) Tools(tools gjson.Result) int {
	return ToolsTokens(func(s string) int { return len(s) }, tools)
}
