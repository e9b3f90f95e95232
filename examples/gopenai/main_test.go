package main

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRunAgainstRelaytest runs the example as a newcomer would without a key:
// against relaytest's fake server, through the router, with go-openai.
func TestRunAgainstRelaytest(t *testing.T) {
	t.Setenv("OPENAI_API_KEY", "")
	t.Setenv("RELAY_BASE_URL", "")
	if err := run(); err != nil {
		t.Fatal(err)
	}
}
