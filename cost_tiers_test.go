package relay

import (
	"math"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// costSample loads testdata/litellm_prices_sample.json.
func costSample(t *testing.T) map[string]Price {
	t.Helper()
	f, err := os.Open(costLiteLLMSample)
	require.NoError(t, err)
	defer f.Close()
	prices, err := LoadPrices(f)
	require.NoError(t, err)
	return prices
}

// Cost at cache-write, long-context and service-tier rates, to the µUSD:
// every figure is worked out in its comment.
func TestPriceCostRates(t *testing.T) {
	defaults, catalog := DefaultPrices(), costSample(t)
	sonnet, gpt5, gpt54 := defaults["claude-sonnet-4.5"], defaults["gpt-5"], catalog["gpt-5.4"]
	cases := []struct {
		name  string
		price Price
		usage Usage
		micro float64 // µUSD
	}{
		// 7000·3 + 1000·0.30 + 2000·3.75 + 1000·15 = 21000 + 300 + 7500 + 15000.
		{"cache writes at their rate", sonnet, Usage{PromptTokens: 10_000, CachedTokens: 1_000, CacheWriteTokens: 2_000, CompletionTokens: 1_000}, 43_800},
		// No cache-write rate: at the input rate. 1000·2.
		{"cache writes without a rate at input", Price{InputPerMTok: 2, OutputPerMTok: 8}, Usage{PromptTokens: 1000, CacheWriteTokens: 400}, 2_000},
		// Cached 50 + writes 80 > prompt 100: the writes were outside, prompt 180.
		// 50·2 + 50·0.5 + 80·2.5 = 100 + 25 + 200.
		{"cache writes outside the prompt normalised", Price{InputPerMTok: 2, CachedInputPerMTok: 0.5, CacheWriteInputPerMTok: 2.5}, Usage{PromptTokens: 100, CachedTokens: 50, CacheWriteTokens: 80}, 325},
		// At the threshold the tier does not apply: 200000·3 + 1000·15.
		{"prompt at the threshold: base rates", sonnet, Usage{PromptTokens: 200_000, CompletionTokens: 1_000}, 615_000},
		// One token above: every token at the tier's rates, output included. 200001·6 + 1000·22.5.
		{"prompt above the threshold: tier rates", sonnet, Usage{PromptTokens: 200_001, CompletionTokens: 1_000}, 1_222_506},
		// 100000·6 + 100000·0.60 + 50000·7.50 + 2000·22.50.
		{"tier rates for cache reads and writes", sonnet, Usage{PromptTokens: 250_000, CachedTokens: 100_000, CacheWriteTokens: 50_000, CompletionTokens: 2_000}, 1_080_000},
		// Cache reads and writes count toward the threshold: 100000 + 60000 + 50000 > 200000.
		// 100000·6 + 60000·0.60 + 50000·7.50 = 600000 + 36000 + 375000.
		{"cache reads and writes count toward the threshold", sonnet, Usage{PromptTokens: 210_000, CachedTokens: 60_000, CacheWriteTokens: 50_000}, 1_011_000},
		// Two tiers: the highest one passed. 150000·2; then 250000·4 + 10·3.
		{"between two tiers", Price{InputPerMTok: 1, OutputPerMTok: 1, Tiers: []PriceTier{{AbovePromptTokens: 128_000, InputPerMTok: 2}, {AbovePromptTokens: 200_000, InputPerMTok: 4, OutputPerMTok: 3}}}, Usage{PromptTokens: 150_000}, 300_000},
		{"above both tiers", Price{InputPerMTok: 1, OutputPerMTok: 1, Tiers: []PriceTier{{AbovePromptTokens: 128_000, InputPerMTok: 2}, {AbovePromptTokens: 200_000, InputPerMTok: 4, OutputPerMTok: 3}}}, Usage{PromptTokens: 250_000, CompletionTokens: 10}, 1_000_030},
		// No cached rate anywhere: cached at the tier's input. 10·2 + 10·2.
		{"no cache discount at the tier's input", Price{InputPerMTok: 1, OutputPerMTok: 1, Tiers: []PriceTier{{AbovePromptTokens: 10, InputPerMTok: 2}}}, Usage{PromptTokens: 20, CachedTokens: 10}, 40},
		// 8000·0.625 + 2000·0.0625 + 1000·5.
		{"flex", gpt5, Usage{PromptTokens: 10_000, CachedTokens: 2_000, CompletionTokens: 1_000, ServiceTier: "flex"}, 10_125},
		// 8000·2.50 + 2000·0.25 + 1000·20.
		{"priority", gpt5, Usage{PromptTokens: 10_000, CachedTokens: 2_000, CompletionTokens: 1_000, ServiceTier: "priority"}, 40_500},
		{"service tier matched ignoring case", gpt5, Usage{PromptTokens: 10_000, CachedTokens: 2_000, CompletionTokens: 1_000, ServiceTier: "FLEX"}, 10_125},
		// 8000·1.25 + 2000·0.125 + 1000·10.
		{"default tier at base rates", gpt5, Usage{PromptTokens: 10_000, CachedTokens: 2_000, CompletionTokens: 1_000, ServiceTier: "default"}, 20_250},
		{"unknown tier at base rates", gpt5, Usage{PromptTokens: 10_000, CachedTokens: 2_000, CompletionTokens: 1_000, ServiceTier: "scale"}, 20_250},
		// gpt-5.4 from the catalog. Standard above 272k: 200000·5 + 100000·0.5 + 1000·22.5.
		{"catalog: long context", gpt54, Usage{PromptTokens: 300_000, CachedTokens: 100_000, CompletionTokens: 1_000}, 1_072_500},
		// Priority above 272k: its own input rate (10), the standard long-context
		// cached (0.5) and output (22.5) rates it lacks. 200000·10 + 100000·0.5 + 1000·22.5.
		{"catalog: priority long context", gpt54, Usage{PromptTokens: 300_000, CachedTokens: 100_000, CompletionTokens: 1_000, ServiceTier: "priority"}, 2_072_500},
		// Priority below: 1000·5 + 100·30.
		{"catalog: priority", gpt54, Usage{PromptTokens: 1_000, CompletionTokens: 100, ServiceTier: "priority"}, 8_000},
		// A service tier without tiers of its own takes the base tiers' rates
		// over its own: input 3 (tier), output 1 (flex). 200·3 + 10·1.
		{"service tier under base tiers", Price{InputPerMTok: 1, OutputPerMTok: 2, Tiers: []PriceTier{{AbovePromptTokens: 100, InputPerMTok: 3}},
			ServiceTiers: map[string]Price{"flex": {InputPerMTok: 0.5, OutputPerMTok: 1}}}, Usage{PromptTokens: 200, CompletionTokens: 10, ServiceTier: "flex"}, 610},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.InDelta(t, c.micro/1e6, c.price.Cost(c.usage), 1e-12)
		})
	}
}

