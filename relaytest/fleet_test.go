package relaytest

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFleet(t *testing.T) {
	f := NewFleet([]string{"us-east", "eu-west"}, WithCompletionTokens(2))
	defer f.Close()
	require.Len(t, f.Servers, 2)
	assert.Nil(t, f.Get("nowhere"))
	f.Get("us-east").Script(Fault{Status: http.StatusServiceUnavailable})

	resp, _ := post(t, f.Get("us-east"), "/chat/completions", chatHello)
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Equal(t, "us-east", resp.Header.Get(NameHeader))
	resp, _ = post(t, f.Get("eu-west"), "/chat/completions", chatHello)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "eu-west", resp.Header.Get(NameHeader))
	resp, _ = post(t, f.Servers[1], "/chat/completions", chatHello)
	assert.Equal(t, "eu-west", resp.Header.Get(NameHeader))
	assert.Equal(t, map[string]int{"us-east": 1, "eu-west": 2}, f.Calls())

	assert.Panics(t, func() { NewFleet([]string{"a", "a"}) })
}
