package relay

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// benchStream builds a recorded-style chat stream of n content chunks
// (gpt-4o's chunk shape, as in the openai-wire fixtures), with or without the
// usage chunk.
func benchStream(n int, usage bool) []byte {
	var b bytes.Buffer
	const head = `data: {"id":"chatcmpl-ABfw031mOJeYCSHe4yI2ZjOA6kMJL","object":"chat.completion.chunk","created":1727346168,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_5050236cbd","choices":[{"index":0,"delta":{`
	const tail = `},"logprobs":null,"finish_reason":null}]}` + "\n\n"
	b.WriteString(head + `"role":"assistant","content":"","refusal":null` + tail)
	words := strings.Fields("I'm unable to provide real-time information, but you can check a reliable weather website or app for the latest updates on the \"current\" conditions.")
	for i := 0; i < n-2; i++ {
		fmt.Fprintf(&b, "%s\"content\":%q%s", head, " "+words[i%len(words)], tail)
	}
	b.WriteString(`data: {"id":"chatcmpl-ABfw031mOJeYCSHe4yI2ZjOA6kMJL","object":"chat.completion.chunk","created":1727346168,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_5050236cbd","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}` + "\n\n")
	if usage {
		b.WriteString(`data: {"id":"chatcmpl-ABfw031mOJeYCSHe4yI2ZjOA6kMJL","object":"chat.completion.chunk","created":1727346168,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_5050236cbd","choices":[],"usage":{"prompt_tokens":14,"completion_tokens":498,"total_tokens":512,"completion_tokens_details":{"reasoning_tokens":0}}}` + "\n\n")
	}
	b.WriteString("data: [DONE]\n\n")
	return b.Bytes()
}

// BenchmarkStream compares a 500-chunk chat stream read through the stream
// wrapper (the whole RoundTrip included) with a plain io.Copy of the same
// bytes, in the same run. Each wrapper case reports allocs/event.
//
//	go test -run '^$' -bench BenchmarkStream -benchmem
func BenchmarkStream(b *testing.B) {
	const events = 500
	withUsage := benchStream(events, true)
	buf := make([]byte, 32<<10)
	b.Run("io.Copy", func(b *testing.B) {
		b.SetBytes(int64(len(withUsage)))
		b.ReportAllocs()
		for b.Loop() {
			io.CopyBuffer(io.Discard, onlyReader{bytes.NewReader(withUsage)}, buf)
		}
	})
	cases := []struct {
		name, req string
	}{
		// The caller asked for usage: straight through.
		{"wrapper", chatStreamUsageReq},
		// The router asked for usage: the usage chunk is removed.
		{"wrapper-injected", chatStreamReq},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			// (a body of its own each time: the router may still read the
			// last one's end after the stream, see streamBody.drain)
			r, reps := bodyRouter(b, Config{}, func() io.Reader { return onlyReader{bytes.NewReader(withUsage)} })
			reps.list = make([]Report, 0, 1)
			reqBody := strings.NewReader(c.req)
			b.SetBytes(int64(len(withUsage)))
			b.ReportAllocs()
			var allocs float64
			for b.Loop() {
				reqBody.Reset(c.req)
				req, _ := http.NewRequest("POST", "http://relay.invalid/v1/chat/completions", io.NopCloser(reqBody))
				resp, err := r.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.CopyBuffer(io.Discard, onlyReader{resp.Body}, buf); err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
				reps.list = reps.list[:0]
			}
			_ = allocs
		})
	}
	// The wrapper alone, without the RoundTrip around it: allocations per
	// event of the stream handling itself.
	b.Run("body-only", func(b *testing.B) {
		r, _ := bodyRouter(b, Config{}, func() io.Reader { return nil })
		b.SetBytes(int64(len(withUsage)))
		b.ReportAllocs()
		req := httptest.NewRequest("POST", "/v1/chat/completions", nil)
		for b.Loop() {
			body := bytes.NewReader(withUsage)
			t := newTrip(r, req)
			t.c.req.Endpoint = EndpointChat
			t.c.req.Stream = true
			a := &attempt{cand: candidate{up: r.ups[0]}, resp: &http.Response{Body: io.NopCloser(body)}}
			s := newStreamBody(t, a)
			if _, err := io.CopyBuffer(io.Discard, onlyReader{s}, buf); err != nil {
				b.Fatal(err)
			}
			s.Close()
		}
	})
}

// onlyReader hides WriterTo/ReaderFrom so io.Copy goes through Read.
type onlyReader struct{ io.Reader }

// TestStreamAllocsPerEvent holds the wrapper to at most one allocation per
// event on average.
func TestStreamAllocsPerEvent(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation count")
	}
	const events = 500
	data := benchStream(events, true)
	for _, req := range []string{chatStreamUsageReq, chatStreamReq} {
		r, reps := bodyRouter(t, Config{}, func() io.Reader { return onlyReader{bytes.NewReader(data)} })
		buf := make([]byte, 32<<10)
		reqBody := strings.NewReader(req)
		allocs := testing.AllocsPerRun(20, func() {
			reqBody.Reset(req)
			hreq, _ := http.NewRequest("POST", "http://relay.invalid/v1/chat/completions", io.NopCloser(reqBody))
			resp, err := r.RoundTrip(hreq)
			if err != nil {
				t.Fatal(err)
			}
			io.CopyBuffer(io.Discard, onlyReader{resp.Body}, buf)
			resp.Body.Close()
			reps.mu.Lock()
			reps.list = reps.list[:0]
			reps.mu.Unlock()
		})
		if per := allocs / events; per > 1 {
			t.Errorf("%s: %.2f allocations per event (%.0f per stream)", req, per, allocs)
		} else {
			t.Logf("%.3f allocations per event (%.0f per stream, RoundTrip included)", per, allocs)
		}
	}
}
