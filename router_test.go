package relay

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNewValidates(t *testing.T) {
	ok := Upstream{Name: "a", BaseURL: "https://api.example.com/v1"}
	cases := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no upstreams", Config{}, "no upstreams"},
		{"no name", Config{Upstreams: []Upstream{{BaseURL: "https://x"}}}, "has no Name"},
		{"bad url", Config{Upstreams: []Upstream{{Name: "eu", BaseURL: "api.example.com"}}}, `upstream "eu": BaseURL`},
		{"duplicate", Config{Upstreams: []Upstream{ok, ok}}, `"a" is configured twice`},
		{"negative rpm", Config{Upstreams: []Upstream{{Name: "a", BaseURL: "https://x", RPM: -1}}}, "must not be negative"},
		{"negative factor", Config{Upstreams: []Upstream{{Name: "a", BaseURL: "https://x", PriceFactor: -1}}}, "PriceFactor"},
		{"buckets", Config{Upstreams: []Upstream{ok}, Buckets: Buckets{Mid: 500, Long: 100}}, "Buckets.Long"},
		{"body", Config{Upstreams: []Upstream{ok}, MaxBodyBytes: -1}, "MaxBodyBytes"},
		{"retry", Config{Upstreams: []Upstream{ok}, Retry: RetryConfig{MaxAttempts: -1}}, "RetryConfig"},
		{"bad tag", Config{Upstreams: []Upstream{{Name: "a", BaseURL: "https://x", BodyTags: map[string]any{"f": func() {}}}}}, `body tag "f"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(c.cfg)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
			assert.True(t, strings.HasPrefix(err.Error(), "relay: "), err.Error())
		})
	}
}

func TestKeyPrefixes(t *testing.T) {
	up := Upstream{Name: "hs", BaseURL: "https://x", APIKey: "sk-wrong-secret-123", KeyPrefixes: []string{"hs_live_", "hs_test_"}}
	_, err := New(Config{Upstreams: []Upstream{up}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `upstream "hs"`)
	assert.NotContains(t, err.Error(), "sk-wrong-secret-123")
	up.APIKey = "hs_test_abc"
	_, err = New(Config{Upstreams: []Upstream{up}})
	assert.NoError(t, err)
}

func TestSecretsNeverPrinted(t *testing.T) {
	const key = "sk-live-TOPSECRET-42"
	cfg := Config{Upstreams: []Upstream{{Name: "eu", BaseURL: "https://x/v1", APIKey: key, Header: http.Header{"X-A": {"1"}}}}}
	r, err := New(cfg)
	require.NoError(t, err)
	for _, v := range []any{r, cfg, &cfg, cfg.Upstreams[0], &cfg.Upstreams[0], cfg.Upstreams, r.ups[0].cfg} {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x"} {
			out := fmt.Sprintf(verb, v)
			assert.NotContains(t, out, key, "%s of %T", verb, v)
			assert.NotContains(t, out, fmt.Sprintf("%x", key), "%s of %T", verb, v)
		}
	}
	assert.Contains(t, fmt.Sprintf("%+v", cfg.Upstreams[0]), "[redacted]")
	assert.Contains(t, fmt.Sprintf("%v", r), "eu")

	// Errors and reports of a failing request carry no key either.
	rr, err := New(Config{Upstreams: []Upstream{{Name: "eu", BaseURL: "http://127.0.0.1:1/v1", APIKey: key}}, Retry: RetryConfig{MaxAttempts: 1},
		OnReport: func(rep Report) {
			assert.NotContains(t, fmt.Sprintf("%+v %#v", rep, rep), key)
		}})
	require.NoError(t, err)
	req, _ := http.NewRequest("POST", "http://x/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
	_, err = rr.RoundTrip(req)
	require.Error(t, err)
	assert.NotContains(t, fmt.Sprintf("%v %+v %#v", err, err, errors.Unwrap(err)), key)
}
