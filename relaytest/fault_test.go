package relaytest

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
)

// Fault.Header replaces headers of the same name the server would send,
// Content-Type too.
func TestFaultHeaderReplacesContentType(t *testing.T) {
	s := newServer(t)
	s.Script(Fault{Header: http.Header{"Content-Type": {"text/plain"}}})
	resp, _ := post(t, s, "/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`)
	assert.Equal(t, "text/plain", resp.Header.Get("Content-Type"))
}
