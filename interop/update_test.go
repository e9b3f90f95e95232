package interop

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	goopenai "github.com/sashabaranov/go-openai"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	. "github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relaytest"
)

// TestUpdateThroughSDKs: go-openai and openai-go clients built once over
// the router keep working while Router.Update rotates a revoked key, adds
// a region, and then removes and adds it again under their traffic
// (chats and streams): every call succeeds and is reported once.
func TestUpdateThroughSDKs(t *testing.T) {
	east := newFakeServer(t, relaytest.WithName("east"), relaytest.WithAPIKey("sk-east-new"))
	west := newFakeServer(t, relaytest.WithName("west"))
	var reps reports
	clock := newTestClock()
	cfgOf := func(key string, withWest bool) Config {
		cfg := Config{Strategy: StrategyPriority, OnReport: reps.add, Clock: clock,
			Upstreams: []Upstream{{Name: "east", BaseURL: east.URL, APIKey: key}}}
		if withWest {
			cfg.Upstreams = append([]Upstream{{Name: "west", BaseURL: west.URL, APIKey: "sk-west", Models: []string{"gpt-4o-mini"}}}, cfg.Upstreams...)
		}
		return cfg
	}
	r, err := New(cfgOf("sk-east-old", false))
	require.NoError(t, err)
	t.Cleanup(r.CloseIdleConnections)
	goClient := goOpenAIClient(r)
	oaClient := openai.NewClient(option.WithBaseURL("http://relay.invalid/v1/"), option.WithAPIKey("sk-caller"),
		option.WithHTTPClient(&http.Client{Transport: r}), option.WithMaxRetries(0))
	ctx := context.Background()
	goChat := func(stream bool) error {
		req := goopenai.ChatCompletionRequest{Model: "gpt-4.1", Messages: []goopenai.ChatCompletionMessage{{Role: "user", Content: "Say hello"}}}
		if !stream {
			_, err := goClient.CreateChatCompletion(ctx, req)
			return err
		}
		req.Stream = true
		s, err := goClient.CreateChatCompletionStream(ctx, req)
		if err != nil {
			return err
		}
		text, err := recvAll(s)
		if err == nil && text != "Hello from relaytest. Hello from relaytest." {
			err = fmt.Errorf("stream text %q", text)
		}
		return err
	}
	oaChat := func() (string, error) {
		var resp *http.Response
		_, err := oaClient.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-4o-mini",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello")}}, option.WithResponseInto(&resp))
		if err != nil {
			return "", err
		}
		return resp.Header.Get(HeaderUpstream), nil
	}

	var apiErr *goopenai.APIError
	require.ErrorAs(t, goChat(false), &apiErr, "the key was revoked")
	assert.Equal(t, 401, apiErr.HTTPStatusCode)

	require.NoError(t, r.Update(cfgOf("sk-east-new", true)))
	require.NoError(t, goChat(false), "the new key")
	require.NoError(t, goChat(true))
	up, err := oaChat()
	require.NoError(t, err)
	assert.Equal(t, "west", up, "the region added serves its model")

	const workers, each, updates = 4, 10, 12
	progress := make(chan struct{}, workers*each)
	errs := make(chan error, workers*each)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for range each {
				var err error
				switch w % 3 {
				case 0:
					err = goChat(true)
				case 1:
					err = goChat(false)
				default:
					_, err = oaChat()
				}
				if err != nil {
					errs <- err
				}
				progress <- struct{}{}
			}
		})
	}
	for i := range updates { // west goes and comes back, every 3 calls
		for range 3 {
			<-progress
		}
		require.NoError(t, r.Update(cfgOf("sk-east-new", i%2 == 1)))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	assert.Len(t, reps.all(), 4+workers*each, "one report per call")
	for _, rec := range east.Requests()[1:] {
		assert.Equal(t, "Bearer sk-east-new", rec.Header.Get("Authorization"))
	}
}
