package relay

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

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
		{"negative rpm", Config{Upstreams: []Upstream{{Name: "a", BaseURL: "https://x", RPM: -1}}}, `upstream "a": RPM -1 is negative`},
		{"negative factor", Config{Upstreams: []Upstream{{Name: "a", BaseURL: "https://x", PriceFactor: -1}}}, "PriceFactor"},
		{"buckets", Config{Upstreams: []Upstream{ok}, Buckets: Buckets{Mid: 500, Long: 100}}, "Buckets.Long"},
		{"body", Config{Upstreams: []Upstream{ok}, MaxBodyBytes: -1}, "MaxBodyBytes"},
		{"retry", Config{Upstreams: []Upstream{ok}, Retry: RetryConfig{MaxAttempts: -1}}, "Retry.MaxAttempts -1 is negative"},
		// Each error names the setting and its value.
		{"negative buckets", Config{Upstreams: []Upstream{ok}, Buckets: Buckets{Mid: -3}}, "Buckets.Mid -3 is negative"},
		{"retry interval", Config{Upstreams: []Upstream{ok}, Retry: RetryConfig{MaxInterval: -time.Second}}, "Retry.MaxInterval -1s is negative"},
		{"retry multiplier", Config{Upstreams: []Upstream{ok}, Retry: RetryConfig{Multiplier: -1.5}}, "Retry.Multiplier -1.5 is negative"},
		{"hedge delay", Config{Upstreams: []Upstream{ok}, Hedge: HedgeConfig{Delay: -time.Millisecond}}, "Hedge.Delay -1ms is negative"},
		{"hedge p95", Config{Upstreams: []Upstream{ok}, Hedge: HedgeConfig{P95: true}}, "Hedge.P95 needs a positive Delay"},
		{"hedge budget", Config{Upstreams: []Upstream{ok}, Hedge: HedgeConfig{Delay: time.Second, Budget: 1.5}}, "Hedge.Budget 1.5 is outside [0, 1]"},
		{"breaker", Config{Upstreams: []Upstream{ok}, Breaker: BreakerConfig{Cooldown: -time.Minute}}, "Breaker.Cooldown -1m0s is negative"},
		{"replicas", Config{Upstreams: []Upstream{ok}, Replicas: -2}, "Replicas -2 is negative"},
		{"state timeout", Config{Upstreams: []Upstream{ok}, StateTimeout: -time.Millisecond}, "StateTimeout -1ms is negative"},
		{"hold for", Config{Upstreams: []Upstream{ok}, Budgets: []Budget{{Name: "b", Limit: 1, Window: Window{Every: time.Hour}, HoldFor: -time.Second}}},
			`budget "b": HoldFor -1s is negative`},
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

func TestHeaderSecretsNotPrinted(t *testing.T) {
	up := Upstream{Name: "az", BaseURL: "https://user:pa55word@az.example/v1", Header: http.Header{"Api-Key": {"az-secret-123"}}}
	cfg := Config{Upstreams: []Upstream{up}}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
		for _, v := range []any{up, cfg} {
			out := fmt.Sprintf(verb, v)
			assert.NotContains(t, out, "az-secret-123")
			assert.NotContains(t, out, "pa55word")
		}
	}
}

func TestConfigCopiedByNew(t *testing.T) {
	prices := map[string]Price{"m": {OutputPerMTok: 1}}
	hdr := http.Header{"X-A": {"1"}}
	r, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://127.0.0.1:1", Header: hdr}}, Prices: prices})
	require.NoError(t, err)
	prices["m"] = Price{OutputPerMTok: 99}
	hdr.Set("X-A", "2")
	assert.Equal(t, 1.0, r.s.prices["m"].OutputPerMTok)
	assert.Equal(t, "1", r.ups[0].cfg.Header.Get("X-A"))
}

func TestReservedBodyTagsRejected(t *testing.T) {
	for _, k := range []string{"model", "stream_options", "prompt_cache_key"} {
		_, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://127.0.0.1:1", BodyTags: map[string]any{k: "x"}}}})
		require.Error(t, err, k)
		assert.Contains(t, err.Error(), `body tag "`+k+`"`)
	}
	out, _ := editTop([]byte(`{"model":"a"}`), []topSet{{key: "model", raw: []byte(`"b"`)}, {key: "model", raw: []byte(`"c"`)}, {key: "n", raw: []byte(`1`)}, {key: "n", raw: []byte(`2`)}})
	assert.Equal(t, `{"model":"b","n":1}`, string(out), "a key set twice: the first set wins")
}

// TestNewReportsEveryProblem: New names every invalid field and upstream at
// once, each with its bad value, and never a key.
func TestNewReportsEveryProblem(t *testing.T) {
	_, err := New(Config{
		Upstreams: []Upstream{
			{Name: "ftp", BaseURL: "ftp://x"},
			{Name: "hs", BaseURL: "https://x", KeyPrefixes: []string{"hs_live_"}},
			{Name: "neg", BaseURL: "https://x", RPM: -5, PriceFactor: -1},
			{Name: "pw", BaseURL: "gopher://user:s3cret-pass@x", APIKey: "sk-secret-key-1"},
		},
		Jitter:     2,
		LoadFactor: 0.5,
		Buckets:    Buckets{Mid: 900, Long: 100},
	})
	require.Error(t, err)
	msg := err.Error()
	for _, want := range []string{
		`upstream "ftp": BaseURL "ftp://x" must be an absolute http(s) URL`,
		`upstream "hs": APIKey is empty`,
		`upstream "neg": PriceFactor -1 is negative or not finite; RPM -5 is negative`,
		`upstream "pw": BaseURL "gopher://redacted@x" must be an absolute http(s) URL`,
		"Jitter 2 is over 1",
		"LoadFactor 0.5 must be at least 1",
		"Buckets.Long (100) is below Buckets.Mid (900)",
	} {
		assert.Contains(t, msg, want)
	}
	assert.NotContains(t, msg, "s3cret-pass")
	assert.NotContains(t, msg, "sk-secret-key-1")
	assert.NotContains(t, msg, "TPM", "only the fields that are wrong are named")
	for _, line := range strings.Split(msg, "\n") {
		assert.True(t, strings.HasPrefix(line, "relay: "), line)
	}
}

// TestEmptyAPIKeyForwardsCallerAuthorization: without APIKey the caller's
// Authorization reaches the upstream unchanged.
func TestEmptyAPIKeyForwardsCallerAuthorization(t *testing.T) {
	up := newRecorder(t, 200, []byte(`{}`))
	r, _ := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}}})
	req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "x")))
	req.Header.Set("Authorization", "Bearer callers-own")
	resp, err := r.RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, "Bearer callers-own", up.got()[0].Header.Get("Authorization"))
}
