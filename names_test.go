package relay

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/tokenrelay/relay/relaytest"
)

const (
	azureVersion = "2024-10-21"
	upstreamKey  = "sk-upstream-123456"
	azureKey     = "azure-key-0123456789"
)

// nameStyles are the ways an upstream names the same models: OpenAI (as
// the caller), an OpenRouter-style prefix, an Azure deployment, and
// Azure's OpenAI-compatible v1 API.
var nameStyles = []struct {
	name  string
	names map[string]string
	azure bool // the deployment API
	v1    bool // Azure's v1 API (BaseURL …/openai/v1, no AzureConfig)
}{
	{name: "openai"},
	{name: "openrouter", names: map[string]string{"gpt-4.1": "openai/gpt-4.1", "text-embedding-3-small": "openai/text-embedding-3-small"}},
	{name: "azure", names: map[string]string{"gpt-4.1": "prod-41", "text-embedding-3-small": "emb"}, azure: true},
	{name: "azure-v1", names: map[string]string{"gpt-4.1": "prod-41", "text-embedding-3-small": "emb"}, v1: true},
}

// nameStyleRouter starts a fake upstream of a style, which checks its key,
// and a router to it.
func nameStyleRouter(t *testing.T, names map[string]string, azure, v1 bool) (*Router, *reports, *relaytest.Server) {
	t.Helper()
	up := Upstream{Name: "up", ModelNames: names, APIKey: upstreamKey}
	var srv *relaytest.Server
	switch {
	case azure:
		srv = relaytest.NewServer(relaytest.WithAzure(azureVersion, "prod-41", "emb"), relaytest.WithAPIKey(azureKey))
		up.BaseURL, up.APIKey, up.Azure = srv.AzureURL, azureKey, &AzureConfig{APIVersion: azureVersion}
	case v1:
		srv = relaytest.NewServer(relaytest.WithAzure(azureVersion), relaytest.WithAPIKey(upstreamKey))
		up.BaseURL = srv.AzureURL + "/openai/v1"
	default:
		srv = relaytest.NewServer(relaytest.WithAPIKey(upstreamKey))
		up.BaseURL = srv.URL
	}
	t.Cleanup(srv.Close)
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{up}})
	return r, reps, srv
}

// TestModelNamesOnTheWire: each endpoint's call, streaming or not, goes to
// the path, with the query, key header and body model the upstream's
// style wants (the fake upstream answers 200 only then), while the
// response header and the report keep the caller's model beside the name
// sent.
func TestModelNamesOnTheWire(t *testing.T) {
	calls := []struct {
		name, method, path, body string
		model                    string // the logical model
	}{
		{"chat", "POST", "/v1/chat/completions", chatBody("gpt-4.1", "Hi"), "gpt-4.1"},
		{"chat stream", "POST", "/v1/chat/completions", `{"model":"gpt-4.1","stream":true,"messages":[{"role":"user","content":"Hi"}]}`, "gpt-4.1"},
		{"responses", "POST", "/v1/responses", `{"model":"gpt-4.1","input":"Hi"}`, "gpt-4.1"},
		{"responses stream", "POST", "/v1/responses", `{"model":"gpt-4.1","input":"Hi","stream":true}`, "gpt-4.1"},
		{"completions", "POST", "/v1/completions", `{"model":"gpt-4.1","prompt":"Hi"}`, "gpt-4.1"},
		{"embeddings", "POST", "/v1/embeddings", `{"model":"text-embedding-3-small","input":"Hi"}`, "text-embedding-3-small"},
		{"models", "GET", "/v1/models", "", ""},
	}
	for _, st := range nameStyles {
		t.Run(st.name, func(t *testing.T) {
			r, reps, srv := nameStyleRouter(t, st.names, st.azure, st.v1)
			for i, c := range calls {
				t.Run(c.name, func(t *testing.T) {
					req, _ := http.NewRequest(c.method, "http://relay.invalid"+c.path+"?trace=1", strings.NewReader(c.body))
					req.Header.Set("Authorization", "Bearer sk-caller-123456")
					req.Header["api-key"] = []string{"caller-azure-key"} // (set by index: not canonical)
					resp, err := r.RoundTrip(req)
					require.NoError(t, err)
					body, err := io.ReadAll(resp.Body)
					require.NoError(t, err)
					resp.Body.Close()
					require.Equal(t, 200, resp.StatusCode, string(body))

					got := srv.Requests()[i]
					sent := c.model
					if n, ok := st.names[c.model]; ok {
						sent = n
					}
					ep := strings.TrimPrefix(c.path, "/v1/")
					wantPath, wantQuery := "/v1/"+ep, "trace=1"
					switch {
					case st.azure && (ep == EndpointResponses || ep == "models"):
						wantPath, wantQuery = "/openai/"+ep, "api-version="+azureVersion+"&trace=1"
					case st.azure:
						wantPath, wantQuery = "/openai/deployments/"+sent+"/"+ep, "api-version="+azureVersion+"&trace=1"
					case st.v1:
						wantPath = "/openai/v1/" + ep
					}
					assert.Equal(t, wantPath, got.Path)
					assert.Equal(t, wantQuery, got.RawQuery)
					if st.azure {
						assert.Equal(t, []string{azureKey}, got.Header.Values("Api-Key"), "the caller's key stays home")
						assert.Empty(t, got.Header.Values("Authorization"), "the caller's key stays home")
					} else {
						assert.Equal(t, "Bearer "+upstreamKey, got.Header.Get("Authorization"))
					}
					assert.Equal(t, sent, gjson.GetBytes(got.Body, "model").Str)
					if strings.HasSuffix(c.name, "stream") && ep == EndpointChat {
						assert.True(t, gjson.GetBytes(got.Body, "stream_options.include_usage").Bool(), "the usage option is asked for beside the model")
					}

					rep := reps.all()[i]
					assert.NoError(t, rep.Err)
					assert.Equal(t, c.model, rep.Model)
					assert.Equal(t, c.model, rep.RequestedModel)
					assert.Equal(t, sent, rep.UpstreamModel)
					assert.Equal(t, c.model, resp.Header.Get(HeaderModel))
					if c.model != "" {
						assert.False(t, rep.Usage.Estimated, "the usage came from the upstream")
						assert.Positive(t, rep.Usage.PromptTokens)
						assert.True(t, rep.Priced, "priced by the caller's name")
						assert.Positive(t, rep.CostUSD)
					}
				})
			}
		})
	}
}

