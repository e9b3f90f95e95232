package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	openai "github.com/sashabaranov/go-openai"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relaytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixture is a gateway over one relaytest upstream, served by httptest.
type fixture struct {
	up      *relaytest.Server
	g       *gateway
	ts      *httptest.Server
	mu      sync.Mutex
	reports []relay.Report
}

func newFixture(t *testing.T, mod func(*config), opts ...relaytest.Option) *fixture {
	t.Helper()
	f := &fixture{up: relaytest.NewServer(append([]relaytest.Option{relaytest.WithCompletionTokens(100)}, opts...)...)}
	t.Cleanup(f.up.Close)
	cfg := config{
		Upstreams: []relay.Upstream{{Name: "up", BaseURL: f.up.URL, APIKey: "sk-upstream"}},
		Model:     "gpt-4.1",
		Retry:     relay.RetryConfig{MaxAttempts: 1},
		OnReport: func(r relay.Report) {
			f.mu.Lock()
			f.reports = append(f.reports, r)
			f.mu.Unlock()
		},
	}
	if mod != nil {
		mod(&cfg)
	}
	g, err := newGateway(cfg)
	require.NoError(t, err)
	f.g = g
	f.ts = httptest.NewServer(g)
	t.Cleanup(func() { f.ts.Close(); g.Close() })
	return f
}

func (f *fixture) client() *openai.Client {
	cfg := openai.DefaultConfig("sk-client")
	cfg.BaseURL = f.ts.URL + "/v1"
	cfg.HTTPClient = f.ts.Client()
	return openai.NewClientWithConfig(cfg)
}