// The reservation: every prompt token at the dearest prompt rate, every
// output token at the output rate, of the tiers the request falls in.
func TestPriceReservation(t *testing.T) {
	defaults := DefaultPrices()
	sonnet, gpt5 := defaults["claude-sonnet-4.5"], defaults["gpt-5"]
	cases := []struct {
		name           string
		price          Price
		prompt, output int
		tier           string
		micro          float64
	}{
		// 1000·3.75 (cache writes are the dearest) + 100·15.
		{"cache writes dearest", sonnet, 1_000, 100, "", 5_250},
		// 250000·7.50 + 100·22.50.
		{"long-context tier", sonnet, 250_000, 100, "", 1_877_250},
		// 1000·2.50 + 100·20.
		{"priority asked for", gpt5, 1_000, 100, "priority", 4_500},
		// 1000·1.25 + 100·10.
		{"auto: base rates", gpt5, 1_000, 100, "auto", 2_250},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.InDelta(t, c.micro/1e6, c.price.reservation(c.prompt, c.output, c.tier), 1e-12)
		})
	}
}

// LoadPrices reads cache-write, long-context and service-tier fields.
func TestLoadPricesTiers(t *testing.T) {
	catalog := `{
		"m": {
			"input_cost_per_token": 1e-06, "output_cost_per_token": 2e-06,
			"cache_read_input_token_cost": 1e-07, "cache_creation_input_token_cost": 1.25e-06,
			"input_cost_per_token_above_272k_tokens": 4e-06,
			"input_cost_per_token_above_128k_tokens": 2e-06,
			"output_cost_per_token_above_128k_tokens": 3e-06,
			"cache_read_input_token_cost_above_128k_tokens": 2e-07,
			"cache_creation_input_token_cost_above_128k_tokens": 2.5e-06,
			"input_cost_per_token_above_1000_tokens": 1.5e-06,
			"output_cost_per_token_above_512k_tokens": 9e-06,
			"input_cost_per_token_above_junk_tokens": 9e-06,
			"input_cost_per_token_above_0k_tokens": 9e-06,
			"input_cost_per_token_above_300k_tokens": "n/a",
			"input_cost_per_token_flex": 5e-07,
			"output_cost_per_token_above_272k_tokens_flex": 4e-06,
			"cache_creation_input_token_cost_priority": 2.5e-06,
			"input_cost_per_token_batches": 5e-07,
			"cache_creation_input_token_cost_above_1hr": 2e-06
		}
	}`
	prices, err := LoadPrices(strings.NewReader(catalog))
	require.NoError(t, err)
	tiers := []PriceTier{
		{AbovePromptTokens: 1000, InputPerMTok: 1.5},
		{AbovePromptTokens: 128_000, InputPerMTok: 2, CachedInputPerMTok: 0.2, CacheWriteInputPerMTok: 2.5, OutputPerMTok: 3},
		{AbovePromptTokens: 272_000, InputPerMTok: 4},
	}
	flexTiers := []PriceTier{tiers[0], tiers[1], {AbovePromptTokens: 272_000, InputPerMTok: 4, OutputPerMTok: 4}}
	want := Price{InputPerMTok: 1, CachedInputPerMTok: 0.1, CacheWriteInputPerMTok: 1.25, OutputPerMTok: 2, Tiers: tiers,
		ServiceTiers: map[string]Price{
			"flex":     {InputPerMTok: 0.5, Tiers: flexTiers},
			"priority": {CacheWriteInputPerMTok: 2.5},
		}}
	assert.Equal(t, want, prices["m"])

	t.Run("xAI bills from the threshold itself", func(t *testing.T) {
		prices, err := LoadPrices(strings.NewReader(`{"xai/grok-4": {"litellm_provider": "xai", "input_cost_per_token": 3e-06,
			"output_cost_per_token": 1.5e-05, "input_cost_per_token_above_128k_tokens": 6e-06, "output_cost_per_token_above_128k_tokens": 3e-05}}`))
		require.NoError(t, err)
		p := prices["xai/grok-4"]
		assert.Equal(t, []PriceTier{{AbovePromptTokens: 127_999, InputPerMTok: 6, OutputPerMTok: 30}}, p.Tiers)
		// A prompt of exactly 128000 tokens is at the tier: 128000·6.
		assert.InDelta(t, 0.768, p.Cost(Usage{PromptTokens: 128_000}), 1e-12)
	})
	t.Run("a bad tier or service-tier price is named", func(t *testing.T) {
		for _, field := range []string{"input_cost_per_token_above_200k_tokens", "output_cost_per_token_above_200k_tokens",
			"cache_read_input_token_cost_above_200k_tokens", "cache_creation_input_token_cost_above_200k_tokens",
			"cache_creation_input_token_cost", "output_cost_per_token_priority", "input_cost_per_token_above_200k_tokens_flex"} {
			entry := `{"input_cost_per_token": 1e-06, "` + field + `": -3e-06}`
			if field != "input_cost_per_token_above_200k_tokens" { // the tier's other rates are read where it is
				entry = `{"input_cost_per_token": 1e-06, "input_cost_per_token_above_200k_tokens": 2e-06, "` + field + `": -3e-06}`
			}
			_, err := LoadPrices(strings.NewReader(`{"m": ` + entry + `}`))
			require.ErrorContains(t, err, `model "m": `+field+` -3e-06`)
		}
	})
	t.Run("loaded prices pass New", func(t *testing.T) {
		_, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}}, Prices: costSample(t)})
		require.NoError(t, err)
		_, err = New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}}, Prices: prices})
		require.NoError(t, err)
	})
}