// TestModelNamesPerUpstream: a retry to another upstream sends that
// upstream's name for the model, not the first one's, and the attempt hook
// sees both names.
func TestModelNamesPerUpstream(t *testing.T) {
	srvs := newServers(t, 2)
	srvs[0].Script(relaytest.Fault{Status: 503})
	var mu sync.Mutex
	var attempts []AttemptInfo
	r, reps := newTestRouter(t, Config{
		Clock: newAutoClock(),
		Upstreams: []Upstream{
			{Name: "a", BaseURL: srvs[0].URL, ModelNames: map[string]string{"gpt-4.1": "a/gpt-4.1"}},
			{Name: "b", BaseURL: srvs[1].URL, ModelNames: map[string]string{"gpt-4.1": "b/gpt-4.1"}},
			{Name: "c", BaseURL: srvs[1].URL},
		},
		Hooks: Hooks{OnAttempt: func(_ context.Context, a AttemptInfo, _ *http.Request) func(AttemptDone) {
			mu.Lock()
			attempts = append(attempts, a)
			mu.Unlock()
			return nil
		}},
	})
	resp, _, err := send(t, r, chatBody("gpt-4.1", "x"))
	require.NoError(t, err)
	assert.Equal(t, "b", resp.Header.Get(HeaderUpstream))
	assert.Equal(t, "a/gpt-4.1", srvs[0].Requests()[0].Model)
	assert.Equal(t, "b/gpt-4.1", srvs[1].Requests()[0].Model)
	rep := reps.all()[0]
	assert.Equal(t, "gpt-4.1", rep.Model)
	assert.Equal(t, "b/gpt-4.1", rep.UpstreamModel)
	mu.Lock()
	seen := attempts
	mu.Unlock()
	require.Len(t, seen, 2)
	assert.Equal(t, []string{"gpt-4.1", "gpt-4.1"}, []string{seen[0].Model, seen[1].Model})
	assert.Equal(t, []string{"a/gpt-4.1", "b/gpt-4.1"}, []string{seen[0].UpstreamModel, seen[1].UpstreamModel})

	// Back to an upstream without a name for it: the caller's body.
	srvs[0].Script(relaytest.Fault{Status: 503})
	srvs[1].Script(relaytest.Fault{Status: 503})
	resp, _, err = send(t, r, chatBody("gpt-4.1", "x"))
	require.NoError(t, err)
	assert.Equal(t, "c", resp.Header.Get(HeaderUpstream))
	assert.Equal(t, chatBody("gpt-4.1", "x"), string(srvs[1].Requests()[2].Body))
}

