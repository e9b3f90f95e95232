package relaytest

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
)

const chatHello = `{"model":"gpt-4o","messages":[{"role":"user","content":"Hello"}]}`

func TestCountTokens(t *testing.T) {
	assert.Equal(t, 0, countTokens(""))
	assert.Equal(t, 1, countTokens("Hello"))
	assert.Equal(t, 2, countTokens("Hello world"))

	// Long unbroken runs and long texts are counted (how fast is the
	// counter's concern: internal/bpe's benchmarks).
	assert.Equal(t, 8192, countTokens(strings.Repeat("a", 64<<10)))
	long := countTokens(strings.Repeat("hello world ", 30000)) // 360 KB
	assert.InDelta(t, 60000, long, 10)
}

func TestPieces(t *testing.T) {
	assert.Equal(t, []string{"Hello", " from", " relaytest", ".", " Hello", " from", " relaytest", "."},
		Pieces("Hello from relaytest.", 8))
	assert.Equal(t, []string{"Hello", " from"}, Pieces("Hello from relaytest.", 2))
	assert.Equal(t, []string{"I", "'", "m", " here"}, Pieces("I'm here", 4))
	assert.Equal(t, []string{"", ""}, Pieces("", 2))
	assert.Nil(t, Pieces("x", 0))
}

