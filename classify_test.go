package relay

import (
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/tokenrelay/relay/internal/jsonscan"
	"github.com/tokenrelay/relay/internal/prompt"
	"github.com/tokenrelay/relay/internal/tokens"
)

// cookbookMessages are the example messages of OpenAI's "How to count tokens
// with tiktoken", whose published counts are 129 prompt tokens for
// gpt-3.5-turbo-0613 and gpt-4-0613 (cl100k_base) and 124 for gpt-4o and
// gpt-4o-mini (o200k_base).
const cookbookMessages = `[
 {"role": "system", "content": "You are a helpful, pattern-following assistant that translates corporate jargon into plain English."},
 {"role": "system", "name": "example_user", "content": "New synergies will help drive top-line growth."},
 {"role": "system", "name": "example_assistant", "content": "Things working well together will increase revenue."},
 {"role": "system", "name": "example_user", "content": "Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage."},
 {"role": "system", "name": "example_assistant", "content": "Let's talk later when we're less busy about how to do better."},
 {"role": "user", "content": "This late pivot means we don't have time to boil the ocean for the client deliverable."}
]`

func classifyBody(t *testing.T, r *Router, path, body string) Request {
	t.Helper()
	return r.classify(http.MethodPost, path, nil, []byte(body)).req
}

func testRouter(t *testing.T) *Router {
	t.Helper()
	r, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://127.0.0.1:1/v1"}}})
	require.NoError(t, err)
	return r
}

func TestClassifyShapes(t *testing.T) {
	r := testRouter(t)
	enc := func(s string) int { return tokens.O200K.Count(s) }
	cases := []struct {
		name, path, body string
		want             int
	}{
		{"chat string", "/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":"Hello world"}]}`,
			3 + enc("user") + enc("Hello world") + 3},
		{"chat parts with image", "/v1/chat/completions",
			`{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"text","text":"What is this?"},{"type":"image_url","image_url":{"url":"https://x/y.png"}}]}]}`,
			3 + enc("user") + enc("What is this?") + 85 + 3},
		{"chat tool call", "/v1/chat/completions",
			`{"model":"gpt-4o","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","tool_call_id":"c1","content":"sunny"}]}`,
			3 + enc("assistant") + enc("get_weather") + enc(`{"city":"Paris"}`) + 3 + enc("tool") + enc("c1") + enc("sunny") + 3},
		{"chat empty", "/v1/chat/completions", `{"model":"gpt-4o","messages":[]}`, 3},
		{"chat no messages", "/v1/chat/completions", `{"model":"gpt-4o"}`, 0},
		{"chat junk messages", "/v1/chat/completions", `{"model":"gpt-4o","messages":[1,"x",null]}`, 3},
		{"responses string", "/v1/responses", `{"model":"gpt-4o","instructions":"Be brief.","input":"Hi there"}`,
			3 + enc("Be brief.") + 3 + enc("Hi there") + 3},
		{"responses items", "/v1/responses",
			`{"model":"gpt-4o","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"Hi there"}]},{"type":"function_call_output","call_id":"c1","output":"42"}]}`,
			3 + enc("user") + enc("Hi there") + 3 + enc("c1") + enc("42") + 3},
		{"completions string", "/v1/completions", `{"model":"gpt-3.5-turbo-instruct","prompt":"Say this is a test"}`, tokens.CL100K.Count("Say this is a test")},
		{"completions array", "/v1/completions", `{"model":"gpt-4o","prompt":["a b","c d"]}`, enc("a b") + enc("c d")},
		{"completions token ids", "/v1/completions", `{"model":"gpt-4o","prompt":[[1,2,3],[4]]}`, 4},
		{"embeddings", "/v1/embeddings", `{"model":"text-embedding-3-small","input":["hello world","bye"]}`, tokens.CL100K.Count("hello world") + tokens.CL100K.Count("bye")},
		{"embeddings ids", "/v1/embeddings", `{"model":"text-embedding-3-small","input":[1,2,3]}`, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			q := classifyBody(t, r, c.path, c.body)
			assert.Equal(t, c.want, q.PromptTokens)
		})
	}
}

