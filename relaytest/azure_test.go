package relaytest

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"
)

// TestAzurePaths: with WithAzure the server answers the Azure API's paths
// under its root, as Azure does: the deployment API with its api-version
// (404 "Resource not found" without it, DeploymentNotFound for a
// deployment it does not have) and the v1 API; the deployment is recorded
// as the request's model.
func TestAzurePaths(t *testing.T) {
	s := newServer(t, WithAzure("2024-10-21", "prod-41", "emb"), WithName("az"))
	cases := []struct {
		method, path, body string
		status             int
		endpoint, model    string
		code               string // Azure's error code, for a refusal
	}{
		{"POST", "/openai/deployments/prod-41/chat/completions?api-version=2024-10-21", chatHello, 200, epChat, "prod-41", ""},
		{"POST", "/openai/deployments/prod-41/completions?api-version=2024-10-21", `{"model":"x","prompt":"Hi"}`, 200, epCompletions, "prod-41", ""},
		{"POST", "/openai/deployments/emb/embeddings?api-version=2024-10-21", `{"input":"Hi"}`, 200, epEmbeddings, "emb", ""},
		{"POST", "/openai/responses?api-version=2024-10-21", `{"model":"prod-41","input":"Hi"}`, 200, epResponses, "prod-41", ""},
		{"GET", "/openai/models?api-version=2024-10-21", "", 200, epModels, "", ""},
		{"POST", "/openai/v1/chat/completions", chatHello, 200, epChat, "gpt-4o", ""},
		{"POST", "/openai/deployments/prod-41/chat/completions", chatHello, 404, epChat, "prod-41", "404"},
		{"POST", "/openai/deployments/prod-41/chat/completions?api-version=2025-01-01", chatHello, 404, epChat, "prod-41", "404"},
		{"POST", "/openai/deployments/other/chat/completions?api-version=2024-10-21", chatHello, 404, epChat, "other", "DeploymentNotFound"},
		{"POST", "/openai/deployments/prod-41/responses?api-version=2024-10-21", chatHello, 404, "", "gpt-4o", "404"},
		{"POST", "/openai/chat/completions?api-version=2024-10-21", chatHello, 404, "", "gpt-4o", "404"},
	}
	for _, c := range cases {
		t.Run(c.method+" "+c.path, func(t *testing.T) {
			s.Reset()
			req, _ := http.NewRequest(c.method, s.AzureURL+c.path, strings.NewReader(c.body))
			resp, err := s.Client().Do(req)
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Equal(t, c.status, resp.StatusCode, string(body))
			assert.Equal(t, "az", resp.Header.Get(NameHeader))
			require.Len(t, s.Requests(), 1)
			rec := s.Requests()[0]
			assert.Equal(t, c.endpoint, rec.Endpoint)
			assert.Equal(t, c.model, rec.Model)
			if c.code != "" {
				assert.Equal(t, c.code, gjson.GetBytes(body, "error.code").Str)
			}
		})
	}
}

// TestAPIKeyChecked: WithAPIKey answers 401 to a call without the key as
// its API wants it, records it, and keeps the scripted fault for the next
// call.
func TestAPIKeyChecked(t *testing.T) {
	s := newServer(t, WithAzure("v1"), WithAPIKey("k-123456"))
	s.Script(Fault{Status: 503})
	call := func(path, header, value string) int {
		req, _ := http.NewRequest("POST", s.AzureURL+path, strings.NewReader(chatHello))
		req.Header.Set(header, value)
		resp, err := s.Client().Do(req)
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	dep := "/openai/deployments/d/chat/completions?api-version=v1"
	assert.Equal(t, 401, call("/v1/chat/completions", "Authorization", "Bearer wrong"))
	assert.Equal(t, 401, call("/v1/chat/completions", "Api-Key", "k-123456"), "OpenAI paths take a bearer key")
	assert.Equal(t, 401, call(dep, "Authorization", "Bearer k-123456"), "the deployment API takes Api-Key")
	assert.Equal(t, 3, s.Calls(), "refused calls are recorded")
	assert.Equal(t, 1, s.Pending(), "refused calls take no fault")
	assert.Equal(t, 503, call(dep, "Api-Key", "k-123456"))
	assert.Equal(t, 200, call("/v1/chat/completions", "Authorization", "Bearer k-123456"))
	assert.Equal(t, 200, call("/openai/v1/chat/completions", "Authorization", "Bearer k-123456"))
	assert.Equal(t, 200, call("/openai/v1/chat/completions", "Api-Key", "k-123456"))
	assert.Equal(t, 7, s.Calls())
}
