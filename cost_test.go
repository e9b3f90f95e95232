package relay

import (
	"bufio"
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/tidwall/gjson"
	"github.com/tokenrelay/relay/internal/jsonscan"
)

// costWireDir holds the shared OpenAI wire fixtures, relative to the package
// directory (the working directory of `go test`).
const costWireDir = "testdata/openai-wire"

const costLiteLLMSample = "testdata/litellm_prices_sample.json"

func costReadFixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(costWireDir, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// costSSEUsages parses every data: payload of an SSE fixture and returns the
// usages found, in stream order.
func costSSEUsages(t testing.TB, name string) []Usage {
	t.Helper()
	var out []Usage
	sc := bufio.NewScanner(bytes.NewReader(costReadFixture(t, name)))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		payload, ok := strings.CutPrefix(line, "data:")
		if !ok {
			continue
		}
		payload = strings.TrimSpace(payload)
		if payload == "[DONE]" {
			continue
		}
		if u, ok := parseUsage([]byte(payload)); ok {
			out = append(out, u)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestParseUsageFixtures(t *testing.T) {
	tests := []struct {
		file string
		want Usage
	}{
		{"chat_response_default.json", Usage{PromptTokens: 19, CompletionTokens: 10, ServiceTier: "default"}},
		{"chat_response_recorded_gpt4o.json", Usage{PromptTokens: 14, CompletionTokens: 37}},
		// total_tokens = prompt + completion: cached and reasoning are inside.
		{"chat_response_cached_reasoning_SYNTHESIZED.json", Usage{PromptTokens: 2006, CompletionTokens: 300, ReasoningTokens: 192, CachedTokens: 1920, ServiceTier: "default"}},
		{"chat_usage_prompt_caching_doc.json", Usage{PromptTokens: 2006, CompletionTokens: 300, CachedTokens: 1920}},
		{"responses_response_reasoning.json", Usage{PromptTokens: 81, CompletionTokens: 1035, ReasoningTokens: 832}},
		{"responses_response_recorded_gpt4o_mini.json", Usage{PromptTokens: 14, CompletionTokens: 50, ServiceTier: "default"}},
		{"responses_response_text.json", Usage{PromptTokens: 36, CompletionTokens: 87}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			got, ok := parseUsage(costReadFixture(t, tt.file))
			if !ok || got != tt.want {
				t.Errorf("parseUsage = %+v, %v; want %+v, true", got, ok, tt.want)
			}
		})
	}
}

func TestParseUsageSSEFixtures(t *testing.T) {
	tests := []struct {
		file string
		want []Usage // every event that carries a usage; the last one is the stream's usage
	}{
		{"chat_stream_go_openai_include_usage.sse", []Usage{{PromptTokens: 1, CompletionTokens: 1}}},
		{"chat_stream_recorded_gpt4o_length_usage.sse", []Usage{{PromptTokens: 79, CompletionTokens: 1}}},
		{"chat_stream_recorded_gpt4o_text_usage.sse", []Usage{{PromptTokens: 14, CompletionTokens: 30}}},
		{"chat_stream_recorded_gpt4o_tool_calls_usage.sse", []Usage{{PromptTokens: 44, CompletionTokens: 16}}},
		// response.created and response.in_progress carry "usage": null.
		{"responses_stream_spec_example.sse", []Usage{{PromptTokens: 37, CompletionTokens: 11}}},
		{"chat_stream_go_openai_event_lines.sse", nil},
		{"chat_stream_error_in_stream.sse", nil},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			got := costSSEUsages(t, tt.file)
			if !slices.Equal(got, tt.want) {
				t.Errorf("usages = %+v; want %+v", got, tt.want)
			}
		})
	}
}