// namePrices gives "small" a 100-token window and "large" a 10,000-token
// one, at different prices.
var namePrices = map[string]Price{
	"small": {InputPerMTok: 1, OutputPerMTok: 1, MaxInputTokens: 100, MaxOutputTokens: 50},
	"large": {InputPerMTok: 2000, OutputPerMTok: 2000, MaxInputTokens: 10000, MaxOutputTokens: 1000},
}

// nameFleet is an Azure upstream serving "small" as the deployment
// "dep-small" and an OpenRouter-style one serving "large" as
// "vendor/large", under a policy that falls back from small to large.
func nameFleet(t *testing.T, cfg Config) (*Router, *reports, *relaytest.Server, *relaytest.Server) {
	az := newFakeServerT(t, relaytest.WithAzure(azureVersion, "dep-small"))
	or := newFakeServerT(t)
	cfg.Prices = namePrices
	cfg.Clock = newAutoClock()
	cfg.Upstreams = []Upstream{
		{Name: "az", BaseURL: az.AzureURL, Azure: &AzureConfig{APIVersion: azureVersion}, Models: []string{"small"}, ModelNames: map[string]string{"small": "dep-small"}},
		{Name: "or", BaseURL: or.URL, Models: []string{"large"}, ModelNames: map[string]string{"large": "vendor/large"}},
	}
	cfg.Policy = PolicyFunc(func(q Request) Route { return Route{Fallbacks: []string{"large"}} })
	r, reps := newTestRouter(t, cfg)
	return r, reps, az, or
}

func newFakeServerT(t *testing.T, opts ...relaytest.Option) *relaytest.Server {
	s := relaytest.NewServer(opts...)
	t.Cleanup(s.Close)
	return s
}

// TestModelNamesKeepLogicalRouting: context windows, Decide, fallbacks,
// prices and budgets go by the caller's names, never the upstreams'.
func TestModelNamesKeepLogicalRouting(t *testing.T) {
	var mu sync.Mutex
	var spends []SpendEvent
	r, reps, az, or := nameFleet(t, Config{
		Budgets: []Budget{{Name: "per-model", Scope: PerModel(), Limit: 100, Window: Window{Every: time.Hour}}},
		Hooks: Hooks{OnSpend: func(e SpendEvent) {
			mu.Lock()
			spends = append(spends, e)
			mu.Unlock()
		}},
	})

	// Decide shows both names, the route in the caller's.
	decide := func(body string) Decision {
		req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(body))
		d, err := r.Decide(req)
		require.NoError(t, err)
		return d
	}
	d := decide(windowRequest(10, 0))
	assert.Equal(t, "small", d.Route.Model)
	assert.Equal(t, []string{"az", "or"}, d.Upstreams)
	assert.Equal(t, []string{"dep-small", "vendor/large"}, sentNames(d))
	// The window is the logical model's: too long for small.
	d = decide(windowRequest(200, 0))
	assert.Equal(t, "large", d.Route.Model)
	assert.Equal(t, ConstraintContextWindow, d.Constraint)
	assert.Equal(t, []string{"vendor/large"}, sentNames(d))

	// A failure falls back to the logical fallback, priced as it.
	az.Script(relaytest.Fault{Status: 503})
	resp, _, err := send(t, r, windowRequest(10, 0))
	require.NoError(t, err)
	assert.Equal(t, "or", resp.Header.Get(HeaderUpstream))
	assert.Equal(t, "large", resp.Header.Get(HeaderModel))
	assert.Equal(t, "/openai/deployments/dep-small/chat/completions", az.Requests()[0].Path)
	assert.Equal(t, "vendor/large", or.Requests()[0].Model)
	rep := reps.all()[0]
	assert.Equal(t, "small", rep.RequestedModel)
	assert.Equal(t, "large", rep.Model)
	assert.Equal(t, "vendor/large", rep.UpstreamModel)
	require.True(t, rep.Priced)
	assert.InDelta(t, namePrices["large"].Cost(rep.Usage), rep.CostUSD, 1e-12)

	// A deployment answers, priced and budgeted as the caller's model.
	resp, _, err = send(t, r, windowRequest(10, 0))
	require.NoError(t, err)
	assert.Equal(t, "az", resp.Header.Get(HeaderUpstream))
	rep = reps.all()[1]
	assert.Equal(t, "small", rep.Model)
	assert.Equal(t, "dep-small", rep.UpstreamModel)
	assert.InDelta(t, namePrices["small"].Cost(rep.Usage), rep.CostUSD, 1e-12)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, spends, 2)
	assert.Equal(t, "large", spends[0].Key, "a PerModel ledger of the caller's name")
	assert.Equal(t, "small", spends[1].Key)
}

