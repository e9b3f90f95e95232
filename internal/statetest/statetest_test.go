package statetest

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relaytest"
)

// TestDownState: with a DownState, every request still completes, decided
// in-process, and each failed call is told to OnStateFallback.
func TestDownState(t *testing.T) {
	srv := relaytest.NewServer()
	defer srv.Close()
	var told atomic.Int64
	r, err := relay.New(relay.Config{
		Upstreams: []relay.Upstream{{Name: "a", BaseURL: srv.URL, RPM: 100}},
		State:     DownState(), Replicas: 2,
		Hooks: relay.Hooks{OnStateFallback: func(e relay.StateFallbackEvent) {
			if errors.Is(e.Err, ErrStateDown) {
				told.Add(1)
			}
		}},
	})
	require.NoError(t, err)
	body := []byte(`{"model":"gpt-4.1","messages":[{"role":"user","content":"hi"}]}`)
	req, err := http.NewRequest(http.MethodPost, "http://relay/v1/chat/completions", bytes.NewReader(body))
	require.NoError(t, err)
	resp, err := r.RoundTrip(req)
	require.NoError(t, err)
	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Positive(t, r.StateFallbacks())
	require.EqualValues(t, r.StateFallbacks(), told.Load())
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