// New refuses tiers and service tiers that cannot be billed, naming the
// model, the field and the value.
func TestNewRefusesBadTiers(t *testing.T) {
	cases := []struct {
		price Price
		want  string
	}{
		{Price{InputPerMTok: 1, CacheWriteInputPerMTok: math.NaN()}, `Prices["m"].CacheWriteInputPerMTok NaN is not a price`},
		{Price{InputPerMTok: 1, Tiers: []PriceTier{{AbovePromptTokens: 0, InputPerMTok: 2}}}, `Prices["m"].Tiers[0].AbovePromptTokens 0 must be positive`},
		{Price{InputPerMTok: 1, Tiers: []PriceTier{{AbovePromptTokens: 200_000, InputPerMTok: 2}, {AbovePromptTokens: 128_000, InputPerMTok: 3}}},
			`Prices["m"].Tiers[1].AbovePromptTokens 128000 must be above Tiers[0]'s 200000`},
		{Price{InputPerMTok: 1, Tiers: []PriceTier{{AbovePromptTokens: 10, InputPerMTok: 2}, {AbovePromptTokens: 10, InputPerMTok: 3}}},
			`Prices["m"].Tiers[1].AbovePromptTokens 10 must be above Tiers[0]'s 10`},
		{Price{InputPerMTok: 1, Tiers: []PriceTier{{AbovePromptTokens: 10, OutputPerMTok: -1}}}, `Prices["m"].Tiers[0].OutputPerMTok -1 is not a price`},
		{Price{InputPerMTok: 1, Tiers: []PriceTier{{AbovePromptTokens: 10, CacheWriteInputPerMTok: math.Inf(1)}}}, `Prices["m"].Tiers[0].CacheWriteInputPerMTok +Inf is not a price`},
		{Price{InputPerMTok: 1, ServiceTiers: map[string]Price{"flex": {OutputPerMTok: -2}}}, `Prices["m"].ServiceTiers["flex"].OutputPerMTok -2 is not a price`},
		{Price{InputPerMTok: 1, ServiceTiers: map[string]Price{"Flex": {InputPerMTok: 0.5}}}, `Prices["m"].ServiceTiers["Flex"]: a service tier's name is the API's, lower-case`},
		{Price{InputPerMTok: 1, ServiceTiers: map[string]Price{"": {InputPerMTok: 0.5}}}, `Prices["m"].ServiceTiers[""]: a service tier's name`},
		{Price{InputPerMTok: 1, ServiceTiers: map[string]Price{"priority": {Tiers: []PriceTier{{AbovePromptTokens: 5, InputPerMTok: math.NaN()}}}}},
			`Prices["m"].ServiceTiers["priority"].Tiers[0].InputPerMTok NaN is not a price`},
		{Price{InputPerMTok: 1, ServiceTiers: map[string]Price{"flex": {ServiceTiers: map[string]Price{"priority": {}}}}},
			`Prices["m"].ServiceTiers["flex"] has ServiceTiers of its own`},
		{Price{InputPerMTok: 1, ServiceTiers: map[string]Price{"flex": {MaxInputTokens: 5}}}, `Prices["m"].ServiceTiers["flex"]: MaxInputTokens 5 and MaxOutputTokens 0 are the model's window`},
	}
	for _, c := range cases {
		t.Run(c.want, func(t *testing.T) {
			_, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
				Prices: map[string]Price{"ok": DefaultPrices()["claude-sonnet-4.5"], "m": c.price}})
			require.ErrorContains(t, err, c.want)
			assert.True(t, strings.HasPrefix(err.Error(), "relay: "), err.Error())
			assert.NotContains(t, err.Error(), `"ok"`, "only the bad model is named")
		})
	}
	t.Run("UnpricedPrice", func(t *testing.T) {
		_, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
			Budgets: []Budget{{Name: "b", Limit: 1, Window: Window{Calendar: Day},
				UnpricedPrice: &Price{InputPerMTok: 1, Tiers: []PriceTier{{AbovePromptTokens: 10, InputPerMTok: -1}}}}}})
		require.ErrorContains(t, err, `Budgets[0] ("b").UnpricedPrice.Tiers[0].InputPerMTok -1 is not a price`)
	})
}

// New keeps its own copy of the prices' tiers and service tiers: the
// caller changing theirs afterwards changes nothing.
func TestNewCopiesTiers(t *testing.T) {
	prices := map[string]Price{"m": {InputPerMTok: 1, OutputPerMTok: 1,
		Tiers:        []PriceTier{{AbovePromptTokens: 10, InputPerMTok: 2}},
		ServiceTiers: map[string]Price{"flex": {InputPerMTok: 0.5}}}}
	r, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}}, Prices: prices})
	require.NoError(t, err)
	prices["m"].Tiers[0].InputPerMTok = 100
	prices["m"].ServiceTiers["flex"] = Price{InputPerMTok: 100}
	p, ok := lookupPrice(r.s.prices, "m")
	require.True(t, ok)
	assert.Equal(t, 2.0, p.Tiers[0].InputPerMTok)
	assert.Equal(t, 0.5, p.ServiceTiers["flex"].InputPerMTok)
}