func TestParseUsageShapes(t *testing.T) {
	tests := []struct {
		name string
		body string
		want Usage
	}{
		{
			name: "embeddings",
			body: `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1]}],"model":"text-embedding-3-small","usage":{"prompt_tokens":8,"total_tokens":8}}`,
			want: Usage{PromptTokens: 8},
		},
		{
			name: "responses stream completed event",
			body: `{"type":"response.completed","response":{"status":"completed","usage":{"input_tokens":120,"input_tokens_details":{"cached_tokens":64},"output_tokens":40,"output_tokens_details":{"reasoning_tokens":16},"total_tokens":160}}}`,
			want: Usage{PromptTokens: 120, CompletionTokens: 40, ReasoningTokens: 16, CachedTokens: 64},
		},
		{
			name: "sse data prefix tolerated",
			body: "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n",
			want: Usage{PromptTokens: 5, CompletionTokens: 2},
		},
		{
			name: "reasoning inside, total agrees",
			body: `{"usage":{"prompt_tokens":100,"completion_tokens":50,"total_tokens":150,"completion_tokens_details":{"reasoning_tokens":30}}}`,
			want: Usage{PromptTokens: 100, CompletionTokens: 50, ReasoningTokens: 30},
		},
		{
			name: "reasoning outside, detected by total (xAI style)",
			body: `{"usage":{"prompt_tokens":100,"completion_tokens":50,"total_tokens":180,"completion_tokens_details":{"reasoning_tokens":30}}}`,
			want: Usage{PromptTokens: 100, CompletionTokens: 80, ReasoningTokens: 30},
		},
		{
			name: "reasoning outside, detected by reasoning > completion",
			body: `{"usage":{"prompt_tokens":100,"completion_tokens":10,"completion_tokens_details":{"reasoning_tokens":40}}}`,
			want: Usage{PromptTokens: 100, CompletionTokens: 50, ReasoningTokens: 40},
		},
		{
			name: "cached outside, detected by cached > prompt",
			body: `{"usage":{"prompt_tokens":100,"completion_tokens":10,"prompt_tokens_details":{"cached_tokens":300}}}`,
			want: Usage{PromptTokens: 400, CompletionTokens: 10, CachedTokens: 300},
		},
		{
			name: "cached outside, detected by total",
			body: `{"usage":{"prompt_tokens":100,"completion_tokens":10,"total_tokens":160,"prompt_tokens_details":{"cached_tokens":50}}}`,
			want: Usage{PromptTokens: 150, CompletionTokens: 10, CachedTokens: 50},
		},
		{
			name: "cached and reasoning outside, detected by total",
			body: `{"usage":{"prompt_tokens":100,"completion_tokens":10,"total_tokens":165,"prompt_tokens_details":{"cached_tokens":50},"completion_tokens_details":{"reasoning_tokens":5}}}`,
			want: Usage{PromptTokens: 150, CompletionTokens: 15, ReasoningTokens: 5, CachedTokens: 50},
		},
		{
			name: "total matching nothing is ignored",
			body: `{"usage":{"prompt_tokens":100,"completion_tokens":10,"total_tokens":999,"prompt_tokens_details":{"cached_tokens":50},"completion_tokens_details":{"reasoning_tokens":5}}}`,
			want: Usage{PromptTokens: 100, CompletionTokens: 10, ReasoningTokens: 5, CachedTokens: 50},
		},
		{
			name: "anthropic native: input excludes cache reads and writes",
			body: `{"type":"message","usage":{"input_tokens":50,"cache_creation_input_tokens":200,"cache_read_input_tokens":1000,"output_tokens":30}}`,
			want: Usage{PromptTokens: 1250, CompletionTokens: 30, CachedTokens: 1000, CacheWriteTokens: 200},
		},
		{
			name: "anthropic native: cache writes without reads",
			body: `{"type":"message","usage":{"input_tokens":50,"cache_creation_input_tokens":200,"output_tokens":30}}`,
			want: Usage{PromptTokens: 250, CompletionTokens: 30, CacheWriteTokens: 200},
		},
		{
			// LiteLLM's OpenAI shape for Anthropic: prompt_tokens counts the
			// cache reads and writes, also given at the top level.
			name: "litellm: prompt includes cache reads and writes",
			body: `{"usage":{"prompt_tokens":1250,"completion_tokens":30,"total_tokens":1280,"prompt_tokens_details":{"cached_tokens":1000,"cache_creation_tokens":200},"cache_creation_input_tokens":200,"cache_read_input_tokens":1000}}`,
			want: Usage{PromptTokens: 1250, CompletionTokens: 30, CachedTokens: 1000, CacheWriteTokens: 200},
		},
		{
			name: "litellm: top-level cache writes only",
			body: `{"usage":{"prompt_tokens":1250,"completion_tokens":30,"cache_creation_input_tokens":200,"cache_read_input_tokens":1000}}`,
			want: Usage{PromptTokens: 1250, CompletionTokens: 30, CachedTokens: 1000, CacheWriteTokens: 200},
		},
		{
			name: "openrouter: cache_write_tokens inside prompt_tokens",
			body: `{"usage":{"prompt_tokens":1250,"completion_tokens":30,"total_tokens":1280,"prompt_tokens_details":{"cached_tokens":1000,"cache_write_tokens":200}}}`,
			want: Usage{PromptTokens: 1250, CompletionTokens: 30, CachedTokens: 1000, CacheWriteTokens: 200},
		},
		{
			name: "cache writes reported outside prompt_tokens are folded in",
			body: `{"usage":{"prompt_tokens":1050,"completion_tokens":30,"prompt_tokens_details":{"cached_tokens":1000,"cache_write_tokens":200}}}`,
			want: Usage{PromptTokens: 1250, CompletionTokens: 30, CachedTokens: 1000, CacheWriteTokens: 200},
		},
		{
			name: "service tier beside the usage",
			body: `{"object":"chat.completion","service_tier":"flex","usage":{"prompt_tokens":10,"completion_tokens":2}}`,
			want: Usage{PromptTokens: 10, CompletionTokens: 2, ServiceTier: "flex"},
		},
		{
			name: "service tier of the response in a Responses event",
			body: `{"type":"response.completed","service_tier":"flex","response":{"service_tier":"priority","usage":{"input_tokens":10,"output_tokens":2}}}`,
			want: Usage{PromptTokens: 10, CompletionTokens: 2, ServiceTier: "priority"},
		},
		{
			name: "service tier that is not a string",
			body: `{"service_tier":7,"usage":{"prompt_tokens":10,"completion_tokens":2}}`,
			want: Usage{PromptTokens: 10, CompletionTokens: 2},
		},
		{
			name: "service tier of another name, escaped",
			body: `{"service_tier":"on_dem\u0061nd","usage":{"prompt_tokens":10,"completion_tokens":2}}`,
			want: Usage{PromptTokens: 10, CompletionTokens: 2, ServiceTier: "on_demand"},
		},
		{
			name: "anthropic via openai-compat proxy: prompt includes cache reads",
			body: `{"usage":{"prompt_tokens":1050,"completion_tokens":30,"total_tokens":1080,"cache_read_input_tokens":1000}}`,
			want: Usage{PromptTokens: 1050, CompletionTokens: 30, CachedTokens: 1000},
		},
		{
			name: "details win over cache_read_input_tokens",
			body: `{"usage":{"prompt_tokens":1050,"completion_tokens":30,"prompt_tokens_details":{"cached_tokens":1000},"cache_read_input_tokens":7}}`,
			want: Usage{PromptTokens: 1050, CompletionTokens: 30, CachedTokens: 1000},
		},
		{
			name: "negative counts clamp to zero",
			body: `{"usage":{"prompt_tokens":-5,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":-1}}}`,
			want: Usage{CompletionTokens: 3},
		},
		{
			name: "float counts truncate",
			body: `{"usage":{"prompt_tokens":12.0,"completion_tokens":3.9}}`,
			want: Usage{PromptTokens: 12, CompletionTokens: 3},
		},
		{
			name: "huge counts clamp",
			body: `{"usage":{"prompt_tokens":1e300,"completion_tokens":99999999999999999999}}`,
			want: Usage{PromptTokens: maxUsageTokens, CompletionTokens: maxUsageTokens},
		},
		{
			name: "null details",
			body: `{"usage":{"prompt_tokens":7,"completion_tokens":1,"prompt_tokens_details":null,"completion_tokens_details":null}}`,
			want: Usage{PromptTokens: 7, CompletionTokens: 1},
		},
		{
			name: "completion only",
			body: `{"usage":{"completion_tokens":4}}`,
			want: Usage{CompletionTokens: 4},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := parseUsage([]byte(tt.body))
			if !ok || got != tt.want {
				t.Errorf("parseUsage(%s) = %+v, %v; want %+v, true", tt.body, got, ok, tt.want)
			}
		})
	}
}

