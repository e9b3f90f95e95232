package relaytest

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

// A fault scripted on a SimFleet's Server is honoured (the simulation
// answered as usual, and the fault was used up).
func TestRegressSimServerScript(t *testing.T) {
	f := NewSimFleet(SimConfig{Regions: []string{"r"}, Models: []SimModel{{Name: "m"}}})
	defer f.Close()
	s := f.Server("r", "m")
	require.NotNil(t, s)
	s.Script(Fault{Status: 500})
	resp, b := post(t, s, "/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	assert.Equal(t, 500, resp.StatusCode, string(b))
	assert.Equal(t, 0, s.Pending())
}

// So is a default fault set on it.
func TestRegressSimServerSetDefault(t *testing.T) {
	f := NewSimFleet(SimConfig{Regions: []string{"r"}, Models: []SimModel{{Name: "m"}}})
	defer f.Close()
	s := f.Server("r", "m")
	s.SetDefault(Fault{Status: 503})
	resp, b := post(t, s, "/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	assert.Equal(t, 503, resp.StatusCode, string(b))
}
