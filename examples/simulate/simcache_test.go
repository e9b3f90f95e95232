package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay/examples/simulate/simfleet"
)

// TestSimCacheEvictsTail checks the simulator's cache tuning this example
// relies on: when the LRU is full, the tail of a cached prefix goes before
// its head, so a prompt seen again still hits its leading blocks.
func TestSimCacheEvictsTail(t *testing.T) {
	fleet := simfleet.New(simfleet.Config{
		Regions:     []string{"r"},
		Models:      []simfleet.Model{{Name: "m", Base: time.Millisecond}},
		CacheBlocks: 6, BlockBytes: 64, TimeScale: 0.001,
	})
	defer fleet.Close()
	up, _ := fleet.Upstream("r", "m")
	cached := func(content string) int {
		body, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 1,
			"messages": []map[string]string{{"role": "user", "content": content}}})
		resp, err := http.Post(up.URL+"/chat/completions", "application/json", strings.NewReader(string(body)))
		require.NoError(t, err)
		defer resp.Body.Close()
		var out struct {
			Usage struct {
				Details struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		return out.Usage.Details.Cached
	}
	a := strings.Repeat("alpha ", 41) + "alph" // canonical "user\n" + 250 bytes + "\n": 4 blocks
	b := strings.Repeat("beta ", 37) + "b"     // 3 blocks
	assert.Zero(t, cached(a))
	assert.Zero(t, cached(b)) // 7 blocks for 6 places: a's last block goes
	assert.Greater(t, cached(a), 0, "a's first three blocks are still cached")
	http.DefaultClient.CloseIdleConnections()
}