func TestClassifyFields(t *testing.T) {
	r := testRouter(t)
	q := classifyBody(t, r, "/v1/chat/completions", `{"model":"gpt-4.1","stream":true,"max_completion_tokens":512,"messages":[{"role":"user","content":"x"}]}`)
	assert.Equal(t, Request{Endpoint: EndpointChat, Model: "gpt-4.1", Stream: true, MaxTokens: 512, PromptTokens: q.PromptTokens, Bucket: BucketShort, Load: r, Budget: noBudgets{}, MaxInputTokens: 1047576, MaxOutputTokens: 32768}, q)
	q = classifyBody(t, r, "/v1/responses", `{"model":"gpt-4.1","max_output_tokens":77,"input":"x"}`)
	assert.Equal(t, 77, q.MaxTokens)
	q = classifyBody(t, r, "/v1/chat/completions", `{"model":"gpt-4.1","max_tokens":-5,"stream":"yes"}`)
	assert.Zero(t, q.MaxTokens)
	assert.False(t, q.Stream)
}

func TestClassifyWireFixtures(t *testing.T) {
	r := testRouter(t)
	for _, name := range []string{"chat_request_default.json", "chat_request_with_tools.json", "chat_request_recorded_tools_stream.json",
		"chat_request_stream_include_usage.json", "responses_request_items_input.json", "responses_request_stream_instructions.json",
		"responses_request_string_input.json"} {
		t.Run(name, func(t *testing.T) {
			path := "/v1/chat/completions"
			if strings.HasPrefix(name, "responses") {
				path = "/v1/responses"
			}
			q := classifyBody(t, r, path, string(fixture(t, name)))
			assert.Positive(t, q.PromptTokens)
			assert.NotEmpty(t, q.Model)
		})
	}
}

func TestBuckets(t *testing.T) {
	b := Buckets{Mid: 200, Long: 900}
	for n, want := range map[int]string{0: "short", 199: "short", 200: "mid", 899: "mid", 900: "long", 1 << 20: "long"} {
		assert.Equal(t, want, b.Bucket(n), n)
	}
	r, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://127.0.0.1:1"}}, Buckets: Buckets{Mid: 2, Long: 10}})
	require.NoError(t, err)
	q := r.classify("POST", "/v1/chat/completions", nil, []byte(chatBody("gpt-4o", "hello")))
	assert.Equal(t, BucketMid, q.req.Bucket)
}

type fakeLoad map[string]bool

func (f fakeLoad) Busy(model string) bool { return f[model] }

func mustRead(t *testing.T, req *http.Request) string {
	t.Helper()
	var sb strings.Builder
	buf := make([]byte, 512)
	for {
		n, err := req.Body.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return sb.String()
}

func FuzzClassify(f *testing.F) {
	f.Add("/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`)
	f.Add("/v1/responses", `{"model":"gpt-4o","input":[{"role":"user","content":[{"type":"input_text","text":"x"}]}],"tools":[{"type":"function","name":"f","parameters":{"properties":{"a":{"type":"string","enum":[1,"b"]}}}}]}`)
	f.Add("/v1/embeddings", `{"input":[[1,2],[3]]}`)
	f.Add("/v1/completions", `{"prompt":`)
	r, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://127.0.0.1:1"}}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, path, body string) {
		if len(body) > 1<<14 {
			return
		}
		q := r.classify("POST", path, nil, []byte(body))
		if q.req.PromptTokens < 0 {
			t.Fatalf("negative count %d", q.req.PromptTokens)
		}
		if !json.Valid([]byte(body)) && q.req.PromptTokens != 0 {
			t.Fatalf("invalid JSON counted %d tokens", q.req.PromptTokens)
		}
	})
}

// classifyReference is what classify found before it read bodies in one
// pass: jsonscan.Valid, then gjson for the fields and the count, and the
// key from prompt.AppendCanonical.
func classifyReference(r *Router, path string, body []byte) classified {
	c := classified{req: Request{Load: r, Endpoint: prompt.Endpoint(path), Budget: noBudgets{}, Priority: priorityOf(nil)}}
	c.req.Bucket = r.s.buckets.Bucket(0)
	if c.req.Endpoint == "" || len(body) == 0 || !jsonscan.Valid(body) || !gjson.ParseBytes(body).IsObject() {
		return c
	}
	c.json = true
	c.body = string(body)
	r.classifyRef(&c)
	return c
}

