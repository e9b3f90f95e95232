package relay

import (
	"errors"
	"net/http"
	"net/url"
	"path"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tenantRouter is a router whose one upstream has a BaseURL with a path
// and an API key: the key must never go outside that path.
func tenantRouter(t *testing.T) (*Router, *recorder, *reports) {
	up := newRecorder(t, 200, []byte(`{}`))
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL + "/tenant-a/openai/v1", APIKey: "sk-tenant-a-0123456789"}}})
	return r, up, reps
}

// A path with dot segments, in any spelling a server or a proxy in front
// of it could resolve, is refused before any upstream call: the key would
// go to the server's /admin.
func TestBadPathRefused(t *testing.T) {
	r, up, reps := tenantRouter(t)
	parsed := func(method, raw string) *http.Request {
		req, err := http.NewRequest(method, raw, nil)
		require.NoError(t, err)
		return req
	}
	built := func(u url.URL) *http.Request {
		u.Scheme, u.Host = "http", "relay"
		return &http.Request{Method: "GET", URL: &u, Header: http.Header{}, Host: "relay"}
	}
	cases := []struct {
		name string
		req  *http.Request
	}{
		{"dots", parsed("GET", "http://relay/v1/files/../../../../admin")},
		{"dots after v1", parsed("GET", "http://relay/v1/../../admin/secrets")},
		{"one dot", parsed("GET", "http://relay/v1/./files")},
		{"trailing dots", parsed("GET", "http://relay/v1/files/..")},
		{"encoded dots", parsed("GET", "http://relay/v1/%2e%2e/%2e%2e/admin")},
		{"encoded dots upper case", parsed("GET", "http://relay/v1/%2E%2E/%2E%2E/admin")},
		{"half encoded dots", parsed("GET", "http://relay/v1/.%2e/%2e./admin")},
		{"encoded slashes", parsed("GET", "http://relay/v1/..%2f..%2fadmin")},
		{"encoded slashes upper case", parsed("GET", "http://relay/v1/files/..%2F..%2F..%2Fadmin")},
		{"all encoded", parsed("GET", "http://relay/v1/%2E%2E%2F%2E%2E%2Fadmin")},
		{"encoded backslashes", parsed("GET", "http://relay/v1/files/..%5c..%5cadmin")},
		{"backslashes", parsed("GET", `http://relay/v1/files/..\..\admin`)},
		{"double encoded", parsed("GET", "http://relay/v1/files/%252e%252e/%252e%252e/admin")},
		{"double encoded slashes", parsed("GET", "http://relay/v1/files/..%252f..%252fadmin")},
		{"segment parameters", parsed("GET", "http://relay/v1/files/..;/..;/admin")},
		{"model endpoint", parsed("POST", "http://relay/v1/../../admin/chat/completions")},
		{"opaque", built(url.URL{Opaque: "/v1/../../admin"})},
		{"raw path", built(url.URL{Path: "/v1/models", RawPath: "/v1/%2e%2e/%2e%2e/admin"})},
		{"query with CR LF", built(url.URL{Path: "/v1/models", RawQuery: "a=1 HTTP/1.1\r\nHost: evil"})},
		{"query with fragment", built(url.URL{Path: "/v1/models", RawQuery: "a=1#/../../admin"})},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := len(reps.all())
			_, derr := r.Decide(c.req)
			assert.ErrorIs(t, derr, ErrBadPath, "Decide")
			resp, err := r.RoundTrip(c.req)
			require.Nil(t, resp)
			require.ErrorIs(t, err, ErrBadPath)
			assert.True(t, strings.HasPrefix(err.Error(), "relay: "), err.Error())
			var e *Error
			require.True(t, errors.As(err, &e))
			assert.Empty(t, up.got(), "no upstream call")
			require.Len(t, reps.all(), n+1, "one report")
			assert.ErrorIs(t, reps.all()[n].Err, ErrBadPath)
		})
	}
}

