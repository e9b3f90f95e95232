package interop

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	. "github.com/tokenrelay/relay"
)

// roundTripFunc adapts a function to http.RoundTripper.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestSDKCancelledAsHeadersArriveIsReported: when an SDK's call's context
// ends just as the router returns the headers, the report agrees with what
// the caller got: openai-go fails with the cancel (it closes the body
// unread; that was reported as a success), go-openai may still decode the
// whole answer it already has.
func TestSDKCancelledAsHeadersArriveIsReported(t *testing.T) {
	for _, sdk := range sdkChats {
		t.Run(sdk.name, func(t *testing.T) {
			up := newFakeServer(t)
			r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}}})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			rt := roundTripFunc(func(req *http.Request) (*http.Response, error) {
				resp, err := r.RoundTrip(req)
				cancel()
				return resp, err
			})
			err := sdk.call(ctx, rt)
			if sdk.name == "openai-go" {
				require.ErrorIs(t, err, context.Canceled, "the caller's call failed")
			}
			require.Len(t, reps.all(), 1)
			rep := reps.all()[0]
			if errors.Is(err, context.Canceled) {
				assert.ErrorIs(t, rep.Err, context.Canceled)
			} else {
				assert.NoError(t, err)
				assert.NoError(t, rep.Err)
				assert.False(t, rep.Usage.Estimated)
			}
		})
	}
}
