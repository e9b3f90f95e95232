package relayotel

import (
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay"
)

// TestAddress: server.address and server.port come from the base URL, the
// port from the scheme when the URL has none.
func TestAddress(t *testing.T) {
	for in, want := range map[string]address{
		"https://api.example.com/v1":     {"api.example.com", 443},
		"http://127.0.0.1:8080/v1":       {"127.0.0.1", 8080},
		"http://[::1]:9000/openai/v1":    {"::1", 9000},
		"http://gateway.internal/v1?x=1": {"gateway.internal", 80},
	} {
		got, ok := parseAddress(in)
		assert.True(t, ok, in)
		assert.Equal(t, want, got, in)
	}
	_, ok := parseAddress("not a url")
	assert.False(t, ok)
}

// TestFirstCarrier: the first carrier sets what headerCarrier sets, under
// the canonical keys; its traceparent slice has room for no append.
func TestFirstCarrier(t *testing.T) {
	h := http.Header{"Traceparent": {"from the caller"}}
	f := &firstCarrier{h: h}
	f.Set("traceparent", "00-a-b-01")
	f.Set("tracestate", "k=v")
	f.Set("x-other", "1")
	assert.Equal(t, http.Header{"Traceparent": {"00-a-b-01"}, "Tracestate": {"k=v"}, "X-Other": {"1"}}, h)
	assert.Equal(t, "00-a-b-01", f.Get("traceparent"))
	assert.ElementsMatch(t, []string{"Traceparent", "Tracestate", "X-Other"}, f.Keys())
	assert.Equal(t, 1, cap(h["Traceparent"]))

	f.Set("traceparent", "00-c-d-00") // set again: a slice of its own
	assert.Equal(t, []string{"00-c-d-00"}, h["Traceparent"])
	assert.Equal(t, "00-a-b-01", f.v[0], "what the first value's slice holds is not written again")
}

// TestEndpoints: a path's endpoint is found by its suffix, chat/completions
// before completions, a trailing slash ignored; a Report's endpoint name
// has the index of its suffix; anything else is otherEndpoint.
func TestEndpoints(t *testing.T) {
	for path, want := range map[string]int{
		"/v1/chat/completions":  chatEndpoint,
		"/v1/chat/completions/": chatEndpoint,
		"/openai/v1/responses":  responsesEndpoint,
		"/v1/completions":       completionsEndpoint,
		"/v1/embeddings":        embeddingsEndpoint,
		"/v1/models":            otherEndpoint,
		"/v1/xchat/completions": completionsEndpoint,
		"":                      otherEndpoint,
	} {
		assert.Equal(t, want, endpointOf(path), path)
	}
	for i, suffix := range endpointSuffixes {
		assert.Equal(t, i, endpointIndex(suffix[1:]), suffix)
		assert.Equal(t, i, endpointOf(suffix), suffix)
	}
	assert.Equal(t, otherEndpoint, endpointIndex(""))
	assert.Equal(t, otherEndpoint, endpointIndex("models"))
}

// TestLearnAddress: an upstream not given to WithUpstreams is learned from
// its first request and kept for its reports; a configured one keeps its
// configured address; past maxCached names, an address is still worked
// out for each request, but not kept. Learners may race.
func TestLearnAddress(t *testing.T) {
	o := New(WithUpstreams(relay.Upstream{Name: "conf", BaseURL: "https://conf.example/v1"}))
	u, err := url.Parse("http://learned.example:8080/v1/chat/completions")
	require.NoError(t, err)
	assert.Equal(t, address{"conf.example", 443}, first(o.learn("conf", u)), "configured: kept as configured")
	assert.Equal(t, address{}, o.addressOf("new"))
	var (
		wg   sync.WaitGroup
		kept [8]*upstream
	)
	for i := range kept {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var a address
			a, kept[i] = o.learn("new", u)
			assert.Equal(t, address{"learned.example", 8080}, a)
		}()
	}
	wg.Wait()
	for _, ups := range kept {
		assert.Same(t, kept[0], ups, "kept once")
	}
	assert.Equal(t, address{"learned.example", 8080}, o.addressOf("new"))
	assert.Equal(t, address{"learned.example", 8080}, first(o.learn("new", nil)), "known: no URL needed")

	for i := len(o.addrs); i < maxCached; i++ {
		o.learn("up"+strconv.Itoa(i), u)
	}
	require.Len(t, o.addrs, maxCached)
	a, ups := o.learn("past", u)
	assert.Equal(t, address{"learned.example", 8080}, a)
	assert.Nil(t, ups, "not kept")
	assert.Equal(t, address{}, o.addressOf("past"), "not kept")
	assert.Len(t, o.addrs, maxCached)
}

func first[A, B any](a A, _ B) A { return a }
