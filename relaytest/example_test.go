package relaytest_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/tidwall/gjson"
	"github.com/tokenrelay/relay/relaytest"
)

func Example() {
	// README:relaytest
	srv := relaytest.NewServer(relaytest.WithName("eu-west"), relaytest.WithReply("Bonjour!"))
	defer srv.Close()

	// The first call is rate limited; later calls get normal answers.
	srv.Script(relaytest.Fault{Status: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {"1"}}})

	for range 2 {
		resp, err := http.Post(srv.URL+"/chat/completions", "application/json", strings.NewReader(
			`{"model":"gpt-4o","max_tokens":3,"messages":[{"role":"user","content":"Hello"}]}`))
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		j := gjson.ParseBytes(body)
		if resp.StatusCode != http.StatusOK {
			fmt.Println(resp.StatusCode, resp.Header.Get("Retry-After"), j.Get("error.code").Str)
			continue
		}
		fmt.Println(resp.StatusCode, resp.Header.Get(relaytest.NameHeader),
			j.Get("choices.0.message.content"), j.Get("choices.0.finish_reason"),
			j.Get("usage.prompt_tokens"), j.Get("usage.completion_tokens"))
	}
	r := srv.Requests()[1]
	fmt.Println(srv.Calls(), r.Path, r.Model)
	// README:end

	// Output:
	// 429 1 rate_limit_exceeded
	// 200 eu-west Bonjour! Bonjour length 8 3
	// 2 /v1/chat/completions gpt-4o
}