// TestAzureServesOnlyDeployableNames: an Azure upstream without Models
// serves the models whose name can be a deployment in its path; another
// (a vendor prefix, a dot segment) goes to the other upstreams, or fails
// with ErrNoUpstream, never into the path.
func TestAzureServesOnlyDeployableNames(t *testing.T) {
	az := newFakeServerT(t, relaytest.WithAzure(azureVersion))
	other := newFakeServerT(t)
	r, _ := newTestRouter(t, Config{Upstreams: []Upstream{
		{Name: "az", BaseURL: az.AzureURL, Azure: &AzureConfig{APIVersion: azureVersion}},
		{Name: "other", BaseURL: other.URL, Models: []string{"meta/llama-3"}},
	}})
	resp, _, err := send(t, r, chatBody("gpt-4o", "x"))
	require.NoError(t, err)
	assert.Equal(t, "az", resp.Header.Get(HeaderUpstream))
	assert.Equal(t, "/openai/deployments/gpt-4o/chat/completions", az.Requests()[0].Path)
	resp, _, err = send(t, r, chatBody("meta/llama-3", "x"))
	require.NoError(t, err)
	assert.Equal(t, "other", resp.Header.Get(HeaderUpstream))
	for _, m := range []string{"..", "a/../b", "a%2Fb", "a b"} {
		_, _, err = send(t, r, chatBody(m, "x"))
		assert.ErrorIs(t, err, ErrNoUpstream, m)
	}
	assert.Equal(t, 1, az.Calls())
}

// TestAzureProbePath: the active health probe reaches an Azure upstream
// where a request for the path goes: under /openai, with the api-version
// and the Api-Key.
func TestAzureProbePath(t *testing.T) {
	az := newFakeServerT(t, relaytest.WithAzure(azureVersion), relaytest.WithAPIKey(azureKey))
	back, last := probeOnce(t, az, Upstream{Name: "az", BaseURL: az.AzureURL, APIKey: azureKey, Azure: &AzureConfig{APIVersion: azureVersion}}, "/models")
	assert.Equal(t, []string{"az"}, back)
	assert.Equal(t, "/openai/models", last.Path)
	assert.Equal(t, "api-version="+azureVersion, last.RawQuery)
	assert.Equal(t, azureKey, last.Header.Get("Api-Key"))
}

// TestAzureKeyStaysSecret: the Azure key is printed nowhere, is not in the
// request handed back, and an upstream that echoes it in a stream's error
// event gets it redacted from the error the reader and the report carry.
func TestAzureKeyStaysSecret(t *testing.T) {
	az := newFakeServerT(t, relaytest.WithAzure(azureVersion))
	az.SetDefault(relaytest.Fault{ContentType: "text/event-stream",
		Body: `data: {"error":{"message":"Access denied for key ` + azureKey + `","code":"401"}}` + "\n\n"})
	cfg := Config{Upstreams: []Upstream{{Name: "az", BaseURL: az.AzureURL, APIKey: azureKey, Azure: &AzureConfig{APIVersion: azureVersion}}}}
	assert.NotContains(t, fmt.Sprintf("%+v %v %#v", cfg, cfg.Upstreams[0], cfg.Upstreams), azureKey)
	r, reps := newTestRouter(t, cfg)
	assert.NotContains(t, fmt.Sprintf("%+v %v", r, r), azureKey)
	req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(`{"model":"gpt-4.1","stream":true,"messages":[{"role":"user","content":"x"}]}`))
	resp, err := r.RoundTrip(req)
	require.NoError(t, err)
	assert.Empty(t, resp.Request.Header.Values("Api-Key"), "the caller's request comes back")
	_, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Error(t, err)
	assert.NotContains(t, err.Error(), azureKey)
	rep := reps.all()[0]
	require.Error(t, rep.Err)
	assert.NotContains(t, rep.Err.Error(), azureKey)
	assert.Equal(t, azureKey, az.Requests()[0].Header.Get("Api-Key"))
}

