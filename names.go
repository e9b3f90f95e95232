package relay

import (
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
)

// One model, many names: the model callers ask for, policies route to and
// prices, budgets and context windows are kept for (the logical name) is
// sent to each upstream under the name it expects (Upstream.ModelNames):
// "gpt-4.1" at OpenAI, "openai/gpt-4.1" at OpenRouter, a deployment on
// Azure. Only the outgoing request (body, and on Azure the path) and
// Report.UpstreamModel carry the upstream's name.

// AzureConfig makes an Upstream speak the Azure OpenAI deployment API
// (the "classic" data plane): a call for a model goes to
// BaseURL/openai/deployments/{deployment}/{endpoint}?api-version=APIVersion,
// where the deployment is the model's name on the upstream
// (Upstream.ModelNames, or the model itself), and the upstream's APIKey
// goes in the Api-Key header. Chat completions, completions and
// embeddings go to their deployment; Responses goes to
// BaseURL/openai/responses (the deployment is the body's model), and any
// other path to BaseURL/openai/{path}, both with the api-version.
//
// Azure's v1 API (BaseURL https://NAME.openai.azure.com/openai/v1) is
// OpenAI-compatible: it needs no AzureConfig, only ModelNames mapping the
// models to their deployments.
type AzureConfig struct {
	// APIVersion is the api-version query parameter of every call, e.g.
	// "2024-10-21". Required: letters, digits, '.', '-' and '_'.
	APIVersion string
}

// deploymentEndpoint reports whether an endpoint's calls go to a
// deployment's path on an Azure upstream.
func deploymentEndpoint(ep string) bool {
	return ep == EndpointChat || ep == EndpointCompletions || ep == EndpointEmbeddings
}

// sentName is the name up expects for model: its ModelNames entry, or
// the model itself.
func (u *upstreamSettings) sentName(model string) string {
	if n, ok := u.names[model]; ok {
		return n
	}
	return model
}

// canName reports whether up can be sent model: on an Azure upstream, the
// model's name there must be a deployment name a path can carry.
func (u *upstreamSettings) canName(model string) bool {
	return u.azure == "" || model == "" || deploymentName(u.sentName(model))
}

// deploymentName reports whether s can be an Azure deployment in a URL
// path as it is: letters, digits, '.', '-' and '_', and not "." or ".."
// (no '/', no '%', no control character, nothing to escape).
func deploymentName(s string) bool {
	return s != "" && s != "." && s != ".." && !strings.ContainsFunc(s, func(r rune) bool {
		return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '.' || r == '-' || r == '_')
	})
}

// apiVersionText reports whether v is a plausible api-version: letters,
// digits, '.', '-' and '_' (e.g. "2024-10-21", "2025-04-01-preview").
func apiVersionText(v string) bool {
	return deploymentName(v)
}

// nameProblems checks an upstream's ModelNames and Azure settings for
// New, naming each problem.
func nameProblems(c Upstream) []string {
	var errs []string
	for _, m := range slices.Sorted(maps.Keys(c.ModelNames)) {
		n := c.ModelNames[m]
		switch {
		case m == "" || hasCtl(m):
			errs = append(errs, fmt.Sprintf("ModelNames key %q must be a model name without control characters", m))
		case n == "" || hasCtl(n):
			errs = append(errs, fmt.Sprintf("ModelNames[%q] %q must be a name without control characters", m, n))
		case len(c.Models) > 0 && !slices.Contains(c.Models, m):
			errs = append(errs, fmt.Sprintf("ModelNames maps %q, which is not in Models: the upstream never serves it (list the callers' names in Models)", m))
		case c.Azure != nil && !deploymentName(n):
			errs = append(errs, fmt.Sprintf("ModelNames[%q] %q is not an Azure deployment name (letters, digits, '.', '-', '_')", m, n))
		}
	}
	if c.Azure != nil {
		errs = append(errs, azureProblems(c)...)
	}
	return errs
}

// resolveNames sets the names and Azure settings of u from c, checked,
// and makes c's map and AzureConfig the router's own.
func resolveNames(c *Upstream, u *upstreamSettings) {
	u.authHeader = "Authorization"
	if len(c.ModelNames) > 0 {
		c.ModelNames = maps.Clone(c.ModelNames)
		u.names = c.ModelNames
	}
	if c.Azure != nil {
		az := *c.Azure
		c.Azure = &az
		u.azure, u.authHeader = az.APIVersion, "Api-Key"
	}
}

// azureProblems lists what keeps an Azure upstream from making its URLs:
// the api-version, models that cannot name a deployment, and a BaseURL
// that is not the resource endpoint.
func azureProblems(c Upstream) []string {
	var errs []string
	if v := c.Azure.APIVersion; !apiVersionText(v) {
		errs = append(errs, fmt.Sprintf("Azure.APIVersion %q must be set, of letters, digits, '.', '-' and '_' (e.g. \"2024-10-21\")", v))
	}
	for _, m := range c.Models {
		if _, mapped := c.ModelNames[m]; !mapped && !deploymentName(m) {
			errs = append(errs, fmt.Sprintf("Models has %q, which is not an Azure deployment name (letters, digits, '.', '-', '_'): map it in ModelNames", m))
		}
	}
	if base, err := url.Parse(c.BaseURL); err == nil {
		if base.Query().Has("api-version") {
			errs = append(errs, "BaseURL has an api-version: give it in Azure.APIVersion")
		}
		if p := strings.TrimSuffix(base.Path, "/"); strings.HasSuffix(p, "/openai") || strings.Contains(p+"/", "/openai/deployments/") || strings.Contains(p+"/", "/openai/v1/") {
			errs = append(errs, fmt.Sprintf("BaseURL %q must be the resource endpoint (e.g. https://NAME.openai.azure.com): the router appends /openai/deployments/{deployment}/… (for the v1 API, give BaseURL …/openai/v1 without Azure)", redactURL(c.BaseURL)))
		}
	}
	if c.APIKey != "" && slices.ContainsFunc(slices.Collect(maps.Keys(c.Header)), func(k string) bool { return strings.EqualFold(k, "Api-Key") }) {
		errs = append(errs, "Header sets Api-Key, which APIKey sets on an Azure upstream: give the key once")
	}
	return errs
}
