package relay

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// BenchmarkStreamHoldTTFB measures what holding a stream until its first
// content (Stream.FailoverWindow, on by default) costs the caller in time
// to first byte, against the same stream handed over at its headers, on a
// loopback upstream that flushes the role chunk and then each content
// chunk, as OpenAI's API does. The two routers take turns, request by
// request, so that the host's drift falls on both; the metrics are the
// mean time from RoundTrip to the caller's first byte (ttfb) and to its
// first content byte (ttfc) of each, and their ratios, held over not held.
func BenchmarkStreamHoldTTFB(b *testing.B) {
	chunks := []string{
		`{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"finish_reason":null}]}`,
		`{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}]}`,
		`{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" there"},"finish_reason":null}]}`,
		`{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
		`{"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":8,"completion_tokens":2,"total_tokens":10}}`,
		`[DONE]`,
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for _, c := range chunks {
			io.WriteString(w, "data: "+c+"\n\n")
			f.Flush()
		}
	}))
	defer up.Close()
	tr := &http.Transport{MaxIdleConnsPerHost: 4}
	defer tr.CloseIdleConnections()
	routers := [2]*Router{}
	for i, window := range []time.Duration{0, -1} { // held (the default), not held
		r, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL + "/v1"}}, Base: tr,
			Stream: StreamConfig{FailoverWindow: window}})
		if err != nil {
			b.Fatal(err)
		}
		routers[i] = r
	}
	body := chatStreamUsageReq
	buf := make([]byte, 32<<10)
	var ttfb, ttfc [2]time.Duration
	one := func(r *Router) (first, content time.Duration) {
		req, _ := http.NewRequest("POST", "http://relay.invalid/v1/chat/completions", strings.NewReader(body))
		start := time.Now()
		resp, err := r.RoundTrip(req)
		if err != nil {
			b.Fatal(err)
		}
		var seen []byte
		for content == 0 {
			n, err := resp.Body.Read(buf)
			if n > 0 && first == 0 {
				first = time.Since(start)
			}
			seen = append(seen, buf[:n]...)
			if bytes.Contains(seen, []byte(`"content":"Hello"`)) {
				content = time.Since(start)
			}
			if err != nil && content == 0 {
				b.Fatalf("no content: %v: %q", err, seen)
			}
		}
		io.CopyBuffer(io.Discard, resp.Body, buf)
		resp.Body.Close()
		return first, content
	}
	one(routers[0]) // warm the connections
	one(routers[1])
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		k := i % 2
		f, c := one(routers[k])
		ttfb[k] += f
		ttfc[k] += c
	}
	n := float64(b.N) / 2
	b.ReportMetric(float64(ttfb[0])/n, "held-ttfb-ns")
	b.ReportMetric(float64(ttfb[1])/n, "direct-ttfb-ns")
	b.ReportMetric(float64(ttfb[0])/float64(ttfb[1]), "ttfb-ratio")
	b.ReportMetric(float64(ttfc[0])/float64(ttfc[1]), "ttfc-ratio")
}