// Paths without dot segments go to the upstream, under its BaseURL, with
// its key: dots inside a name, an escaped slash kept as written, the
// query after the BaseURL's.
func TestGoodPathSent(t *testing.T) {
	r, up, _ := tenantRouter(t)
	cases := []struct{ method, in, path, query string }{
		{"GET", "http://relay/v1/models", "/tenant-a/openai/v1/models", ""},
		{"GET", "http://relay/v1/files/file-1/content", "/tenant-a/openai/v1/files/file-1/content", ""},
		{"GET", "http://relay/v1/files/a..b/.hidden/...", "/tenant-a/openai/v1/files/a..b/.hidden/...", ""},
		{"GET", "http://relay/v1/models/org%2Fname", "/tenant-a/openai/v1/models/org/name", ""},
		{"GET", "http://relay/v1/files?after=file-1&limit=2", "/tenant-a/openai/v1/files", "after=file-1&limit=2"},
		{"GET", "http://relay/v1//files", "/tenant-a/openai/v1/files", ""},
		{"POST", "http://relay/v1/chat/completions", "/tenant-a/openai/v1/chat/completions", ""},
	}
	for i, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			resp, _ := do(t, r, c.method, c.in, chatBody("gpt-4o", "hi"))
			assert.Equal(t, 200, resp.StatusCode)
			got := up.got()
			require.Len(t, got, i+1)
			assert.Equal(t, c.path, got[i].Path)
			assert.Equal(t, c.query, got[i].RawQuery)
			assert.Equal(t, "Bearer sk-tenant-a-0123456789", got[i].Header.Get("Authorization"))
		})
	}
}

// Appended to a BaseURL without a path, what the caller wrote after /v1/
// never starts with "//", which a server may read as another host.
func TestPathNeverStartsWithTwoSlashes(t *testing.T) {
	up := newRecorder(t, 200, []byte(`{}`))
	r, _ := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL, APIKey: "sk-root-0123456789"}}})
	for i, in := range []string{"http://relay/v1//evil.example/x", "http://relay//evil.example/x"} {
		do(t, r, "GET", in, "")
		got := up.got()
		require.Len(t, got, i+1)
		assert.Equal(t, "/evil.example/x", got[i].Path, in)
	}
}

// Breaker.ProbePath is a path under each BaseURL too: New refuses one
// that could leave it.
func TestProbePathMustStayUnderBaseURL(t *testing.T) {
	for _, p := range []string{"../admin", "/models/../../admin", "%2e%2e/admin", "/models?x=1 y", "/models\r\n"} {
		_, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}}, Breaker: BreakerConfig{ProbePath: p}})
		assert.ErrorContains(t, err, "Breaker.ProbePath", p)
	}
	_, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.test/v1"}}, Breaker: BreakerConfig{ProbePath: "/models?limit=1"}})
	assert.NoError(t, err)
}

// A path dotSegments passes stays under any base, however a server reads
// it: resolved as a URL path, with '\' as a separator, with segment
// parameters stripped, after each percent-decoding.
func FuzzDotSegments(f *testing.F) {
	for _, s := range []string{"a/b", "../x", "%2e%2e/x", "..%2fx", "%252e%252e/x", `..\x`, "..;/x", "a..b/.c", "%2", "%%32%65%2e/x", "."} {
		f.Add(s)
	}
	params := regexp.MustCompile(`;[^/]*`)
	f.Fuzz(func(t *testing.T, p string) {
		if dotSegments(p) {
			return
		}
		for d, i := p, 0; i <= maxDecodes; i++ {
			slashed := strings.ReplaceAll(d, `\`, "/")
			for _, form := range []string{d, slashed, params.ReplaceAllString(slashed, "")} {
				if got := path.Clean("/base/" + form); got != "/base" && !strings.HasPrefix(got, "/base/") {
					t.Fatalf("dotSegments(%q) = false, but %q resolves to %q", p, form, got)
				}
			}
			next := percentDecode(d)
			if next == d {
				return
			}
			d = next
		}
		t.Fatalf("dotSegments(%q) = false, but it decodes more than %d times", p, maxDecodes)
	})
}
