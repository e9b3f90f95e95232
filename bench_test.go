package relay

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tokenrelay/relay/internal/corpus"
	"github.com/tokenrelay/relay/internal/tokens"
)

// BenchmarkRoundTrip measures the router's overhead over a bare
// http.Transport: the same 4 KB chat request against the same loopback
// upstream (an httptest server answering a fixed 600-byte chat completion),
// sent by the bare transport, by the router with a warm token memo (the
// same prompt every time), and by the router with a cold memo (a prompt
// never seen before on every request). Compare ns/op and allocs/op of the
// sub-benchmarks of one run; their difference is the router's cost.
func BenchmarkRoundTrip(b *testing.B) {
	answer := fixture(b, "chat_response_default.json")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Write(answer)
	}))
	defer srv.Close()
	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	defer tr.CloseIdleConnections()

	prompt := benchPrompt(4 << 10)
	body := chatBody("gpt-4.1", prompt)
	send := func(b *testing.B, rt http.RoundTripper, url string, body func(i int) string) {
		b.ReportAllocs()
		b.SetBytes(int64(len(body(0))))
		for i := 0; b.Loop(); i++ {
			req, _ := http.NewRequest("POST", url, strings.NewReader(body(i)))
			resp, err := rt.RoundTrip(req)
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	b.Run("bare", func(b *testing.B) {
		send(b, tr, srv.URL+"/v1/chat/completions", func(int) string { return body })
	})
	var reports atomic.Int64
	r, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: srv.URL + "/v1", APIKey: "sk-bench"}}, Base: tr,
		OnReport: func(Report) { reports.Add(1) }})
	if err != nil {
		b.Fatal(err)
	}
	tokens.O200K.Count("load the encodings before timing")
	b.Run("router-warm", func(b *testing.B) {
		send(b, r, "http://relay/v1/chat/completions", func(int) string { return body })
	})
	b.Run("router-cold", func(b *testing.B) {
		send(b, r, "http://relay/v1/chat/completions", func(i int) string {
			return chatBody("gpt-4.1", fmt.Sprintf("%09d ", i)+prompt[10:])
		})
	})
	// The router alone: the same request through a Base that answers from
	// memory, so the figure is the router's own cost without loopback noise.
	mem, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://mem/v1", APIKey: "sk-bench"}},
		Base: roundTripFunc(func(req *http.Request) (*http.Response, error) {
			io.Copy(io.Discard, req.Body)
			return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
				Body: io.NopCloser(bytes.NewReader(answer)), ContentLength: int64(len(answer)), Request: req}, nil
		}),
		OnReport: func(Report) { reports.Add(1) }})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("router-in-memory-warm", func(b *testing.B) {
		send(b, mem, "http://relay/v1/chat/completions", func(int) string { return body })
	})
	if reports.Load() == 0 {
		b.Fatal("no reports")
	}
}

// BenchmarkCount measures prompt-token counting of the router (classify and
// count, memo off, no affinity key: StrategyPriority) on prose-and-code
// prompts of 1 KB, 16 KB and 128 KB, and on the pathological 1 MiB run of one
// letter.
func BenchmarkCount(b *testing.B) {
	r, err := New(Config{Upstreams: []Upstream{{Name: "a", BaseURL: "http://127.0.0.1:1"}}, MemoEntries: -1, Strategy: StrategyPriority})
	if err != nil {
		b.Fatal(err)
	}
	tokens.O200K.Count("load the encodings before timing")
	cases := []struct {
		name string
		text string
	}{
		{"1KB", benchPrompt(1 << 10)},
		{"16KB", benchPrompt(16 << 10)},
		{"128KB", benchPrompt(128 << 10)},
		{"1MiB-one-letter", strings.Repeat("a", 1<<20)},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			body := []byte(chatBody("gpt-4.1", c.text))
			b.SetBytes(int64(len(c.text)))
			b.ReportAllocs()
			for b.Loop() {
				if q := r.classify("POST", "/v1/chat/completions", nil, body); q.req.PromptTokens == 0 {
					b.Fatal("zero tokens")
				}
			}
		})
	}
}

// benchPrompt returns n bytes of mixed prose, code and numbers that need no
// JSON escaping.
func benchPrompt(n int) string { return corpus.Prompt(n) }

// overheadBody is the request of the overhead benchmarks (module interop):
// corpus.Chat, its body as b.
type overheadBody struct {
	*corpus.Chat
	b []byte
}

func newOverheadBody(testing.TB) *overheadBody {
	c := corpus.NewChat()
	return &overheadBody{c, c.B}
}

func (ob *overheadBody) renew(n uint64) { ob.Renew(n) }

// overheadRouter is the router of the overhead benchmarks (module interop)
// over base: two upstreams, the defaults (affinity, retries, breakers), and
// RPM/TPM limits that never limit.
func overheadRouter(tb testing.TB, base http.RoundTripper, reports *atomic.Int64) *Router {
	r, err := New(Config{
		Upstreams: []Upstream{
			{Name: "a", BaseURL: "http://a.mem/v1", APIKey: "sk-bench", RPM: 1 << 40, TPM: 1 << 50},
			{Name: "b", BaseURL: "http://b.mem/v1", APIKey: "sk-bench", RPM: 1 << 40, TPM: 1 << 50},
		},
		Base:     base,
		OnReport: func(Report) { reports.Add(1) },
	})
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

// BenchmarkAcquire measures what the router adds per request before it
// sends: candidate ordering, the breaker's permission and outcome, and the
// RPM/TPM buckets with in-flight slots, over 8 upstreams in steady state
// (nothing open, nothing limited). "parallel16" runs it from 16 goroutines
// to show that no lock serialises all upstreams.
func BenchmarkAcquire(b *testing.B) {
	ups := make([]Upstream, 8)
	for i := range ups {
		ups[i] = Upstream{Name: fmt.Sprintf("u%d", i), BaseURL: "http://127.0.0.1:1", RPM: 1 << 40, TPM: 1 << 50, MaxInFlight: 1 << 20} // limits a long run does not exhaust
	}
	r, err := New(Config{Upstreams: ups})
	if err != nil {
		b.Fatal(err)
	}
	resp := &http.Response{StatusCode: 200, Header: http.Header{}}
	one := func(t *trip, start int) {
		cands := r.plan(t.cbuf[:0], "gpt-4.1", nil, uint64(start), true, nil)
		i, _, err := r.acquire(context.Background(), cands, start, r.admissionOf(&t.c))
		if err != nil {
			b.Fatal(err)
		}
		a := attempt{cand: cands[i], resp: resp, held: true}
		t.observe(&a, r.s.clock.Now())
		a.release()
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		t := &trip{r: r}
		t.c.req.PromptTokens = 100
		for b.Loop() {
			one(t, 0)
		}
	})
	// Each goroutine starts at its own upstream, as requests with different
	// affinity keys do; locks are per upstream, so they do not queue on one.
	var gid atomic.Int64
	b.Run("parallel16", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(8)
		b.RunParallel(func(pb *testing.PB) {
			t := &trip{r: r}
			t.c.req.PromptTokens = 100
			start := int(gid.Add(1)) % len(ups)
			for pb.Next() {
				one(t, start)
			}
		})
	})
}
