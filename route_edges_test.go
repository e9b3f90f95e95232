package relay

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay/internal/tokens"
)

// TestManyBodyTagsRefused: an upstream with more body tags than the
// body edit can set is refused by New with a clear error. (With 64, the
// body went out unchanged: not the routed model, no tags.)
func TestManyBodyTagsRefused(t *testing.T) {
	tags := map[string]any{}
	for i := range maxBodyTags + 1 {
		tags[fmt.Sprintf("t%02d", i)] = i
	}
	_, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1", BodyTags: tags}}})
	require.ErrorContains(t, err, "62 BodyTags, at most 61")
	delete(tags, "t00")
	up := newRecorder(t, 200, []byte(`{}`))
	r, _ := newTestRouter(t, Config{
		Upstreams: []Upstream{{Name: "a", BaseURL: up.URL + "/v1", BodyTags: tags}},
		Policy:    PolicyFunc(func(q Request) Route { return Route{Model: "gpt-4.1-mini"} }),
	})
	resp, _ := do(t, r, "POST", "http://relay/v1/chat/completions", chatStreamReq)
	assert.Equal(t, "gpt-4.1-mini", resp.Header.Get(HeaderModel))
	var m map[string]any
	require.NoError(t, json.Unmarshal(up.got()[0].Body, &m))
	assert.Equal(t, "gpt-4.1-mini", m["model"], "the routed model is what the upstream is asked for")
	assert.Equal(t, float64(61), m["t61"], "body tags set")
	assert.NotNil(t, m["stream_options"], "the usage option too: 64 fields set")
}

// The cookbook's num_tokens_for_tools uses func_init = 10 for gpt-3.5-turbo
// and gpt-4 (7 only for gpt-4o / gpt-4o-mini).
func TestToolsFuncInitForGPT4(t *testing.T) {
	r := testRouter(t)
	tools := `[{"type":"function","function":{"name":"get_current_weather","description":"Get the current weather in a given location","parameters":{"type":"object","properties":{"location":{"type":"string","description":"The city and state, e.g. San Francisco, CA"},"unit":{"type":"string","description":"The unit of temperature to return","enum":["celsius","fahrenheit"]}},"required":["location"]}}}]`
	msgs := `[{"role":"system","content":"You are a helpful assistant that can answer to questions about the weather."},{"role":"user","content":"What's the weather like in San Francisco?"}]`
	for _, c := range []struct {
		model    string
		funcInit int
		cookbook int // the cookbook notebook's printed count (num_tokens_for_tools == API)
	}{{"gpt-4", 10, 105}, {"gpt-3.5-turbo", 10, 105}, {"gpt-4o", 7, 101}} {
		enc := tokensFor(c.model)
		want := c.funcInit + enc("get_current_weather:Get the current weather in a given location") +
			3 + // prop_init
			3 + enc("location:string:The city and state, e.g. San Francisco, CA") +
			3 - 3 + 3 + enc("celsius") + 3 + enc("fahrenheit") + enc("unit:string:The unit of temperature to return") +
			12
		with := classifyBody(t, r, "/v1/chat/completions", `{"model":"`+c.model+`","messages":`+msgs+`,"tools":`+tools+`}`).PromptTokens
		without := classifyBody(t, r, "/v1/chat/completions", `{"model":"`+c.model+`","messages":`+msgs+`}`).PromptTokens
		t.Logf("%s: total %d (cookbook prints %d), tools %d, cookbook formula %d", c.model, with, c.cookbook, with-without, want)
		assert.Equal(t, want, with-without, c.model)
	}
}

// A caller header map with a non-canonical "authorization" key (set by
// map index, as some code does): the upstream's APIKey must replace it.
func TestNonCanonicalAuthorizationReplaced(t *testing.T) {
	up := newRecorder(t, 200, []byte(`{}`))
	r, _ := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL + "/v1", APIKey: "sk-up"}}})
	req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4o", "x")))
	req.Header["authorization"] = []string{"Bearer caller-secret"}
	resp, err := r.RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, []string{"Bearer sk-up"}, up.got()[0].Header.Values("Authorization"))
}