// TestNewChecksModelNames: New refuses names that would break the
// request or leave the BaseURL, and accepts the usual ones.
func TestNewChecksModelNames(t *testing.T) {
	az := func(u Upstream) Upstream {
		u.Name, u.BaseURL = "az", "https://res.openai.azure.com"
		if u.Azure == nil {
			u.Azure = &AzureConfig{APIVersion: azureVersion}
		}
		return u
	}
	plain := func(u Upstream) Upstream {
		u.Name, u.BaseURL = "or", "https://openrouter.ai/api/v1"
		return u
	}
	cases := []struct {
		name string
		up   Upstream
		want string // "" accepted
	}{
		{"vendor prefix", plain(Upstream{ModelNames: map[string]string{"gpt-4.1": "openai/gpt-4.1"}}), ""},
		{"deployment", az(Upstream{Models: []string{"gpt-4.1", "gpt-4o"}, ModelNames: map[string]string{"gpt-4.1": "prod_gpt-4.1"}}), ""},
		{"azure, every model", az(Upstream{APIKey: azureKey}), ""},
		{"empty name", plain(Upstream{ModelNames: map[string]string{"gpt-4.1": ""}}), `ModelNames["gpt-4.1"] ""`},
		{"empty key", plain(Upstream{ModelNames: map[string]string{"": "x"}}), `ModelNames key ""`},
		{"control character", plain(Upstream{ModelNames: map[string]string{"gpt-4.1": "a\r\nb"}}), `ModelNames["gpt-4.1"]`},
		{"key not served", plain(Upstream{Models: []string{"gpt-4o"}, ModelNames: map[string]string{"gpt-4.1": "x"}}), `ModelNames maps "gpt-4.1", which is not in Models`},
		{"slash in deployment", az(Upstream{ModelNames: map[string]string{"gpt-4.1": "a/b"}}), `"a/b" is not an Azure deployment name`},
		{"dot segment deployment", az(Upstream{ModelNames: map[string]string{"gpt-4.1": ".."}}), `".." is not an Azure deployment name`},
		{"escaped deployment", az(Upstream{ModelNames: map[string]string{"gpt-4.1": "a%2F.."}}), `is not an Azure deployment name`},
		{"unmapped model", az(Upstream{Models: []string{"openai/gpt-4.1"}}), `Models has "openai/gpt-4.1", which is not an Azure deployment name`},
		{"no api-version", az(Upstream{Azure: &AzureConfig{}}), `Azure.APIVersion "" must be set`},
		{"api-version breaks the query", az(Upstream{Azure: &AzureConfig{APIVersion: "2024&x=1"}}), `Azure.APIVersion "2024&x=1"`},
		{"api-version in BaseURL", Upstream{Name: "az", BaseURL: "https://res.openai.azure.com?api-version=1", Azure: &AzureConfig{APIVersion: azureVersion}}, "BaseURL has an api-version"},
		{"deployment path in BaseURL", Upstream{Name: "az", BaseURL: "https://res.openai.azure.com/openai/deployments/x", Azure: &AzureConfig{APIVersion: azureVersion}}, "must be the resource endpoint"},
		{"openai in BaseURL", Upstream{Name: "az", BaseURL: "https://res.openai.azure.com/openai/", Azure: &AzureConfig{APIVersion: azureVersion}}, "must be the resource endpoint"},
		{"v1 BaseURL with Azure", Upstream{Name: "az", BaseURL: "https://res.openai.azure.com/openai/v1", Azure: &AzureConfig{APIVersion: azureVersion}}, "must be the resource endpoint"},
		{"key twice", az(Upstream{APIKey: azureKey, Header: http.Header{"api-key": {"other-key-123"}}}), "Header sets Api-Key"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(Config{Upstreams: []Upstream{c.up}})
			if c.want == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
			assert.NotContains(t, err.Error(), azureKey)
		})
	}
}

// TestModelNamesAreTheRoutersOwn: changing the caller's map or
// AzureConfig after New changes nothing.
func TestModelNamesAreTheRoutersOwn(t *testing.T) {
	names := map[string]string{"gpt-4.1": "dep"}
	azc := &AzureConfig{APIVersion: azureVersion}
	az := newFakeServerT(t, relaytest.WithAzure(azureVersion, "dep"))
	r, _ := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "az", BaseURL: az.AzureURL, Azure: azc, ModelNames: names}}})
	names["gpt-4.1"], azc.APIVersion = "other", "2099-01-01"
	resp, _, err := send(t, r, chatBody("gpt-4.1", "x"))
	require.NoError(t, err)
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "dep", az.Requests()[0].Deployment)
}

// sentNames returns the model each candidate of d would be sent.
func sentNames(d Decision) []string {
	var out []string
	for _, c := range d.Candidates {
		out = append(out, c.UpstreamModel)
	}
	return out
}