// checkClassify asserts that classify (cold, then warm memo) and the
// reference agree on body.
func checkClassify(t *testing.T, fast, ref *Router, path, body string) {
	t.Helper()
	want := classifyReference(ref, path, []byte(body))
	for _, pass := range []string{"cold", "warm"} {
		got := fast.classify("POST", path, nil, []byte(body))
		got.body, want.body = "", ""
		got.req.Load, want.req.Load = nil, nil
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s %s: classify\n got %+v\nwant %+v\nbody %q", pass, path, got, want, body)
		}
	}
}

var classifyPaths = []string{"/v1/chat/completions", "/v1/responses", "/v1/completions", "/v1/embeddings"}

// refRouters returns a router for classify (a fresh memo: the first read of
// a body is cold) and one without memo for the reference, both computing
// affinity keys.
func refRouters(t testing.TB) (fast, ref *Router) {
	var err error
	fast, err = New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}}})
	require.NoError(t, err)
	ref, err = New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}}, MemoEntries: -1})
	require.NoError(t, err)
	return fast, ref
}

// TestClassifyMatchesReference compares classify with the reference
// readers on the wire fixtures, the shapes the readers disagree on, and
// random chat and Responses bodies of real text: long strings with
// escapes, emoji, CJK and invalid UTF-8, whose affinity key's shards fall
// across message boundaries and across the 16×256-byte cut.
func TestClassifyMatchesReference(t *testing.T) {
	// A huge string, and nesting past jsonscan.MaxDepth (not JSON, read
	// without recursion) and up to it.
	huge := chatBody("gpt-4o", strings.Repeat(`h\u00e9llo \n w\u00f6rld \"q\" `, 1<<16))
	tooDeep := `{"messages":[{"role":"user","content":"x"}],"x":` + strings.Repeat("[", 1<<20) + strings.Repeat("]", 1<<20) + `}`
	deep := `{"messages":[{"role":"user","content":"x"}],"x":` + strings.Repeat("[", 511) + strings.Repeat("]", 511) + `}`
	files, err := filepath.Glob("testdata/openai-wire/*.json")
	require.NoError(t, err)
	var bodies []string
	for _, f := range files {
		bodies = append(bodies, string(fixture(t, filepath.Base(f))))
	}
	bodies = append(bodies, cookbookBody("gpt-4o"), cookbookBody("gpt-4"), chatBody("gpt-4.1", benchPrompt(4<<10)),
		string(newOverheadBody(t).b), `{"model":"gpt-4","model":1}`, `{"model":"gpt\u002d4","messages":[{"role":"user","content":"x"}]}`,
		`{"mod\u0065l":"gpt-4","messages":[{"role":"user","content":"x"}]}`, `{"max_tokens":5,"max_output_tokens":7.9,"max_completion_tokens":-1,"stream":true}`,
		`{"max_tokens":1e300}`, `{"messages":[{"ro\u006ce":"system","content":"S"}]}`,
		huge, tooDeep, deep)
	// Shards past the first 2048 canonical bytes (runs of few tokens), and
	// prompts sharing a system prompt (shard ends warm, the key cold).
	for _, run := range []string{strings.Repeat(" ", 3000), strings.Repeat("a", 5000), strings.Repeat("QUJD", 900), strings.Repeat("!", 2500), strings.Repeat("\\n", 1500)} {
		bodies = append(bodies, `{"model":"gpt-4o","messages":[{"role":"system","content":"S `+run+` E"},{"role":"user","content":"Q"}]}`,
			`{"model":"gpt-4","prompt":"`+run+`"}`)
	}
	system := randText(rand.New(rand.NewPCG(5, 6)), 1500)
	for i := range 20 {
		bodies = append(bodies, `{"model":"gpt-4o","messages":[{"role":"system","content":"`+system+`"},{"role":"user","content":"`+
			randText(rand.New(rand.NewPCG(uint64(i), 0)), 400*(i%4))+`"}]}`)
	}
	rng := rand.New(rand.NewPCG(7, 8))
	n := 300
	if testing.Short() {
		n = 50
	}
	for range n {
		bodies = append(bodies, randRequest(rng))
	}
	fast, ref := refRouters(t)
	for _, body := range bodies {
		for _, path := range classifyPaths {
			checkClassify(t, fast, ref, path, body)
		}
	}
	assert.Greater(t, fast.classify("POST", classifyPaths[0], nil, []byte(huge)).req.PromptTokens, 1<<18, "the huge body is JSON")
	assert.False(t, fast.classify("POST", classifyPaths[0], nil, []byte(tooDeep)).json, "deeper than MaxDepth")
	assert.True(t, fast.classify("POST", classifyPaths[0], nil, []byte(deep)).json, "MaxDepth deep")
}

