package relay_test

import (
	"fmt"

	"github.com/tokenrelay/relay"
)

// Prices as providers bill them: Claude Sonnet 4.5's cache writes and its
// long-context rates above 200k prompt tokens, GPT-5's flex and priority
// service tiers.
func ExamplePrice() {
	// README:prices
	sonnet := relay.Price{
		InputPerMTok: 3, CachedInputPerMTok: 0.30, CacheWriteInputPerMTok: 3.75, OutputPerMTok: 15,
		MaxInputTokens: 1_000_000, MaxOutputTokens: 64_000, // the 1M window
		Tiers: []relay.PriceTier{{AbovePromptTokens: 200_000, // every token of a longer request at these
			InputPerMTok: 6, CachedInputPerMTok: 0.60, CacheWriteInputPerMTok: 7.50, OutputPerMTok: 22.50}},
	}
	gpt5 := relay.Price{
		InputPerMTok: 1.25, CachedInputPerMTok: 0.125, OutputPerMTok: 10,
		ServiceTiers: map[string]relay.Price{
			"flex":     {InputPerMTok: 0.625, CachedInputPerMTok: 0.0625, OutputPerMTok: 5},
			"priority": {InputPerMTok: 2.50, CachedInputPerMTok: 0.25, OutputPerMTok: 20},
		},
	}
	short := relay.Usage{PromptTokens: 10_000, CachedTokens: 1_000, CacheWriteTokens: 2_000, CompletionTokens: 1_000}
	long := relay.Usage{PromptTokens: 250_000, CachedTokens: 100_000, CompletionTokens: 2_000}
	fmt.Printf("sonnet: $%.5f; above 200k: $%.5f\n", sonnet.Cost(short), sonnet.Cost(long))
	u := relay.Usage{PromptTokens: 10_000, CompletionTokens: 1_000}
	for _, tier := range []string{"default", "flex", "priority"} {
		u.ServiceTier = tier // as the response's service_tier says
		fmt.Printf("gpt-5 %s: $%.5f\n", tier, gpt5.Cost(u))
	}
	// README:end

	// Output:
	// sonnet: $0.04380; above 200k: $1.00500
	// gpt-5 default: $0.02250
	// gpt-5 flex: $0.01125
	// gpt-5 priority: $0.04500
}