func (f *fixture) post(t *testing.T, path, body string) (*http.Response, []byte) {
	t.Helper()
	resp, err := f.ts.Client().Post(f.ts.URL+path, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, b
}

func TestChatCompletionsJSON(t *testing.T) {
	f := newFixture(t, nil)
	resp, err := f.client().CreateChatCompletion(context.Background(), openai.ChatCompletionRequest{
		Model:     "gpt-4.1",
		Messages:  []openai.ChatCompletionMessage{{Role: "user", Content: "Say hello."}},
		MaxTokens: 8,
	})
	require.NoError(t, err)
	assert.Equal(t, "Hello from relaytest. Hello from relaytest.", resp.Choices[0].Message.Content)
	assert.Equal(t, 8, resp.Usage.CompletionTokens)
	assert.Equal(t, "up", resp.Header().Get(relay.HeaderUpstream))
	assert.True(t, strings.HasPrefix(resp.Header().Get(IDHeader), "gw-"))

	recs := f.up.Requests()
	require.Len(t, recs, 1)
	assert.Equal(t, "Bearer sk-upstream", recs[0].Header.Get("Authorization"), "the client's key is not forwarded")
	assert.Equal(t, "/v1/chat/completions", recs[0].Path)
	f.mu.Lock()
	defer f.mu.Unlock()
	require.Len(t, f.reports, 1)
	assert.Contains(t, []string{"short", "mid", "long"}, f.reports[0].Bucket, "logs see the plain bucket label")
	assert.Equal(t, relay.BucketShort, f.reports[0].Bucket)
}

func TestChatCompletionsDefaultModel(t *testing.T) {
	f := newFixture(t, nil)
	resp, b := f.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	assert.Equal(t, "gpt-4.1", f.up.Requests()[0].Model)
}

// TestChatCompletionsStream: go-openai's stream client works through the
// gateway, usage included.
func TestChatCompletionsStream(t *testing.T) {
	f := newFixture(t, nil)
	st, err := f.client().CreateChatCompletionStream(context.Background(), openai.ChatCompletionRequest{
		Model:         "gpt-4.1",
		Messages:      []openai.ChatCompletionMessage{{Role: "user", Content: "Say hello."}},
		MaxTokens:     8,
		Stream:        true,
		StreamOptions: &openai.StreamOptions{IncludeUsage: true},
	})
	require.NoError(t, err)
	defer st.Close()
	var text strings.Builder
	var usage *openai.Usage
	for {
		ev, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		if len(ev.Choices) > 0 {
			text.WriteString(ev.Choices[0].Delta.Content)
		}
		if ev.Usage != nil {
			usage = ev.Usage
		}
	}
	assert.Equal(t, "Hello from relaytest. Hello from relaytest.", text.String())
	require.NotNil(t, usage)
	assert.Equal(t, 8, usage.CompletionTokens)
	assert.True(t, f.up.Requests()[0].Stream)
}

// TestStreamFlushed: events reach the client as the upstream sends them.
// The upstream stalls after two events; both arrive through the gateway
// while the upstream is still holding the stream open, so nothing is
// buffered to the end.
func TestStreamFlushed(t *testing.T) {
	f := newFixture(t, nil)
	f.up.Script(relaytest.Fault{StallAfter: 2})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.ts.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"gpt-4.1","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	require.NoError(t, err)
	resp, err := f.ts.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/event-stream", strings.Split(resp.Header.Get("Content-Type"), ";")[0])
	br := bufio.NewReader(resp.Body)
	var events []string
	for len(events) < 2 {
		line, err := br.ReadString('\n')
		require.NoError(t, err)
		if strings.HasPrefix(line, "data: ") {
			events = append(events, line)
		}
	}
	assert.Contains(t, events[0], `"role":"assistant"`)
	cancel() // the client leaves; the gateway and the upstream let go
}

func TestChat(t *testing.T) {
	f := newFixture(t, func(c *config) {
		c.Upstreams[0].PriceFactor = 0.5
		c.Policy = relay.ClusterPolicy{Fast: "gpt-4o-mini", WindowMin: 1, WindowMax: 100}
	})
	resp, b := f.post(t, "/v1/chat", `{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Say hello."}],"temperature":0.2,"max_tokens":6}`)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))

	var got map[string]any
	require.NoError(t, json.Unmarshal(b, &got))
	assert.ElementsMatch(t, []string{"model", "tokens", "ms", "cost", "content"}, keys(got))
	assert.Equal(t, "gpt-4o-mini", got["model"], "routed by the policy")
	assert.Equal(t, "Hello from relaytest. Hello from", got["content"])

	f.mu.Lock()
	require.Len(t, f.reports, 1)
	rep := f.reports[0]
	f.mu.Unlock()
	assert.Equal(t, float64(rep.Usage.PromptTokens+rep.Usage.CompletionTokens), got["tokens"])
	assert.Equal(t, 6, rep.Usage.CompletionTokens)
	assert.Greater(t, rep.Usage.PromptTokens, 10)
	assert.InDelta(t, rep.CostUSD, got["cost"], 1e-12)
	assert.InDelta(t, rep.ListCostUSD*0.5, got["cost"], 1e-12, "the upstream's price factor")
	assert.Greater(t, got["cost"], 0.0)
	assert.GreaterOrEqual(t, got["ms"], 0.0)

	rec := f.up.Requests()[0]
	assert.Equal(t, "gpt-4o-mini", rec.Model)
	var sent map[string]any
	require.NoError(t, json.Unmarshal(rec.Body, &sent))
	assert.Equal(t, 0.2, sent["temperature"])
	assert.Equal(t, 6.0, sent["max_tokens"])
}