func FuzzClassifyMatchesReference(f *testing.F) {
	rng := rand.New(rand.NewPCG(9, 10))
	for range 20 {
		f.Add(uint8(0), randRequest(rng))
	}
	f.Add(uint8(1), `{"instructions":"Be brief.","input":[{"role":"user","content":[{"type":"input_text","text":"Hi"}]}]}`)
	f.Add(uint8(2), `{"prompt":["a b","c\nd"]}`)
	fast, ref := refRouters(f)
	f.Fuzz(func(t *testing.T, ep uint8, body string) {
		if len(body) > 1<<15 {
			return
		}
		checkClassify(t, fast, ref, classifyPaths[int(ep)%len(classifyPaths)], body)
	})
}

func cookbookBody(model string) string {
	return `{"model":"` + model + `","messages":` + cookbookMessages + `}`
}

// randText returns JSON string contents (escaped as JSON writes them, or
// not) of up to about n bytes.
func randText(rng *rand.Rand, n int) string {
	frags := []string{"The quick brown fox", " jumps", " over the lazy dog.", " It's", " they'll", "\\n", "\\n\\n", "\\t", "  ", " 42", "3.14",
		" 東京 の 天気", "。", " 😀", "\\ud83d\\ude00", "\\u00e9t\\u00e9", "\\ud800", "\\\"quoted\\\"", "\\\\", "\\/", "/", " x/y",
		"\xff", "\xe4\xbd", " don't", "!!!", " ---", "func f() {}", " Überprüfen", "\\r\\n", " ", "a", "A", "ABC", "'s"}
	var b strings.Builder
	for b.Len() < n {
		b.WriteString(frags[rng.IntN(len(frags))])
	}
	return b.String()
}

// randRequest returns a random chat or Responses body of real text.
func randRequest(rng *rand.Rand) string {
	models := []string{"gpt-4o", "gpt-4", "gpt-4.1", "text-embedding-3-small"}
	size := func() int { return []int{0, 10, 60, 300, 1500, 5000}[rng.IntN(6)] }
	str := func() string { return `"` + randText(rng, size()) + `"` }
	content := func() string {
		if rng.IntN(3) > 0 {
			return str()
		}
		var parts []string
		for range rng.IntN(4) {
			switch rng.IntN(4) {
			case 0:
				parts = append(parts, `{"type":"image_url","image_url":{"url":"https://x/y.png"}}`)
			case 1:
				parts = append(parts, `{"type":"refusal","refusal":`+str()+`}`)
			default:
				parts = append(parts, `{"type":"text","text":`+str()+`}`)
			}
		}
		return "[" + strings.Join(parts, ",") + "]"
	}
	roles := []string{"system", "developer", "user", "assistant", "tool"}
	var msgs []string
	for range rng.IntN(6) {
		m := `{"role":"` + roles[rng.IntN(len(roles))] + `","content":` + content()
		if rng.IntN(5) == 0 {
			m += `,"name":"n` + strconv.Itoa(rng.IntN(9)) + `"`
		}
		if rng.IntN(5) == 0 {
			m += `,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":` + str() + `}}]`
		}
		if rng.IntN(6) == 0 {
			m += `,"content":` + content() // a repeated member
		}
		msgs = append(msgs, m+"}")
	}
	tools := ""
	if rng.IntN(3) == 0 {
		tools = `,"tools":[{"type":"function","function":{"name":"lookup","description":` + str() + `,"parameters":{"type":"object","properties":{"q":{"type":"string","enum":["a","b"]}}}}}]`
	}
	model := `"model":"` + models[rng.IntN(len(models))] + `"`
	switch rng.IntN(4) {
	case 0:
		return `{` + model + `,"instructions":` + str() + `,"input":[` + strings.Join(msgs, ",") + `]` + tools + `}`
	case 1:
		return `{` + model + `,"input":` + str() + `,"prompt":[` + str() + `,1,` + str() + `]}`
	}
	return `{` + model + `,"messages":[` + strings.Join(msgs, ", ") + `]` + tools + `,"max_tokens":` + strconv.Itoa(rng.IntN(3)*100) + `}`
}
