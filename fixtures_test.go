package relay

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// errorFixture is the shape of openai-wire/error_*.json: a status, optional
// headers and the body the API sent.
type errorFixture struct {
	Status  int               `json:"status"`
	Headers map[string]string `json:"headers"`
	Body    json.RawMessage   `json:"body"`
}

// TestErrorFixtures serves every recorded API error through the router with
// one attempt: the caller gets the status and the body byte for byte with
// err == nil, and the report says what failed.
func TestErrorFixtures(t *testing.T) {
	files, err := filepath.Glob("testdata/openai-wire/error_*.json")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			var fx errorFixture
			require.NoError(t, json.Unmarshal(fixture(t, filepath.Base(file)), &fx))
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				for k, v := range fx.Headers {
					w.Header().Set(k, v)
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(fx.Status)
				w.Write(fx.Body)
			}))
			defer srv.Close()
			r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL}}, Retry: RetryConfig{MaxAttempts: 1}})
			resp, body, err := send(t, r, chatBody("gpt-4o", "x"))
			require.NoError(t, err)
			assert.Equal(t, fx.Status, resp.StatusCode)
			assert.Equal(t, string(fx.Body), string(body))
			rep := reps.all()[0]
			assert.ErrorIs(t, rep.Err, ErrUpstreamStatus)
			assert.Equal(t, fx.Status, rep.StatusCode)
			assert.Zero(t, rep.CostUSD, "an error is not billed")
		})
	}
}

// TestRateLimitHeaderFixtures feeds the documented and observed
// x-ratelimit-* header sets to an upstream's limiter: a remaining count of 0
// holds the upstream until its reset, any other count does not.
func TestRateLimitHeaderFixtures(t *testing.T) {
	var doc map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(fixture(t, "ratelimit_headers_examples.json"), &doc))
	var sets []map[string]string
	var table struct {
		Headers map[string]string `json:"headers"`
	}
	require.NoError(t, json.Unmarshal(doc["source_docs_table"], &table))
	sets = append(sets, table.Headers)
	var observed []struct {
		Headers map[string]string `json:"headers"`
	}
	require.NoError(t, json.Unmarshal(doc["observed_examples"], &observed))
	for _, o := range observed {
		sets = append(sets, o.Headers)
	}
	require.Greater(t, len(sets), 1)
	now := newFakeClock().Now()
	for i, hs := range sets {
		resp := &http.Response{StatusCode: 200, Header: http.Header{}}
		for k, v := range hs {
			resp.Header.Set(k, v)
		}
		var got int64
		if until := holdOf(resp, now); !until.IsZero() {
			got = until.UnixNano()
		}
		var want int64
		for _, kind := range []string{"requests", "tokens"} {
			if strings.TrimSpace(hs["x-ratelimit-remaining-"+kind]) == "0" {
				if d, ok := parseReset(hs["x-ratelimit-reset-"+kind]); ok {
					want = max(want, now.Add(d).UnixNano())
				}
			}
		}
		assert.Equal(t, want, got, "set %d: %v", i, hs)
	}
}