// TestChatConcurrent: each /v1/chat answer carries its own report, however
// the requests interleave.
func TestChatConcurrent(t *testing.T) {
	f := newFixture(t, nil)
	const n = 24
	var wg sync.WaitGroup
	tokens := make([]float64, n+1)
	prompts := make([]int, n+1)
	for i := 1; i <= n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			content := strings.Repeat("word ", i)
			resp, err := f.ts.Client().Post(f.ts.URL+"/v1/chat", "application/json",
				strings.NewReader(fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"max_tokens":%d}`, content, i)))
			if !assert.NoError(t, err) {
				return
			}
			defer resp.Body.Close()
			var got chatResponse
			if assert.NoError(t, json.NewDecoder(resp.Body).Decode(&got)) {
				tokens[i] = float64(got.Tokens)
			}
		}()
	}
	wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	require.Len(t, f.reports, n)
	for _, r := range f.reports {
		prompts[r.Usage.CompletionTokens] = r.Usage.PromptTokens
	}
	for i := 1; i <= n; i++ {
		assert.Equal(t, float64(prompts[i]+i), tokens[i], "request %d", i)
		assert.Greater(t, prompts[i], i, "request %d has its own report", i)
	}
	n0 := 0
	f.g.pending.Range(func(any, any) bool { n0++; return true })
	assert.Zero(t, n0, "no pending entry left")
}

func TestChatUpstreamError(t *testing.T) {
	f := newFixture(t, nil)
	f.up.Script(relaytest.Fault{Status: http.StatusUnauthorized})
	resp, b := f.post(t, "/v1/chat", `{"messages":[{"role":"user","content":"hi"}]}`)
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	assertOpenAIError(t, b, "", "")
}

func TestNoUpstreamForModel(t *testing.T) {
	f := newFixture(t, func(c *config) { c.Upstreams[0].Models = []string{"gpt-4.1"} })
	resp, b := f.post(t, "/v1/chat", `{"model":"gpt-9","messages":[{"role":"user","content":"hi"}]}`)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	assertOpenAIError(t, b, "model", "model_not_found")
	resp, b = f.post(t, "/v1/chat/completions", `{"model":"gpt-9","messages":[{"role":"user","content":"hi"}]}`)
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
	assertOpenAIError(t, b, "model", "model_not_found")
	assert.Zero(t, f.up.Calls())
}

// TestMalformed: bad requests get 400 in the OpenAI error shape, and no
// upstream is called.
func TestMalformed(t *testing.T) {
	f := newFixture(t, func(c *config) { c.MaxBodyBytes = 2048 })
	msg := `"messages":[{"role":"user","content":"hi"}]`
	for _, tc := range []struct {
		name, path, body, param, code string
	}{
		{"bad json", "/v1/chat/completions", `{"messages":[`, "", "invalid_json"},
		{"empty body", "/v1/chat", ``, "", "invalid_json"},
		{"not an object", "/v1/chat", `[1,2]`, "", "invalid_json"},
		{"missing messages", "/v1/chat", `{"max_tokens":5}`, "messages", "missing_required_parameter"},
		{"missing messages (completions)", "/v1/chat/completions", `{"model":"gpt-4.1"}`, "messages", "missing_required_parameter"},
		{"messages not an array", "/v1/chat", `{"messages":"hi"}`, "messages", "invalid_type"},
		{"messages empty", "/v1/chat/completions", `{"messages":[]}`, "messages", "empty_array"},
		{"message not an object", "/v1/chat", `{"messages":["hi"]}`, "messages[0]", "invalid_type"},
		{"role missing", "/v1/chat", `{"messages":[{"content":"hi"}]}`, "messages[0].role", "invalid_type"},
		{"role unknown", "/v1/chat", `{"messages":[{"role":"wizard","content":"hi"}]}`, "messages[0].role", "invalid_value"},
		{"content a number", "/v1/chat/completions", `{"messages":[{"role":"user","content":5}]}`, "messages[0].content", "invalid_type"},
		{"temperature a string", "/v1/chat", `{` + msg + `,"temperature":"hot"}`, "temperature", "invalid_type"},
		{"temperature out of range", "/v1/chat", `{` + msg + `,"temperature":3}`, "temperature", "decimal_out_of_range"},
		{"max_tokens a float", "/v1/chat", `{` + msg + `,"max_tokens":1.5}`, "max_tokens", "invalid_type"},
		{"max_tokens zero", "/v1/chat/completions", `{` + msg + `,"max_tokens":0}`, "max_tokens", "integer_out_of_range"},
		{"model a number", "/v1/chat/completions", `{` + msg + `,"model":4}`, "model", "invalid_type"},
		{"stream a string", "/v1/chat/completions", `{` + msg + `,"stream":"yes"}`, "stream", "invalid_type"},
		{"unknown field", "/v1/chat", `{` + msg + `,"tools":[]}`, "tools", "unknown_parameter"},
		{"too large", "/v1/chat", `{` + msg + `,"x":"` + strings.Repeat("a", 4096) + `"}`, "", "request_too_large"},
		{"too large (completions)", "/v1/chat/completions", `{` + msg + `,"x":"` + strings.Repeat("a", 4096) + `"}`, "", "request_too_large"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := f.post(t, tc.path, tc.body)
			assert.Equal(t, http.StatusBadRequest, resp.StatusCode, string(b))
			assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			e := assertOpenAIError(t, b, tc.param, tc.code)
			assert.Equal(t, "invalid_request_error", e["type"])
		})
	}
	t.Run("wrong method", func(t *testing.T) {
		resp, err := f.ts.Client().Get(f.ts.URL + "/v1/chat")
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
		assertOpenAIError(t, b, "", "method_not_allowed")
	})
	t.Run("unknown path", func(t *testing.T) {
		resp, b := f.post(t, "/v1/embeddings", `{}`)
		assert.Equal(t, http.StatusNotFound, resp.StatusCode)
		assertOpenAIError(t, b, "", "unknown_url")
	})
	assert.Zero(t, f.up.Calls(), "no upstream call for a malformed request")
}

// TestShutdown: on ctx's end the listener closes at once, a stream in
// flight finishes, and serve returns nil.
func TestShutdown(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		chunk := func(s string) {
			fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-4.1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q}}]}\n\n", s)
			w.(http.Flusher).Flush()
		}
		chunk("first")
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		chunk(" second")
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	defer up.Close()
	g, err := newGateway(config{Upstreams: []relay.Upstream{{Name: "up", BaseURL: up.URL + "/v1"}}, Model: "gpt-4.1",
		Retry: relay.RetryConfig{MaxAttempts: 1}})
	require.NoError(t, err)
	defer g.Close()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	shuttingDown := make(chan struct{})
	served := make(chan error, 1)
	go func() { served <- serve(ctx, ln, g, 10*time.Second, func() { close(shuttingDown) }) }()

	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	resp, err := client.Post("http://"+addr+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	require.NoError(t, err)
	assert.Contains(t, line, `"first"`)

	cancel() // SIGINT
	<-shuttingDown
	_, err = net.Dial("tcp", addr)
	assert.Error(t, err, "no new connections once shutdown began")
	select {
	case err := <-served:
		t.Fatalf("serve returned %v with a stream in flight", err)
	default:
	}

	close(release)
	rest, err := io.ReadAll(br)
	require.NoError(t, err, "the stream in flight finishes")
	assert.Contains(t, string(rest), `" second"`)
	assert.Contains(t, string(rest), "data: [DONE]")
	require.NoError(t, <-served)
}

func TestRunFlags(t *testing.T) {
	var errb bytes.Buffer
	assert.Equal(t, 2, run(context.Background(), []string{"-upstream", "nourl"}, &errb))
	assert.Contains(t, errb.String(), "want NAME=URL")
	errb.Reset()
	assert.Equal(t, 2, run(context.Background(), []string{"-upstream", "a=ftp://x"}, &errb))
	assert.Contains(t, errb.String(), "http or https")
	errb.Reset()
	assert.Equal(t, 2, run(context.Background(), []string{"-max-body", "0"}, &errb))
	assert.Equal(t, 0, run(context.Background(), []string{"-h"}, &errb))
}

// TestRunSimulated runs the command with its defaults (the simulated fleet)
// on a free port and stops it through its context.
func TestRunSimulated(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // stop as soon as it serves
	var errb bytes.Buffer
	require.Equal(t, 0, run(ctx, []string{"-addr", "127.0.0.1:0"}, &errb), errb.String())
	assert.Contains(t, errb.String(), "SIMULATED fleet")
	assert.Contains(t, errb.String(), "stopped")
}

func assertOpenAIError(t *testing.T, b []byte, param, code string) map[string]any {
	t.Helper()
	var body struct {
		Error map[string]any `json:"error"`
	}
	require.NoError(t, json.Unmarshal(b, &body), string(b))
	e := body.Error
	require.NotNil(t, e, string(b))
	assert.ElementsMatch(t, []string{"message", "type", "param", "code"}, keys(e), string(b))
	assert.NotEmpty(t, e["message"])
	if param == "" {
		assert.Nil(t, e["param"], string(b))
	} else {
		assert.Equal(t, param, e["param"], string(b))
	}
	if code != "" {
		assert.Equal(t, code, e["code"], string(b))
	}
	return e
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestMetrics: GET /metrics serves the router's Prometheus metrics.
func TestMetrics(t *testing.T) {
	f := newFixture(t, nil)
	resp, _ := f.post(t, "/v1/chat", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":8}`)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	mresp, err := f.ts.Client().Get(f.ts.URL + "/metrics")
	require.NoError(t, err)
	defer mresp.Body.Close()
	body, err := io.ReadAll(mresp.Body)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, mresp.StatusCode)
	assert.Contains(t, string(body), `relay_requests_total{bucket="short",model="gpt-4.1",status="2xx",upstream="up"} 1`)
	assert.Contains(t, string(body), "relay_cost_usd_total")
}