func TestParseUsageRejects(t *testing.T) {
	tests := []struct{ name, body string }{
		{"empty", ``},
		{"whitespace", " \n"},
		{"json null", `null`},
		{"done sentinel", `[DONE]`},
		{"done sentinel with data prefix", `data: [DONE]`},
		{"no usage key", `{"id":"x","choices":[]}`},
		{"usage null", `{"choices":[{"delta":{"content":"hi"}}],"usage":null}`},
		{"response usage null", `{"type":"response.created","response":{"usage":null}}`},
		{"usage empty object", `{"usage":{}}`},
		{"usage only total", `{"usage":{"total_tokens":5}}`},
		{"usage number", `{"usage":5}`},
		{"usage string", `{"usage":"12"}`},
		{"usage array", `{"usage":[1,2]}`},
		{"top-level array", `[{"usage":{"prompt_tokens":1}}]`},
		{"prompt tokens string", `{"usage":{"prompt_tokens":"12","completion_tokens":1}}`},
		{"completion tokens bool", `{"usage":{"prompt_tokens":12,"completion_tokens":true}}`},
		{"cached tokens string", `{"usage":{"prompt_tokens":12,"prompt_tokens_details":{"cached_tokens":"x"}}}`},
		{"reasoning tokens object", `{"usage":{"completion_tokens":12,"completion_tokens_details":{"reasoning_tokens":{}}}}`},
		{"total tokens string", `{"usage":{"prompt_tokens":12,"total_tokens":"12"}}`},
		{"truncated", `{"usage":{"prompt_tokens":12,"completion_tokens":3}`},
		{"trailing garbage", `{"usage":{"prompt_tokens":12}} x`},
		{"not json", `usage: prompt_tokens=12`},
		{"error event", `{"error":{"message":"boom","type":"server_error"}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := parseUsage([]byte(tt.body))
			if ok || got != (Usage{}) {
				t.Errorf("parseUsage(%q) = %+v, %v; want zero, false", tt.body, got, ok)
			}
		})
	}
	if _, ok := parseUsage(nil); ok {
		t.Error("parseUsage(nil) reported a usage")
	}
}

func TestPriceCost(t *testing.T) {
	defaults := DefaultPrices()
	cachedReasoning := Usage{PromptTokens: 2006, CompletionTokens: 300, ReasoningTokens: 192, CachedTokens: 1920}
	tests := []struct {
		name  string
		price Price
		usage Usage
		want  float64
	}{
		// (2006−1920)·2.00 + 1920·0.50 + 300·8.00 = 172 + 960 + 2400 = 3532 µUSD;
		// the 192 reasoning tokens are inside the 300 and not added again.
		{"gpt-4.1 cached and reasoning counted once", defaults["gpt-4.1"], cachedReasoning, 0.003532},
		// 86·1.10 + 1920·0.55 + 300·4.40 = 94.6 + 1056 + 1320 = 2470.6 µUSD.
		{"o3-mini style price", Price{InputPerMTok: 1.10, CachedInputPerMTok: 0.55, OutputPerMTok: 4.40}, cachedReasoning, 0.0024706},
		// 19·2.50 + 10·10.00 = 47.5 + 100 = 147.5 µUSD.
		{"gpt-4o plain", defaults["gpt-4o"], Usage{PromptTokens: 19, CompletionTokens: 10}, 0.0001475},
		// No cache discount: cached priced at input. 1000·2.00 = 2000 µUSD.
		{"cached falls back to input price", Price{InputPerMTok: 2, OutputPerMTok: 8}, Usage{PromptTokens: 1000, CachedTokens: 500}, 0.002},
		// gpt-5.5-codex has no published input price: only output counts. 500·12 = 6000 µUSD.
		{"gpt-5.5-codex output only", defaults["gpt-5.5-codex"], Usage{PromptTokens: 1000, CompletionTokens: 500, CachedTokens: 200}, 0.006},
		// 200000·0.28 + 800000·0.028 + 1000000·0.42 = 56000 + 22400 + 420000 = 498400 µUSD.
		{"deepseek-v3.2 cache hits", defaults["deepseek-v3.2"], Usage{PromptTokens: 1_000_000, CompletionTokens: 1_000_000, CachedTokens: 800_000}, 0.4984},
		// 9000·3.00 + 1000·0.30 + 2000·15.00 = 27000 + 300 + 30000 = 57300 µUSD.
		{"claude-sonnet-4.5 cache read", defaults["claude-sonnet-4.5"], Usage{PromptTokens: 10_000, CompletionTokens: 2_000, CachedTokens: 1_000}, 0.0573},
		// 1000000·0.02 = 20000 µUSD.
		{"embedding", defaults["text-embedding-3-small"], Usage{PromptTokens: 1_000_000}, 0.02},
		// Un-normalised cached > prompt: prompt becomes 500. 100·2.00 + 400·0.50 = 400 µUSD.
		{"cached outside prompt normalised", Price{InputPerMTok: 2, CachedInputPerMTok: 0.5, OutputPerMTok: 8}, Usage{PromptTokens: 100, CachedTokens: 400}, 0.0004},
		// Un-normalised reasoning > completion: completion becomes 30. 30·10 = 300 µUSD.
		{"reasoning outside completion normalised", Price{OutputPerMTok: 10}, Usage{CompletionTokens: 10, ReasoningTokens: 20}, 0.0003},
		{"negative counts cost nothing", Price{InputPerMTok: 2, CachedInputPerMTok: 0.5, OutputPerMTok: 8}, Usage{PromptTokens: -5, CompletionTokens: -5, ReasoningTokens: -5, CachedTokens: -5}, 0},
		{"zero price", Price{}, cachedReasoning, 0},
		{"zero usage", defaults["gpt-4.1"], Usage{}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.price.Cost(tt.usage); math.Abs(got-tt.want) > 1e-12 {
				t.Errorf("Cost(%+v) = %v; want %v", tt.usage, got, tt.want)
			}
		})
	}
}

func TestPriceCostFromFixture(t *testing.T) {
	u, ok := parseUsage(costReadFixture(t, "chat_response_cached_reasoning_SYNTHESIZED.json"))
	if !ok {
		t.Fatal("no usage")
	}
	p, ok := lookupPrice(DefaultPrices(), "gpt-4.1-2025-04-14")
	if !ok {
		t.Fatal("gpt-4.1-2025-04-14 unpriced")
	}
	// Exact: every term is an integer number of µUSD.
	if got := p.Cost(u); got != 0.003532 {
		t.Errorf("Cost = %v; want 0.003532", got)
	}
}

func TestUnpricedModel(t *testing.T) {
	prices := DefaultPrices()
	for _, model := range []string{"o3-mini-2025-01-31", "gpt-5.4", "llama-3-70b", "", "gpt-4.1-2025-13-40", "gpt", "/"} {
		t.Run(model, func(t *testing.T) {
			p, ok := lookupPrice(prices, model)
			if ok || !reflect.DeepEqual(p, Price{}) {
				t.Errorf("lookupPrice(%q) = %+v, %v; want unpriced", model, p, ok)
			}
			if c := p.Cost(Usage{PromptTokens: 1000, CompletionTokens: 1000}); c != 0 {
				t.Errorf("unpriced cost = %v; want 0", c)
			}
		})
	}
	if _, ok := lookupPrice(nil, "gpt-4.1"); ok {
		t.Error("nil table priced a model")
	}
}

func TestDefaultPrices(t *testing.T) {
	prices := DefaultPrices()
	want := map[string][3]float64{
		"gpt-5.5-codex":          {0, 0, 12.00},
		"gpt-4.1":                {2.00, 0.50, 8.00},
		"claude-sonnet-4.5":      {3.00, 0.30, 15.00},
		"gemini-2.5-flash":       {0.30, 0.075, 2.50},
		"deepseek-v3.2":          {0.28, 0.028, 0.42},
		"gpt-4o":                 {2.50, 1.25, 10.00},
		"gpt-4o-mini":            {0.15, 0.075, 0.60},
		"gpt-4.1-mini":           {0.40, 0.10, 1.60},
		"gpt-4.1-nano":           {0.10, 0.025, 0.40},
		"gpt-5":                  {1.25, 0.125, 10.00},
		"gpt-5-mini":             {0.25, 0.025, 2.00},
		"text-embedding-3-small": {0.02, 0, 0},
		"text-embedding-3-large": {0.13, 0, 0},
	}
	for model, p := range want {
		got, ok := prices[model]
		if !ok || [3]float64{got.InputPerMTok, got.CachedInputPerMTok, got.OutputPerMTok} != p {
			t.Errorf("DefaultPrices()[%q] = %+v, %v; want %+v", model, got, ok, p)
		}
		if got.MaxInputTokens <= 0 {
			t.Errorf("DefaultPrices()[%q] has no context window", model)
		}
	}
	if !reflect.DeepEqual(prices["claude-sonnet-4.5"], prices["claude-sonnet-4-5"]) {
		t.Error("claude-sonnet-4-5 alias differs from claude-sonnet-4.5")
	}
	for model, p := range prices {
		if p.InputPerMTok < 0 || p.CachedInputPerMTok < 0 || p.OutputPerMTok < 0 || p.InputPerMTok+p.OutputPerMTok == 0 {
			t.Errorf("implausible default price %q: %+v", model, p)
		}
	}
}

func TestDefaultPricesIsACopy(t *testing.T) {
	first := DefaultPrices()
	first["gpt-4.1"] = Price{InputPerMTok: 999}
	delete(first, "gpt-4o")
	first["made-up"] = Price{OutputPerMTok: 1}

	first["gpt-5"].ServiceTiers["flex"] = Price{InputPerMTok: 999}
	first["claude-sonnet-4.5"].Tiers[0].InputPerMTok = 999

	second := DefaultPrices()
	if got := second["gpt-4.1"]; !reflect.DeepEqual(got, Price{InputPerMTok: 2.00, CachedInputPerMTok: 0.50, OutputPerMTok: 8.00, MaxInputTokens: 1047576, MaxOutputTokens: 32768,
		ServiceTiers: map[string]Price{"priority": {InputPerMTok: 3.50, CachedInputPerMTok: 0.875, OutputPerMTok: 14.00}}}) {
		t.Errorf("gpt-4.1 = %+v after mutating an earlier copy", got)
	}
	if _, ok := second["gpt-4o"]; !ok {
		t.Error("gpt-4o missing after deleting it from an earlier copy")
	}
	if _, ok := second["made-up"]; ok {
		t.Error("key added to an earlier copy leaked")
	}
	if got := second["gpt-5"].ServiceTiers["flex"].InputPerMTok; got != 0.625 {
		t.Errorf("gpt-5 flex input = %v after mutating an earlier copy's service tier", got)
	}
	if got := second["claude-sonnet-4.5"].Tiers[0].InputPerMTok; got != 6 {
		t.Errorf("claude-sonnet-4.5 long-context input = %v after mutating an earlier copy's tier", got)
	}
	if !reflect.DeepEqual(second, defaultPrices) {
		t.Error("DefaultPrices() differs from the table")
	}
}

func TestLoadPricesSample(t *testing.T) {
	f, err := os.Open(costLiteLLMSample)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	prices, err := LoadPrices(f)
	if err != nil {
		t.Fatal(err)
	}

	// Values read from the sample, per token × 1e6, exact after rounding.
	// The batch prices, one-hour cache writes and the rest are not read.
	want := map[string]Price{
		"gpt-4.1": {InputPerMTok: 2, CachedInputPerMTok: 0.5, OutputPerMTok: 8, MaxInputTokens: 1047576, MaxOutputTokens: 32768,
			ServiceTiers: map[string]Price{"priority": {InputPerMTok: 3.5, CachedInputPerMTok: 0.875, OutputPerMTok: 14}}},
		"gpt-4o-mini": {InputPerMTok: 0.15, CachedInputPerMTok: 0.075, OutputPerMTok: 0.6, MaxInputTokens: 128000, MaxOutputTokens: 16384,
			ServiceTiers: map[string]Price{"priority": {InputPerMTok: 0.25, CachedInputPerMTok: 0.125, OutputPerMTok: 1}}},
		"gpt-4o-mini-2024-07-18":  {InputPerMTok: 0.15, CachedInputPerMTok: 0.075, OutputPerMTok: 0.6, MaxInputTokens: 128000, MaxOutputTokens: 16384},
		"deepseek/deepseek-chat":  {InputPerMTok: 0.28, CachedInputPerMTok: 0.028, OutputPerMTok: 0.42, MaxInputTokens: 131072, MaxOutputTokens: 8192},
		"gemini/gemini-2.5-flash": {InputPerMTok: 0.3, CachedInputPerMTok: 0.03, OutputPerMTok: 2.5, MaxInputTokens: 1048576, MaxOutputTokens: 65535},
		"gpt-5": {InputPerMTok: 1.25, CachedInputPerMTok: 0.125, OutputPerMTok: 10, MaxInputTokens: 272000, MaxOutputTokens: 128000,
			ServiceTiers: map[string]Price{
				"flex":     {InputPerMTok: 0.625, CachedInputPerMTok: 0.0625, OutputPerMTok: 5},
				"priority": {InputPerMTok: 2.5, CachedInputPerMTok: 0.25, OutputPerMTok: 20},
			}},
		// The priority tier's long-context rates it lacks (output) are the
		// standard long-context ones, as LiteLLM reckons them.
		"gpt-5.4": {InputPerMTok: 2.5, CachedInputPerMTok: 0.25, OutputPerMTok: 15, MaxInputTokens: 1050000, MaxOutputTokens: 128000,
			Tiers: []PriceTier{{AbovePromptTokens: 272000, InputPerMTok: 5, CachedInputPerMTok: 0.5, OutputPerMTok: 22.5}},
			ServiceTiers: map[string]Price{"priority": {InputPerMTok: 5, CachedInputPerMTok: 0.5, OutputPerMTok: 30,
				Tiers: []PriceTier{{AbovePromptTokens: 272000, InputPerMTok: 10, CachedInputPerMTok: 0.5, OutputPerMTok: 22.5}}}}},
		"claude-sonnet-4-5": {InputPerMTok: 3, CachedInputPerMTok: 0.3, CacheWriteInputPerMTok: 3.75, OutputPerMTok: 15, MaxInputTokens: 200000, MaxOutputTokens: 64000,
			Tiers: []PriceTier{{AbovePromptTokens: 200000, InputPerMTok: 6, CachedInputPerMTok: 0.6, CacheWriteInputPerMTok: 7.5, OutputPerMTok: 22.5}}},
		"gemini/gemini-2.5-pro": {InputPerMTok: 1.25, CachedInputPerMTok: 0.125, OutputPerMTok: 10, MaxInputTokens: 1048576, MaxOutputTokens: 65535,
			Tiers: []PriceTier{{AbovePromptTokens: 200000, InputPerMTok: 2.5, CachedInputPerMTok: 0.25, OutputPerMTok: 15}}},
	}
	if !reflect.DeepEqual(prices, want) {
		t.Errorf("LoadPrices(sample) = %+v;\nwant %+v (sample_spec skipped, every other entry loaded)", prices, want)
	}

	lookups := []struct {
		model, key string
	}{
		{"deepseek-chat", "deepseek/deepseek-chat"},
		{"gemini-2.5-flash", "gemini/gemini-2.5-flash"},
		{"openai/gpt-4.1", "gpt-4.1"},
		{"gpt-4.1-2025-04-14", "gpt-4.1"},
		{"gpt-4o-mini-2024-07-18", "gpt-4o-mini-2024-07-18"},
	}
	for _, l := range lookups {
		if p, ok := lookupPrice(prices, l.model); !ok || !reflect.DeepEqual(p, want[l.key]) {
			t.Errorf("lookupPrice(%q) = %+v, %v; want %+v (%s)", l.model, p, ok, want[l.key], l.key)
		}
	}
}

func TestLoadPrices(t *testing.T) {
	t.Run("defaults and tolerance", func(t *testing.T) {
		catalog := `{
			"sample_spec": {"input_cost_per_token": 0.0, "output_cost_per_token": 0.0, "litellm_provider": "one of ..."},
			"no-cache-price": {"input_cost_per_token": 1e-06, "output_cost_per_token": 4e-06},
			"string-input": {"input_cost_per_token": "2e-06", "output_cost_per_token": 3e-06, "cache_read_input_token_cost": "x"},
			"output-only": {"output_cost_per_token": 1.5e-05},
			"image-model": {"input_cost_per_pixel": 1e-08, "mode": "image_generation"},
			"all-strings": {"input_cost_per_token": "free", "output_cost_per_token": "free"},
			"not-an-object": 5,
			"list": [1, 2],
			"free-model": {"input_cost_per_token": 0, "output_cost_per_token": 0}
		}`
		prices, err := LoadPrices(strings.NewReader(catalog))
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]Price{
			"no-cache-price": {InputPerMTok: 1, CachedInputPerMTok: 1, OutputPerMTok: 4},
			"string-input":   {InputPerMTok: 0, CachedInputPerMTok: 0, OutputPerMTok: 3},
			"output-only":    {InputPerMTok: 0, CachedInputPerMTok: 0, OutputPerMTok: 15},
			"free-model":     {},
		}
		if !reflect.DeepEqual(prices, want) {
			t.Errorf("LoadPrices = %+v;\nwant %+v", prices, want)
		}
	})

	bad := []struct{ name, input string }{
		{"empty", ``},
		{"truncated", `{"gpt-4.1": {"input_cost_per_token": 2e-06`},
		{"not json", `gpt-4.1: 2`},
		{"array", `[{"input_cost_per_token": 2e-06}]`},
		{"string", `"prices"`},
		{"no priced entry", `{"sample_spec": {"input_cost_per_token": 0.0}}`},
		{"empty object", `{}`},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			prices, err := LoadPrices(strings.NewReader(tt.input))
			if err == nil || prices != nil {
				t.Fatalf("LoadPrices(%q) = %v, %v; want nil, error", tt.input, prices, err)
			}
			costCheckPrefix(t, err)
		})
	}

	t.Run("read error", func(t *testing.T) {
		boom := errors.New("boom")
		_, err := LoadPrices(costErrReader{boom})
		if !errors.Is(err, boom) {
			t.Fatalf("err = %v; want it to wrap %v", err, boom)
		}
		costCheckPrefix(t, err)
	})
	t.Run("nil reader", func(t *testing.T) {
		_, err := LoadPrices(nil)
		if err == nil {
			t.Fatal("LoadPrices(nil) did not fail")
		}
		costCheckPrefix(t, err)
	})
}

func costCheckPrefix(t *testing.T, err error) {
	t.Helper()
	if !strings.HasPrefix(err.Error(), "relay: ") {
		t.Errorf("error %q lacks the relay: prefix", err)
	}
}

type costErrReader struct{ err error }

func (r costErrReader) Read([]byte) (int, error) { return 0, r.err }

func TestLookupPrice(t *testing.T) {
	a := Price{InputPerMTok: 1}
	b := Price{InputPerMTok: 2}
	c := Price{InputPerMTok: 3}
	d := Price{InputPerMTok: 4}
	e := Price{InputPerMTok: 5}
	table := map[string]Price{
		"gpt-4.1":                    a,
		"azure/gpt-4.1":              b,
		"deepseek/deepseek-chat":     c,
		"openrouter/deepseek-chat":   d,
		"claude-3-5-sonnet":          e,
		"claude-3-5-sonnet-20240620": b,
		"Mixed-Case":                 c,
		"gpt-4o":                     d,
		"gpt-4o-2024-05-13":          e,
		"vendor/GPT-OSS":             a,
		"acme/gpt-oss":               b,
	}
	tests := []struct {
		model string
		want  Price
		ok    bool
	}{
		{"gpt-4.1", a, true},       // exact
		{"azure/gpt-4.1", b, true}, // exact beats stripping
		{"GPT-4.1", a, true},       // case-insensitive
		{"Azure/GPT-4.1", b, true}, // case-insensitive on the full key beats stripping
		{"mixed-case", c, true},
		{"openai/gpt-4.1", a, true},         // request prefix stripped; unprefixed key preferred over azure/gpt-4.1
		{"deepseek-chat", c, true},          // key prefix stripped; deepseek/ < openrouter/
		{"together/deepseek-chat", c, true}, // prefixes on both sides
		{"gpt-4.1-2025-04-14", a, true},     // -YYYY-MM-DD
		{"openai/gpt-4.1-2025-04-14", a, true},
		{"claude-3-5-sonnet-20241022", e, true}, // -YYYYMMDD
		{"claude-3-5-sonnet@20241022", e, true}, // @YYYYMMDD (Vertex)
		{"claude-3-5-sonnet-latest", e, true},   // -latest
		{"claude-3-5-sonnet-20240620", b, true}, // a dated key that exists wins
		{"gpt-4o-2024-08-06", d, true},
		{"gpt-4o-2024-05-13", e, true},
		{"gpt-oss", b, true},                  // two prefixed keys: lexicographically smallest (acme/ < vendor/)
		{"gpt-4o-mini", Price{}, false},       // no guessing by prefix
		{"gpt-4o-2024-13-01", Price{}, false}, // not a date
		{"gpt-4o-1999-01-01", Price{}, false}, // not a 20xx date
		{"gpt-4o-20241301", Price{}, false},
		{"claude-3-5-sonnet-v2", Price{}, false},
		{"2024-08-06", Price{}, false},
		{"-latest", Price{}, false},
		{"openai/", Price{}, false},
		{"", Price{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.model, func(t *testing.T) {
			if got, ok := lookupPrice(table, tt.model); ok != tt.ok || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("lookupPrice(%q) = %+v, %v; want %+v, %v", tt.model, got, ok, tt.want, tt.ok)
			}
		})
	}

	t.Run("undated request never matches a dated key", func(t *testing.T) {
		if _, ok := lookupPrice(map[string]Price{"gpt-9-2030-01-01": a}, "gpt-9"); ok {
			t.Error("gpt-9 priced from a dated key")
		}
	})
	t.Run("deterministic across iterations", func(t *testing.T) {
		for i := 0; i < 50; i++ {
			if got, ok := lookupPrice(table, "gpt-oss"); !ok || !reflect.DeepEqual(got, b) {
				t.Fatalf("iteration %d: lookupPrice(gpt-oss) = %+v, %v; want %+v", i, got, ok, b)
			}
		}
	})
	t.Run("defaults", func(t *testing.T) {
		prices := DefaultPrices()
		for model, key := range map[string]string{
			"gpt-4o-2024-08-06":          "gpt-4o",
			"gpt-4o-mini-2024-07-18":     "gpt-4o-mini",
			"gpt-4o-2024-05-13":          "gpt-4o-2024-05-13",
			"gpt-5-mini-2025-08-07":      "gpt-5-mini",
			"openai/gpt-5":               "gpt-5",
			"claude-sonnet-4-5-20250929": "claude-sonnet-4-5",
			"Claude-Sonnet-4.5":          "claude-sonnet-4.5",
			"gemini/gemini-2.5-flash":    "gemini-2.5-flash",
			"deepseek/deepseek-v3.2":     "deepseek-v3.2",
		} {
			if got, ok := lookupPrice(prices, model); !ok || !reflect.DeepEqual(got, prices[key]) {
				t.Errorf("lookupPrice(%q) = %+v, %v; want %+v (%s)", model, got, ok, prices[key], key)
			}
		}
	})
}

func TestLookupPriceExactHitDoesNotAllocate(t *testing.T) {
	prices := DefaultPrices()
	model := "gpt-4.1"
	allocs := testing.AllocsPerRun(100, func() {
		if _, ok := lookupPrice(prices, model); !ok {
			t.Fatal("gpt-4.1 not found")
		}
	})
	if allocs != 0 {
		t.Errorf("exact hit: %v allocs; want 0", allocs)
	}
	dated := "openai/gpt-4.1-2025-04-14"
	allocs = testing.AllocsPerRun(100, func() {
		if _, ok := lookupPrice(prices, dated); !ok {
			t.Fatal("dated name not found")
		}
	})
	if allocs != 0 {
		t.Errorf("resolved hit: %v allocs; want 0", allocs)
	}
}

func TestParseUsageDoesNotAllocate(t *testing.T) {
	body := costReadFixture(t, "chat_response_cached_reasoning_SYNTHESIZED.json")
	allocs := testing.AllocsPerRun(100, func() {
		if _, ok := parseUsage(body); !ok {
			t.Fatal("no usage")
		}
	})
	if allocs != 0 {
		t.Errorf("parseUsage: %v allocs; want 0", allocs)
	}
}

func FuzzParseUsage(f *testing.F) {
	for _, name := range []string{
		"chat_response_default.json",
		"chat_response_recorded_gpt4o.json",
		"chat_response_cached_reasoning_SYNTHESIZED.json",
		"chat_usage_prompt_caching_doc.json",
		"responses_response_reasoning.json",
		"responses_response_text.json",
	} {
		b, err := os.ReadFile(filepath.Join(costWireDir, name))
		if err == nil {
			f.Add(b)
		}
	}
	for _, s := range []string{
		``, `null`, `{"usage":null}`, `{"usage":{}}`, `[DONE]`,
		`data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`,
		`{"usage":{"prompt_tokens":100,"completion_tokens":50,"total_tokens":180,"completion_tokens_details":{"reasoning_tokens":30}}}`,
		`{"usage":{"prompt_tokens":-1,"completion_tokens":1e99,"prompt_tokens_details":{"cached_tokens":7}}}`,
		`{"usage":{"input_tokens":50,"cache_creation_input_tokens":200,"cache_read_input_tokens":1000,"output_tokens":30}}`,
		`{"usage":{"prompt_tokens":50,"prompt_tokens_details":{"cached_tokens":30,"cache_write_tokens":40},"cache_creation_input_tokens":9}}`,
		`{"service_tier":"priority","usage":{"input_tokens":5,"cache_creation_input_tokens":null,"cache_read_input_tokens":2}}`,
		`{"response":{"service_tier":"flex"},"response":{"service_tier":"x","usage":{"input_tokens":2}}}`,
		`{"type":"response.completed","response":{"usage":{"input_tokens":3,"output_tokens":4,"output_tokens_details":{"reasoning_tokens":9}}}}`,
		`{"usage":{"prompt_tokens":"12"}}`,
		`{"usage":{"prompt_tokens":1,"prompt_tokens":2,"completion_tokens":3}}`,
		`{"usage":{"prompt_tokens":5,"prompt_tokens_details":7,"prompt_tokens_details":{"cached_tokens":2}}}`,
		`{"usag\u0065":{"prompt_\u0074okens":4,"completion_tokens":1.9e1}}`,
		`{"usage":null,"usage":{"prompt_tokens":1},"response":{"usage":{"input_tokens":2}}}`,
		`{"usage":[1],"response":{"usage":{"input_tokens":2,"output_tokens":-0.5}}}`,
		`{"usage":{"prompt_tokens":123456789,"completion_tokens":1234567890,"total_tokens":true}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		u, ok := parseUsage(body)
		if ru, rok := parseUsageRef(t, body); ru != u || rok != ok {
			t.Fatalf("parseUsage(%q) = %+v, %v; the reference reads %+v, %v", body, u, ok, ru, rok)
		}
		if !ok {
			if u != (Usage{}) {
				t.Fatalf("not ok but usage %+v", u)
			}
			return
		}
		if u.PromptTokens < 0 || u.CompletionTokens < 0 || u.ReasoningTokens < 0 || u.CachedTokens < 0 {
			t.Fatalf("negative count: %+v", u)
		}
		if u.CachedTokens+u.CacheWriteTokens > u.PromptTokens || u.CacheWriteTokens < 0 {
			t.Fatalf("cached + cache writes > prompt: %+v", u)
		}
		if u.ReasoningTokens > u.CompletionTokens {
			t.Fatalf("reasoning > completion: %+v", u)
		}
		if u.Estimated {
			t.Fatalf("parsed usage marked estimated: %+v", u)
		}
		if u.normalized() != u {
			t.Fatalf("not a fixed point of normalisation: %+v", u)
		}
		if c := (Price{InputPerMTok: 1, CachedInputPerMTok: 0.5, OutputPerMTok: 2}).Cost(u); c < 0 {
			t.Fatalf("negative cost %v for %+v", c, u)
		}
	})
}

// usagePaths are the gjson paths of the usage fields parseUsage reads.
var usagePaths = [numUsageFields]string{
	uPrompt: "prompt_tokens", uInput: "input_tokens", uCompletion: "completion_tokens", uOutput: "output_tokens",
	uCachedPrompt: "prompt_tokens_details.cached_tokens", uCachedInput: "input_tokens_details.cached_tokens",
	uCacheRead: "cache_read_input_tokens", uReasoningCompletion: "completion_tokens_details.reasoning_tokens",
	uReasoningOutput: "output_tokens_details.reasoning_tokens", uTotal: "total_tokens",
	uCacheWrite: "cache_creation_input_tokens", uCacheWriteDetails: "prompt_tokens_details.cache_write_tokens",
	uCacheCreationDetails: "prompt_tokens_details.cache_creation_tokens",
}

// parseUsageRef is the reference of parseUsage's reading: the usage object
// and each of its fields found with gjson (the first member of a name, as
// gjson.Get finds it), each field's count read by gjson as a float, then
// the same rules (usageFrom). FuzzParseUsage checks that the two agree.
func parseUsageRef(t testing.TB, body []byte) (Usage, bool) {
	s := usageTrimEvent(unsafe.String(unsafe.SliceData(body), len(body)))
	if s == "" || (s[0] != '{') || !jsonscan.Valid(s) {
		return Usage{}, false
	}
	usage, tier := gjson.Get(s, "usage"), gjson.Get(s, "service_tier")
	if usage.Type == gjson.Null { // absent or null: the first response object that has a usage
		usage, tier = gjson.Result{}, gjson.Result{}
		gjson.Parse(s).ForEach(func(k, v gjson.Result) bool {
			if k.Str == "response" && v.IsObject() && v.Get("usage").Exists() {
				usage, tier = v.Get("usage"), v.Get("service_tier")
				return false
			}
			return true
		})
	}
	if !usage.IsObject() {
		return Usage{}, false
	}
	var f usageFields
	for i, path := range usagePaths {
		v := usage.Get(path)
		f[i] = v.Raw
		n, present, ok := usageNum(v.Raw)
		if rn, rpresent, rok := usageIntRef(v); n != rn || present != rpresent || ok != rok {
			t.Fatalf("%s = %s: usageNum reads %d, %v, %v; gjson %d, %v, %v", path, v.Raw, n, present, ok, rn, rpresent, rok)
		}
	}
	u, ok := usageFrom(&f)
	if ok && tier.Type == gjson.String {
		u.ServiceTier = tier.Str
	}
	return u, ok
}

func usageIntRef(v gjson.Result) (n int, present, ok bool) {
	switch v.Type {
	case gjson.Null:
		return 0, false, true
	case gjson.Number:
		f := v.Num
		switch {
		case !(f > 0): // negative, zero or NaN
			return 0, true, true
		case f >= maxUsageTokens:
			return maxUsageTokens, true, true
		}
		return int(f), true, true
	default:
		return 0, false, false
	}
}

func BenchmarkParseUsage(b *testing.B) {
	body := costReadFixture(b, "chat_response_cached_reasoning_SYNTHESIZED.json")
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, ok := parseUsage(body); !ok {
			b.Fatal("no usage")
		}
	}
}

func BenchmarkLookupPrice(b *testing.B) {
	prices := DefaultPrices()
	for _, model := range []string{"gpt-4.1", "openai/gpt-4.1-2025-04-14"} {
		b.Run(model, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := lookupPrice(prices, model); !ok {
					b.Fatal("not found")
				}
			}
		})
	}
}
