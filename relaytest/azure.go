package relaytest

import (
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// azureConfig is what WithAzure set.
type azureConfig struct {
	apiVersion  string
	deployments []string // nil: any
}

// WithAzure makes the Server answer the Azure OpenAI API as well, under
// its root (Server.AzureURL, the "resource endpoint"):
//
//   - the deployment API: POST /openai/deployments/{deployment}/chat/completions,
//     …/completions and …/embeddings, POST /openai/responses, GET
//     /openai/models and /openai/models/{id}, each with
//     ?api-version=apiVersion. A call without that api-version is answered
//     404 {"error":{"code":"404","message":"Resource not found"}}, as Azure
//     answers it. A deployment call is recorded with the deployment in
//     Recorded.Deployment and as its Model (Azure ignores the body's
//     model); with deployments given, a call to another deployment is
//     answered 404 DeploymentNotFound.
//   - the v1 API: /openai/v1/{endpoint}, as /v1/{endpoint}, without an
//     api-version.
//
// Answers have the OpenAI API's shapes.
func WithAzure(apiVersion string, deployments ...string) Option {
	return func(c *config) {
		c.azure = &azureConfig{apiVersion: apiVersion, deployments: slices.Clone(deployments)}
	}
}

// WithAPIKey makes the Server refuse, with 401, a call that does not carry
// key as the API wants it: "Authorization: Bearer key" on the OpenAI
// paths (/v1/...), "Api-Key: key" on the Azure deployment API, either on
// Azure's v1 API. A refused call is recorded but takes no fault.
func WithAPIKey(key string) Option { return func(c *config) { c.apiKey = key } }

// azureCall is what an Azure path names.
type azureCall struct {
	ep         string // the endpoint, as Recorded.Endpoint names it; "" for none
	deployment string
	classic    bool // the deployment API (api-version, Api-Key), not v1
}

// azureOf reads an Azure path: ok is false when the path is not under
// /openai/.
func azureOf(method, path string) (c azureCall, ok bool) {
	rest, ok := strings.CutPrefix(path, "/openai/")
	if !ok {
		return c, false
	}
	if v1, isV1 := strings.CutPrefix(rest, "v1/"); isV1 {
		c.ep = endpointOf(method, apiRoot+v1)
		return c, true
	}
	c.classic = true
	if d, ep, found := strings.Cut(strings.TrimPrefix(rest, "deployments/"), "/"); strings.HasPrefix(rest, "deployments/") && found {
		switch ep {
		case epChat, epCompletions, epEmbeddings:
			if d != "" && method == http.MethodPost {
				c.ep, c.deployment = ep, d
			}
		}
		return c, true
	}
	switch e := endpointOf(method, apiRoot+rest); e {
	case epResponses, epModels, epModel:
		c.ep = e
	}
	return c, true
}

// refusal is an answer the Server gives instead of the call's fault.
type refusal struct {
	status int
	body   []byte
}

// azureError is the body of Azure's own errors.
func azureError(code, message string) []byte {
	b, _ := json.Marshal(map[string]map[string]string{"error": {"code": code, "message": message}})
	return b
}

// refuse reports the answer to a call the Server refuses before its
// fault: a wrong key, or an Azure call to a path, api-version or
// deployment the resource does not have; nil when it takes its fault.
func (s *Server) refuse(r *http.Request, az azureCall, isAzure bool) *refusal {
	if !isAzure {
		if key := s.cfg.apiKey; key != "" && r.Header.Get("Authorization") != "Bearer "+key {
			return &refusal{http.StatusUnauthorized, errorBody(http.StatusUnauthorized, "", r)}
		}
		return nil
	}
	if key := s.cfg.apiKey; key != "" {
		good := r.Header.Get("Api-Key") == key || (!az.classic && r.Header.Get("Authorization") == "Bearer "+key)
		if !good {
			return &refusal{http.StatusUnauthorized, azureError("401", "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key for an active subscription and use a correct regional API endpoint for your resource.")}
		}
	}
	if !az.classic {
		return nil
	}
	q, _ := url.ParseQuery(r.URL.RawQuery)
	if az.ep == "" || q.Get("api-version") != s.cfg.azure.apiVersion {
		return &refusal{http.StatusNotFound, azureError("404", "Resource not found")}
	}
	if d := az.deployment; d != "" && s.cfg.azure.deployments != nil && !slices.Contains(s.cfg.azure.deployments, d) {
		return &refusal{http.StatusNotFound, azureError("DeploymentNotFound", "The API deployment for this resource does not exist. If you created the deployment within the last 5 minutes, please wait a moment and try again.")}
	}
	return nil
}

// refused records a call the Server refuses, without taking a fault, and
// answers it.
func (s *Server) refused(w http.ResponseWriter, rec Recorded, no *refusal) {
	s.mu.Lock()
	s.recs = append(s.recs, rec)
	s.mu.Unlock()
	h := w.Header()
	h.Set("X-Request-Id", "req_relaytest_"+itoa(s.seq.Add(1)))
	if s.cfg.name != "" {
		h.Set(NameHeader, s.cfg.name)
	}
	h.Set("Content-Type", "application/json")
	w.WriteHeader(no.status)
	w.Write(no.body)
}
