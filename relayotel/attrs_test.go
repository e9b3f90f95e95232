package relayotel

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestAddress: server.address and server.port come from the base URL, the
// port from the scheme when the URL has none.
func TestAddress(t *testing.T) {
	for in, want := range map[string]address{
		"https://api.example.com/v1":     {"api.example.com", 443},
		"http://127.0.0.1:8080/v1":       {"127.0.0.1", 8080},
		"http://[::1]:9000/openai/v1":    {"::1", 9000},
		"http://gateway.internal/v1?x=1": {"gateway.internal", 80},
	} {
		got, ok := parseAddress(in)
		assert.True(t, ok, in)
		assert.Equal(t, want, got, in)
	}
	_, ok := parseAddress("not a url")
	assert.False(t, ok)
}
