package relay

import (
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// New refuses a price that is negative, NaN, infinite or above
// MaxPricePerMTok, and a negative window, naming the model, the field and
// the value: such prices made costs negative (a budget never charged), NaN
// or infinite.
func TestNewRefusesBadPrices(t *testing.T) {
	cases := []struct {
		price Price
		want  string
	}{
		{Price{InputPerMTok: -2.5, OutputPerMTok: 10}, `Prices["m"].InputPerMTok -2.5`},
		{Price{InputPerMTok: 2.5, CachedInputPerMTok: math.NaN(), OutputPerMTok: 10}, `Prices["m"].CachedInputPerMTok NaN`},
		{Price{InputPerMTok: 2.5, OutputPerMTok: math.Inf(1)}, `Prices["m"].OutputPerMTok +Inf`},
		{Price{InputPerMTok: math.Inf(-1), OutputPerMTok: 10}, `Prices["m"].InputPerMTok -Inf`},
		{Price{InputPerMTok: 2.5, OutputPerMTok: 1e300}, `Prices["m"].OutputPerMTok 1e+300`},
		{Price{InputPerMTok: 2.5, OutputPerMTok: 10, MaxInputTokens: -1}, `Prices["m"]: MaxInputTokens -1`},
		{Price{InputPerMTok: 2.5, OutputPerMTok: 10, MaxOutputTokens: -5}, `MaxOutputTokens -5 must not be negative`},
	}
	for _, c := range cases {
		t.Run(c.want, func(t *testing.T) {
			_, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
				Prices: map[string]Price{"ok": {InputPerMTok: 1}, "m": c.price}})
			require.ErrorContains(t, err, c.want)
			assert.True(t, strings.HasPrefix(err.Error(), "relay: "), err.Error())
			assert.NotContains(t, err.Error(), `"ok"`, "only the bad model is named")
		})
	}
	_, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
		Prices: map[string]Price{"free": {}, "dear": {InputPerMTok: MaxPricePerMTok, OutputPerMTok: MaxPricePerMTok}}})
	assert.NoError(t, err, "0 and MaxPricePerMTok are prices")
}

// LoadPrices refuses a catalog with a price that is a number but not a
// price, naming the model, the field and the value as the catalog wrote
// it; a field that is not a number is still treated as missing.
func TestLoadPricesRefusesBadPrices(t *testing.T) {
	cases := []struct{ entry, want string }{
		{`{"input_cost_per_token": -1e-06, "output_cost_per_token": 2e-06}`, `model "m": input_cost_per_token -1e-06`},
		{`{"input_cost_per_token": 1e-06, "output_cost_per_token": 2e-06, "cache_read_input_token_cost": -1}`, `model "m": cache_read_input_token_cost -1`},
		{`{"input_cost_per_token": 1e-06, "output_cost_per_token": 1e999}`, `model "m": output_cost_per_token 1e999`},
		{`{"input_cost_per_token": 1e-06, "output_cost_per_token": 2e6}`, `model "m": output_cost_per_token 2e6`},
		{`{"output_cost_per_token": -0.5}`, `model "m": output_cost_per_token -0.5`},
	}
	for _, c := range cases {
		t.Run(c.want, func(t *testing.T) {
			prices, err := LoadPrices(strings.NewReader(`{"ok": {"input_cost_per_token": 1e-06}, "m": ` + c.entry + `}`))
			require.ErrorContains(t, err, c.want)
			assert.Nil(t, prices)
			assert.True(t, strings.HasPrefix(err.Error(), "relay: "), err.Error())
		})
	}
	_, err := LoadPrices(strings.NewReader(`{"a": {"input_cost_per_token": -1}, "b": {"output_cost_per_token": -2}}`))
	assert.ErrorContains(t, err, `model "a"`, "every bad entry is named")
	assert.ErrorContains(t, err, `model "b"`, "every bad entry is named")
}