// A non-model path with an escaped slash (a model id "org/name" on
// GET /v1/models/{model}): what follows /v1/ must reach the upstream as
// the caller wrote it.
func TestEscapedPathKept(t *testing.T) {
	var got string
	r, _ := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://up.invalid/v1"}},
		Base: roundTripFunc(func(req *http.Request) (*http.Response, error) {
			got = req.URL.EscapedPath() // what goes on the wire
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(`{}`)), Request: req}, nil
		})})
	resp, _ := do(t, r, "GET", "http://relay/v1/models/org%2Fname", "")
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "/v1/models/org%2Fname", got)
}

// Keeping a Report's model names (a map of last report per model, an
// error log) must not keep the request bodies alive.
func TestReportModelDoesNotPinBody(t *testing.T) {
	for _, keep := range []bool{false, true} {
		var kept []string
		r, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://up.invalid/v1"}}, Strategy: StrategyPriority,
			Base: roundTripFunc(func(req *http.Request) (*http.Response, error) {
				io.Copy(io.Discard, req.Body)
				return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(`{}`)), Request: req}, nil
			}),
			OnReport: func(rep Report) {
				if keep {
					kept = append(kept, rep.RequestedModel, rep.Model)
				}
			}})
		require.NoError(t, err)
		big := strings.Repeat("x", 4<<20)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for i := range 8 {
			body := `{"model":"m` + strconv.Itoa(i) + `","messages":[{"role":"user","content":"hi"}],"metadata":{"blob":"` + big + `"}}`
			req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(body))
			resp, err := r.RoundTrip(req)
			require.NoError(t, err)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		growth := int64(after.HeapAlloc) - int64(before.HeapAlloc)
		t.Logf("keep=%v: %d model names kept; heap grew %.1f MB", keep, len(kept), float64(growth)/(1<<20))
		assert.Less(t, growth, int64(12<<20), "keep=%v: 16 short strings must not pin 8 bodies of 4 MB", keep)
		runtime.KeepAlive(kept)
	}
}

func tokensFor(model string) func(string) int {
	enc := tokens.ForModel(model)
	return enc.Count
}

// TestNoModelRequestNotRefusedForFallbackWindow: a body without a
// model (Azure deployments name it in the URL) has an unknown window, so
// it fits; a fallback that does not fit is dropped, and the request goes
// as written. (It was refused with ErrContextWindow.)
func TestNoModelRequestNotRefusedForFallbackWindow(t *testing.T) {
	up := newRecorder(t, 200, []byte(`{}`))
	r, _ := newTestRouter(t, Config{
		Upstreams: []Upstream{{Name: "az", BaseURL: up.URL + "/v1"}},
		Prices:    map[string]Price{"small": {MaxInputTokens: 1000, MaxOutputTokens: 1000}},
		Policy:    PolicyFunc(func(q Request) Route { return Route{Fallbacks: []string{"small"}} }),
	})
	body := `{"messages":[{"role":"user","content":"` + strings.Repeat("lorem ipsum dolor sit amet ", 3000) + `"}]}`
	req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(body))
	resp, err := r.RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Len(t, up.got(), 1)
	assert.Equal(t, body, string(up.got()[0].Body), "sent as the caller wrote it")
}

// TestDuplicateStreamOptionsHidesAskedUsage: with stream_options
// repeated, the upstream reads the last one, which asks for usage: the
// caller asked for it, and the usage chunk reaches the caller. (The router
// read the first, injected the option and removed the chunk.)
func TestDuplicateStreamOptionsHidesAskedUsage(t *testing.T) {
	const usage = "data: {\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":6,\"total_tokens\":11}}\n\n"
	sse := "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n" + usage + "data: [DONE]\n\n"
	r, _ := bodyRouter(t, Config{}, func() io.Reader { return strings.NewReader(sse) })
	req := `{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":false},"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Hi"}]}`
	got, err := stream(t, r, "chat/completions", req)
	require.NoError(t, err)
	assert.Equal(t, sse, string(got), "the caller asked (last member) for the usage chunk")
}
