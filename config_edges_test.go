package relay

import (
	"context"
	"errors"
	"net/url"

	"fmt"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay/relaytest"
)

// Edge cases of configuration: secrets in URLs, probes, key prefixes,
// rounding and non-finite values.

// A BaseURL's secrets are not printed by Upstream's or Config's Format, for
// any verb: a key in its query string (Azure-style ?api-key=), a key
// carried as the userinfo user (url.URL.Redacted only hides a password),
// and the password of a URL url.Parse refuses (a trailing newline read from
// a file). (All three were printed.)
func TestUpstreamFormatHidesURLSecrets(t *testing.T) {
	for _, c := range []struct{ name, secret, url string }{
		{"query key", "QSECRETazure0123456789", "https://az.example/openai?api-key=QSECRETazure0123456789"},
		{"userinfo key", "sk-userinfo-SECRET-42", "https://sk-userinfo-SECRET-42@api.example/v1"},
		{"unparsable", "PWSECRET-123456", "https://user:PWSECRET-123456@api.example/v1\n"},
	} {
		up := Upstream{Name: "u", BaseURL: c.url}
		for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
			for _, v := range []any{up, Config{Upstreams: []Upstream{up}}} {
				assert.NotContains(t, fmt.Sprintf(verb, v), c.secret, "%s: %s of %T", c.name, verb, v)
			}
		}
	}
}

// New's error for a BaseURL without a scheme does not print its query key
// (it printed the URL as given).
func TestNewErrorQueryKey(t *testing.T) {
	const key = "QSECRETazure0123456789"
	_, err := New(Config{Upstreams: []Upstream{{Name: "az", BaseURL: "az.example/openai?api-key=" + key}}})
	require.Error(t, err)
	assert.NotContains(t, err.Error(), key)
	_, err = New(Config{Upstreams: []Upstream{{Name: "az", BaseURL: "ftp://" + key + "@az.example/v1"}}})
	require.Error(t, err)
	assert.NotContains(t, err.Error(), key)
}

// lastProbe opens upstream a's breaker (two calls answered 500), lets its
// cooldown pass and runs Router.Probe with probePath; it returns the
// request the probe sent. header is the upstream's Header.
func lastProbe(t *testing.T, header http.Header, probePath string) relaytest.Recorded {
	srv := relaytest.NewServer()
	t.Cleanup(srv.Close)
	_, rec := probeOnce(t, srv, Upstream{Name: "a", BaseURL: srv.URL, Header: header}, probePath)
	return rec
}

// probeOnce opens up's breaker (two calls srv answers 500), lets its
// cooldown pass and runs Router.Probe with probePath; it returns the
// upstreams Probe re-admitted and the request the probe sent.
func probeOnce(t *testing.T, srv *relaytest.Server, up Upstream, probePath string) ([]string, relaytest.Recorded) {
	srv.SetDefault(relaytest.Fault{Status: 500})
	clock := newAutoClock()
	r, _ := newTestRouter(t, Config{
		Clock:     clock,
		Upstreams: []Upstream{up},
		Breaker:   BreakerConfig{Failures: 1, ProbePath: probePath},
		Retry:     RetryConfig{MaxAttempts: 1},
	})
	send(t, r, chatBody("gpt-4.1", "x"))
	send(t, r, chatBody("gpt-4.1", "x"))
	require.Equal(t, StateOpen, stateOf(r, r.byName[up.Name], clock.Now()))
	clock.Advance(time.Minute)
	srv.SetDefault(relaytest.Fault{})
	back := r.Probe(context.Background())
	return back, srv.Requests()[srv.Calls()-1]
}

// Router.Probe sends the upstream's Header with GET BaseURL+ProbePath (an
// upstream authenticated by a header, Api-Key, answered 401 and was never
// re-admitted).
func TestProbeSendsUpstreamHeader(t *testing.T) {
	last := lastProbe(t, http.Header{"Api-Key": {"az-key-123456"}}, "/models")
	require.Equal(t, "GET", last.Method)
	assert.Equal(t, "az-key-123456", last.Header.Get("Api-Key"), "the probe carries the upstream's headers")
}

// ProbePath with a query string (e.g. "/models?api-version=...") keeps its
// query (it was escaped into the path).
func TestProbePathQuery(t *testing.T) {
	last := lastProbe(t, nil, "/models?x=1")
	assert.Equal(t, "/v1/models", last.Path)
	assert.Equal(t, "x=1", last.RawQuery, "the query is sent as a query")
}

// An empty key prefix is refused by New, and ignored by the redaction (it
// passed every key and made the redaction take out every word).
func TestEmptyKeyPrefix(t *testing.T) {
	_, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "https://x/v1", APIKey: "whatever-key", KeyPrefixes: []string{""}}}})
	assert.Error(t, err, "an empty prefix checks nothing")
	s := newSecrets([]Upstream{{KeyPrefixes: []string{""}}})
	assert.Equal(t, "The server had an error", s.redact("The server had an error"))
}

// A small hedge budget is kept (it was rounded to nothing).
func TestHedgeBudgetRounding(t *testing.T) {
	r, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "https://x/v1"}}, Hedge: HedgeConfig{Delay: time.Second, Budget: 0.0005}})
	require.NoError(t, err)
	assert.Positive(t, r.hedges.deposit.Load(), "Budget 0.0005 (1 hedge per 2000 requests) became 0")
}

// A Base error naming the URL (as any http.Client-based transport's
// *url.Error does) has the BaseURL's query key taken out of the error and
// the report (it carried it), and is still the same error to errors.Is/As.
func TestBaseErrorQueryKey(t *testing.T) {
	const key = "QSECRETazure0123456789"
	r, reps := newTestRouter(t, Config{
		Upstreams: []Upstream{{Name: "az", BaseURL: "https://az.example/openai?api-key=" + key}},
		Retry:     RetryConfig{MaxAttempts: 1},
		Base: roundTripFunc(func(req *http.Request) (*http.Response, error) {
			return nil, &url.Error{Op: "Post", URL: req.URL.String(), Err: errors.New("connection reset by peer")}
		}),
	})
	_, _, err := send(t, r, chatBody("gpt-4.1", "x"))
	require.Error(t, err)
	assert.NotContains(t, err.Error(), key)
	assert.NotContains(t, reps.all()[0].Err.Error(), key)
}

// NaN and infinite floats in the configuration are refused by New (they
// passed the range checks, and a NaN PriceFactor or PerUSD would keep a
// budget from ever tripping).
func TestNaNConfigRefused(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	up := func() Upstream { return Upstream{Name: "a", BaseURL: "http://a.test/v1"} }
	for name, c := range map[string]Config{
		"Jitter":      {Jitter: nan},
		"LoadFactor":  {LoadFactor: inf},
		"PerUSD":      {Currency: Currency{Code: "X", PerUSD: nan}},
		"PriceFactor": {Upstreams: []Upstream{func() Upstream { u := up(); u.PriceFactor = nan; return u }()}},
		"Weight":      {Upstreams: []Upstream{func() Upstream { u := up(); u.Weight = inf; return u }()}},
	} {
		if len(c.Upstreams) == 0 {
			c.Upstreams = []Upstream{up()}
		}
		_, err := New(c)
		assert.ErrorContains(t, err, name, "%s NaN or infinite", name)
	}
}
