package relaytest

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
)

// Regressions: each test below failed before its fix.

// Fault.Header replaces headers of the same name the server would send,
// Content-Type too (it did not).
func TestRegressFaultHeaderReplacesContentType(t *testing.T) {
	s := newServer(t)
	s.Script(Fault{Header: http.Header{"Content-Type": {"text/plain"}}})
	resp, _ := post(t, s, "/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`)
	assert.Equal(t, "text/plain", resp.Header.Get("Content-Type"))
}