func TestChatCompletion(t *testing.T) {
	s := newServer(t, WithName("us-east"))
	resp, body := post(t, s, "/chat/completions",
		`{"model":"gpt-4o-mini","messages":[{"role":"system","content":"Be brief."},{"role":"user","name":"bob","content":[{"type":"text","text":"Hello"},{"type":"image_url","image_url":{"url":"x"}}]}]}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	assert.Equal(t, "us-east", resp.Header.Get(NameHeader))
	assert.NotEmpty(t, resp.Header.Get("X-Request-Id"))

	j := gjson.ParseBytes(body)
	assert.True(t, strings.HasPrefix(j.Get("id").Str, "chatcmpl-"))
	assert.Equal(t, "chat.completion", j.Get("object").Str)
	assert.NotZero(t, j.Get("created").Int())
	assert.Equal(t, "gpt-4o-mini", j.Get("model").Str)
	assert.Equal(t, "assistant", j.Get("choices.0.message.role").Str)
	assert.Equal(t, "Hello from relaytest. Hello from relaytest.", j.Get("choices.0.message.content").Str)
	assert.Equal(t, "stop", j.Get("choices.0.finish_reason").Str)
	// system: 3 + "system" 1 + "Be brief." 3; user: 3 + "user" 1 + "Hello" 1 + name "bob" 1 + 1; reply 3.
	prompt := 3 + countTokens("system") + countTokens("Be brief.") +
		3 + countTokens("user") + countTokens("Hello") + countTokens("bob") + 1 + 3
	assert.Equal(t, 17, prompt)
	assert.Equal(t, int64(prompt), j.Get("usage.prompt_tokens").Int())
	assert.Equal(t, int64(8), j.Get("usage.completion_tokens").Int())
	assert.Equal(t, int64(prompt+8), j.Get("usage.total_tokens").Int())
	assert.True(t, j.Get("usage.prompt_tokens_details.cached_tokens").Exists())
	assert.True(t, j.Get("usage.completion_tokens_details.reasoning_tokens").Exists())
}

func TestChatMaxTokensCachedReasoning(t *testing.T) {
	s := newServer(t, WithReply("One two three four five six."), WithCompletionTokens(20))
	s.Script(Fault{CachedTokens: 4, ReasoningTokens: 2}, Fault{CachedTokens: 1000, ReasoningTokens: 1000}, Fault{NoUsage: true})

	_, body := post(t, s, "/chat/completions",
		`{"model":"o3","max_completion_tokens":5,"messages":[{"role":"user","content":"Hello"}]}`)
	j := gjson.ParseBytes(body)
	assert.Equal(t, "length", j.Get("choices.0.finish_reason").Str)
	assert.Equal(t, int64(8), j.Get("usage.prompt_tokens").Int())
	assert.Equal(t, int64(5), j.Get("usage.completion_tokens").Int())
	assert.Equal(t, int64(4), j.Get("usage.prompt_tokens_details.cached_tokens").Int())
	assert.Equal(t, int64(2), j.Get("usage.completion_tokens_details.reasoning_tokens").Int())
	assert.Equal(t, "One two three", j.Get("choices.0.message.content").Str) // 5 - 2 reasoning

	_, body = post(t, s, "/chat/completions", `{"model":"o3","max_tokens":50,"messages":[{"role":"user","content":"Hello"}]}`)
	j = gjson.ParseBytes(body)
	assert.Equal(t, "stop", j.Get("choices.0.finish_reason").Str)
	assert.Equal(t, int64(20), j.Get("usage.completion_tokens").Int())
	assert.Equal(t, int64(8), j.Get("usage.prompt_tokens_details.cached_tokens").Int(), "clamped to prompt")
	assert.Equal(t, int64(20), j.Get("usage.completion_tokens_details.reasoning_tokens").Int(), "clamped to completion")
	assert.Equal(t, "", j.Get("choices.0.message.content").Str)

	_, body = post(t, s, "/chat/completions", chatHello)
	assert.False(t, gjson.GetBytes(body, "usage").Exists())
}

func TestChatToolCall(t *testing.T) {
	s := newServer(t)
	s.Script(Fault{ToolCall: true})
	_, body := post(t, s, "/chat/completions", chatHello)
	j := gjson.ParseBytes(body)
	assert.Equal(t, "tool_calls", j.Get("choices.0.finish_reason").Str)
	assert.Equal(t, gjson.Null, j.Get("choices.0.message.content").Type)
	assert.Equal(t, "get_weather", j.Get("choices.0.message.tool_calls.0.function.name").Str)
	assert.Equal(t, `{"city":"Paris"}`, j.Get("choices.0.message.tool_calls.0.function.arguments").Str)
	assert.Equal(t, "function", j.Get("choices.0.message.tool_calls.0.type").Str)
}

func TestResponses(t *testing.T) {
	s := newServer(t, WithReply("Hi there!"), WithCompletionTokens(4))
	s.Script(Fault{CachedTokens: 2, ReasoningTokens: 1})
	_, body := post(t, s, "/responses",
		`{"model":"gpt-5","instructions":"You are a helpful assistant.","input":[{"role":"user","content":[{"type":"input_text","text":"Hello"}]}],"max_output_tokens":100}`)
	j := gjson.ParseBytes(body)
	assert.True(t, strings.HasPrefix(j.Get("id").Str, "resp_"))
	assert.Equal(t, "response", j.Get("object").Str)
	assert.Equal(t, "completed", j.Get("status").Str)
	assert.Equal(t, "gpt-5", j.Get("model").Str)
	assert.Equal(t, "You are a helpful assistant.", j.Get("instructions").Str)
	assert.Equal(t, int64(100), j.Get("max_output_tokens").Int())
	assert.Equal(t, "message", j.Get("output.0.type").Str)
	assert.Equal(t, "assistant", j.Get("output.0.role").Str)
	assert.Equal(t, "output_text", j.Get("output.0.content.0.type").Str)
	assert.Equal(t, "Hi there!", j.Get("output.0.content.0.text").Str) // 4 - 1 reasoning pieces
	prompt := 3 + countTokens("You are a helpful assistant.") + 3 + countTokens("user") + countTokens("Hello") + 3
	assert.Equal(t, int64(prompt), j.Get("usage.input_tokens").Int())
	assert.Equal(t, int64(2), j.Get("usage.input_tokens_details.cached_tokens").Int())
	assert.Equal(t, int64(4), j.Get("usage.output_tokens").Int())
	assert.Equal(t, int64(1), j.Get("usage.output_tokens_details.reasoning_tokens").Int())
	assert.Equal(t, int64(prompt+4), j.Get("usage.total_tokens").Int())

	_, body = post(t, s, "/responses", `{"model":"gpt-5","input":"Hello"}`)
	j = gjson.ParseBytes(body)
	assert.Equal(t, int64(3+1+3), j.Get("usage.input_tokens").Int())
	assert.Equal(t, gjson.Null, j.Get("instructions").Type)
}

func TestCompletionsAndEmbeddings(t *testing.T) {
	s := newServer(t)
	_, body := post(t, s, "/completions", `{"model":"gpt-3.5-turbo-instruct","prompt":["Hello","Hello world"],"max_tokens":3}`)
	j := gjson.ParseBytes(body)
	assert.Equal(t, "text_completion", j.Get("object").Str)
	assert.Equal(t, "Hello from relaytest", j.Get("choices.0.text").Str)
	assert.Equal(t, "length", j.Get("choices.0.finish_reason").Str)
	assert.Equal(t, int64(3), j.Get("usage.prompt_tokens").Int())
	assert.Equal(t, int64(3), j.Get("usage.completion_tokens").Int())
	assert.Equal(t, int64(6), j.Get("usage.total_tokens").Int())

	_, body = post(t, s, "/embeddings", `{"model":"text-embedding-3-small","input":["Hello","Hello world"]}`)
	j = gjson.ParseBytes(body)
	assert.Equal(t, "list", j.Get("object").Str)
	require.Len(t, j.Get("data").Array(), 2)
	assert.Equal(t, "embedding", j.Get("data.1.object").Str)
	assert.Equal(t, int64(1), j.Get("data.1.index").Int())
	assert.Len(t, j.Get("data.0.embedding").Array(), 8)
	assert.NotEqual(t, j.Get("data.0.embedding").Raw, j.Get("data.1.embedding").Raw)
	assert.Equal(t, int64(3), j.Get("usage.prompt_tokens").Int())
	assert.Equal(t, int64(3), j.Get("usage.total_tokens").Int())
	assert.Equal(t, "text-embedding-3-small", j.Get("model").Str)

	_, body = post(t, s, "/embeddings", `{"model":"m","input":"Hello","dimensions":4,"encoding_format":"base64"}`)
	assert.Len(t, gjson.GetBytes(body, "data.0.embedding").Str, 24) // 16 bytes
}

func TestModelsNotFoundBadJSON(t *testing.T) {
	s := newServer(t, WithName("x"), WithModels("a", "b"))
	resp, err := s.Client().Get(s.URL + "/models")
	require.NoError(t, err)
	var ids []string
	body := readBody(t, resp)
	for _, m := range gjson.GetBytes(body, "data.#.id").Array() {
		ids = append(ids, m.Str)
	}
	assert.Equal(t, []string{"a", "b"}, ids)
	assert.Equal(t, "list", gjson.GetBytes(body, "object").Str)

	resp, err = s.Client().Get(s.URL + "/models/b")
	require.NoError(t, err)
	assert.Equal(t, "b", gjson.GetBytes(readBody(t, resp), "id").Str)

	resp, body = post(t, s, "/nothing", `{}`)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	assert.Equal(t, "x", resp.Header.Get(NameHeader))
	assert.Equal(t, "invalid_request_error", gjson.GetBytes(body, "error.type").Str)

	resp, body = post(t, s, "/chat/completions", `{"model": "gpt-4o", "messages": [`)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Equal(t, "invalid_request_error", gjson.GetBytes(body, "error.type").Str)
	assert.True(t, gjson.GetBytes(body, "error.param").Exists())
	assert.True(t, gjson.GetBytes(body, "error.code").Exists())

	recs := s.Requests()
	require.Len(t, recs, 4)
	assert.Equal(t, "models", recs[0].Endpoint)
	assert.Equal(t, "", recs[2].Endpoint)
	assert.Equal(t, "/v1/nothing", recs[2].Path)
	assert.Equal(t, "chat/completions", recs[3].Endpoint)
	assert.Equal(t, `{"model": "gpt-4o", "messages": [`, string(recs[3].Body))
	assert.Equal(t, "", recs[3].Model)
}

func readBody(t *testing.T, resp *http.Response) []byte {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return b
}

func TestScriptOrderStatusHeader(t *testing.T) {
	s := newServer(t)
	s.Script(
		Fault{Status: 429, Header: http.Header{"Retry-After": {"2"}, "Retry-After-Ms": {"1500"}, "X-Ratelimit-Remaining-Tokens": {"0"}}},
		Fault{Status: 500},
		Fault{Status: 401},
		Fault{},
		Fault{Status: 400, Body: `{"oops":true}`, ContentType: "text/event-stream"},
	)
	assert.Equal(t, 5, s.Pending())
	s.SetDefault(Fault{Status: 503, Header: http.Header{"X-Should-Retry": {"true"}}})

	type want struct {
		status     int
		typ, code  string
		header     string
		headerWant string
	}
	wants := []want{
		{429, "requests", "rate_limit_exceeded", "Retry-After-Ms", "1500"},
		{500, "server_error", "", "", ""},
		{401, "invalid_request_error", "invalid_api_key", "", ""},
		{200, "", "", "", ""},
		{400, "", "", "Content-Type", "text/event-stream"},
		{503, "server_error", "", "X-Should-Retry", "true"},
		{503, "server_error", "", "X-Should-Retry", "true"},
	}
	for i, w := range wants {
		resp, body := post(t, s, "/responses", `{"model":"gpt-4o","input":"hi"}`)
		assert.Equal(t, w.status, resp.StatusCode, "call %d", i)
		if w.typ != "" {
			assert.Equal(t, w.typ, gjson.GetBytes(body, "error.type").Str, "call %d", i)
			assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			assert.NotEmpty(t, gjson.GetBytes(body, "error.message").Str)
		}
		if w.code != "" {
			assert.Equal(t, w.code, gjson.GetBytes(body, "error.code").Str, "call %d", i)
		}
		if w.header != "" {
			assert.Equal(t, w.headerWant, resp.Header.Get(w.header), "call %d", i)
		}
		if i == 0 {
			assert.Equal(t, "2", resp.Header.Get("Retry-After"))
		}
		if i == 4 {
			assert.Equal(t, `{"oops":true}`, string(body))
		}
	}
	assert.Equal(t, 7, s.Calls())
	assert.Equal(t, 0, s.Pending())

	s.Reset()
	assert.Equal(t, 0, s.Calls())
	resp, _ := post(t, s, "/responses", `{"model":"gpt-4o","input":"hi"}`)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

func TestRequestsRecorded(t *testing.T) {
	s := newServer(t)
	req, err := http.NewRequest(http.MethodPost, s.URL+"/chat/completions?api-version=1", strings.NewReader(
		`{"model":"gpt-4o","stream":true,"messages":[]}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer sk-test")
	resp, err := s.Client().Do(req)
	require.NoError(t, err)
	readBody(t, resp)

	recs := s.Requests()
	require.Len(t, recs, 1)
	r := recs[0]
	assert.Equal(t, http.MethodPost, r.Method)
	assert.Equal(t, "/v1/chat/completions", r.Path)
	assert.Equal(t, "api-version=1", r.RawQuery)
	assert.Equal(t, "Bearer sk-test", r.Header.Get("Authorization"))
	assert.Equal(t, "gpt-4o", r.Model)
	assert.True(t, r.Stream)

	// Copies: changing them does not change the server's records.
	r.Body[0] = 'X'
	r.Header.Set("Authorization", "changed")
	again := s.Requests()[0]
	assert.Equal(t, byte('{'), again.Body[0])
	assert.Equal(t, "Bearer sk-test", again.Header.Get("Authorization"))
}

func TestDrop(t *testing.T) {
	s := newServer(t)
	s.Script(Fault{Drop: true})
	resp, err := s.Client().Post(s.URL+"/chat/completions", "application/json", strings.NewReader(chatHello))
	require.Error(t, err)
	assert.Nil(t, resp)
	assert.Equal(t, 1, s.Calls())

	r, _ := post(t, s, "/chat/completions", chatHello)
	assert.Equal(t, http.StatusOK, r.StatusCode)
}

func TestHangClientTimeout(t *testing.T) {
	s := newServer(t)
	s.SetDefault(Fault{Hang: true})
	c := &http.Client{Timeout: 50 * time.Millisecond, Transport: s.Client().Transport}
	_, err := c.Post(s.URL+"/chat/completions", "application/json", strings.NewReader(chatHello))
	require.Error(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/responses", strings.NewReader(`{}`))
		_, err := s.Client().Do(req)
		done <- err
	}()
	waitCalls(t, s, 2)
	cancel()
	assert.ErrorIs(t, <-done, context.Canceled)
}

// waitCalls waits until the server has received n calls.
func waitCalls(t *testing.T, s *Server, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for s.Calls() < n {
		if time.Now().After(deadline) {
			t.Fatalf("server got %d calls, want %d", s.Calls(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestCloseWithHungCalls(t *testing.T) {
	s := NewServer()
	s.Script(Fault{Hang: true}, Fault{Delay: time.Hour}, Fault{StallAfter: 1})
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for i, ep := range []string{"/chat/completions", "/embeddings", "/chat/completions"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := `{"model":"m","input":"x","messages":[],"stream":true}`
			resp, err := s.Client().Post(s.URL+ep, "application/json", strings.NewReader(body))
			if err == nil {
				_, err = readAllErr(resp)
			}
			errs <- err
		}()
		waitCalls(t, s, i+1)
	}
	// The calls hang until the server closes: a Close that waited for them
	// would never return (and the test would end at go test's -timeout).
	s.Close()
	s.Close() // again: no-op
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.Error(t, err, "an aborted call must not look like a clean answer")
	}
}

func readAllErr(resp *http.Response) ([]byte, error) {
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

func TestDelayAndLatency(t *testing.T) {
	s := newServer(t, WithLatency(20*time.Millisecond))
	s.Script(Fault{Delay: 30 * time.Millisecond})
	start := time.Now()
	post(t, s, "/chat/completions", chatHello)
	assert.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond)

	// A long delay ends when the client goes away.
	s.Script(Fault{Delay: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/chat/completions", strings.NewReader(chatHello))
	_, err := s.Client().Do(req)
	assert.True(t, errors.Is(err, context.DeadlineExceeded), "err = %v", err)
}

func TestConcurrent(t *testing.T) {
	s := newServer(t)
	const workers, per = 16, 20
	statuses := []int{429, 500, 503}
	for i := 0; i < workers*per/2; i++ {
		s.Script(Fault{Status: statuses[i%3]})
	}
	var mu sync.Mutex
	got := map[int]int{}
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				ep := []string{"/chat/completions", "/responses", "/embeddings", "/completions"}[i%4]
				resp, err := s.Client().Post(s.URL+ep, "application/json",
					strings.NewReader(`{"model":"m","input":"Hello","prompt":"Hello","messages":[{"role":"user","content":"Hello"}]}`))
				if !assert.NoError(t, err) {
					return
				}
				readBody(t, resp)
				mu.Lock()
				got[resp.StatusCode]++
				mu.Unlock()
				if i == per/2 {
					_ = s.Requests()
					_ = s.Pending()
				}
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, workers*per, s.Calls())
	assert.Equal(t, map[int]int{200: workers * per / 2, 429: 54, 500: 53, 503: 53}, got)
}

// TestEndpointsMatchExactly: the server answers only the API's exact paths,
// so a BaseURL that already ends in an endpoint, or misses "/v1", fails
// the user's test as it would fail against the real API.
func TestEndpointsMatchExactly(t *testing.T) {
	s := newServer(t)
	root := strings.TrimSuffix(s.URL, "/v1")
	cases := []struct {
		method, path string
		endpoint     string // "": answered 404
	}{
		{http.MethodPost, "/v1/chat/completions", epChat},
		{http.MethodPost, "/v1/responses", epResponses},
		{http.MethodPost, "/v1/completions", epCompletions},
		{http.MethodPost, "/v1/embeddings", epEmbeddings},
		{http.MethodGet, "/v1/models", epModels},
		{http.MethodGet, "/v1/models/gpt-4o", epModel},
		{http.MethodPost, "/v1/chat/completions/chat/completions", ""},
		{http.MethodPost, "/v1/v1/chat/completions", ""},
		{http.MethodPost, "/chat/completions", ""},
		{http.MethodPost, "/openai/v1/chat/completions", ""},
		{http.MethodPost, "/v1/chat/completions/", ""},
		{http.MethodGet, "/v1/models/", ""},
		{http.MethodGet, "/v1/models/a/b", ""},
		{http.MethodGet, "/v1/chat/completions", ""},
	}
	for _, c := range cases {
		t.Run(c.method+" "+c.path, func(t *testing.T) {
			s.Reset()
			req, _ := http.NewRequest(c.method, root+c.path, strings.NewReader(chatHello))
			resp, err := s.Client().Do(req)
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.Len(t, s.Requests(), 1)
			assert.Equal(t, c.endpoint, s.Requests()[0].Endpoint)
			if c.endpoint == "" {
				assert.Equal(t, http.StatusNotFound, resp.StatusCode)
				assert.Contains(t, gjson.GetBytes(body, "error.message").Str, "Invalid URL ("+c.method+" "+c.path+")")
			} else {
				assert.Equal(t, http.StatusOK, resp.StatusCode)
			}
		})
	}
}
