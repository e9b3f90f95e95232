package relay

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// The bodies of error answers the router looks into (a final 400 for
// context_length_exceeded, a retried answer kept in case it is returned)
// reach the caller byte for byte, and nothing on the caller's path waits
// for them.

// errorBodyOf returns an OpenAI-shaped error body of about n bytes.
func errorBodyOf(n int, code string) []byte {
	var b bytes.Buffer
	b.WriteString(`{"error":{"code":"` + code + `","message":"`)
	for b.Len() < n-4 {
		b.WriteString("the request was refused; ")
	}
	b.WriteString(`"}}`)
	return b.Bytes()
}

// stallingUpstream answers every call with status, the first part of body,
// then waits for release (or the client to go) before it sends the rest.
func stallingUpstream(t *testing.T, status int, body []byte, split int) (url string, release func()) {
	ch := make(chan struct{})
	var once bool
	url = newHandlerServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		w.Write(body[:split])
		w.(http.Flusher).Flush()
		select {
		case <-ch:
		case <-r.Context().Done():
			return
		}
		w.Write(body[split:])
	}))
	return url, func() {
		if !once {
			once = true
			close(ch)
		}
	}
}

// roundTripBounded runs RoundTrip on its own goroutine and fails the test
// if it has not returned within the test's bound: a RoundTrip that waits
// for a body the upstream holds back would wait until released.
func roundTripBounded(t *testing.T, r http.RoundTripper, body string) *http.Response {
	t.Helper()
	type result struct {
		resp *http.Response
		err  error
	}
	done := make(chan result, 1)
	go func() {
		req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(body))
		resp, err := r.RoundTrip(req)
		done <- result{resp, err}
	}()
	select {
	case res := <-done:
		require.NoError(t, res.err)
		return res.resp
	case <-time.After(time.Minute):
		t.Fatal("RoundTrip waits for a body the upstream holds back")
		return nil
	}
}

// TestFinal400BodyIntact: a final 400 larger than what the router looks at
// for context_length_exceeded reaches the caller whole, like any other
// status's body.
func TestFinal400BodyIntact(t *testing.T) {
	for _, code := range []string{"invalid_request_error", "context_length_exceeded"} {
		for _, status := range []int{400, 401} {
			body := errorBodyOf(102_472, code)
			up := newRecorder(t, status, body)
			r, reps := newTestRouter(t, Config{Clock: newAutoClock(), Retry: RetryConfig{MaxAttempts: 3},
				Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}}})
			resp, got, err := send(t, r, chatBody("gpt-4.1", "x"))
			require.NoError(t, err)
			assert.Equal(t, status, resp.StatusCode)
			assert.Equal(t, len(body), len(got), "%d %s: the body is cut", status, code)
			assert.True(t, bytes.Equal(body, got), "%d %s: the body changed", status, code)
			require.Len(t, reps.all(), 1)
			assert.Equal(t, status, reps.all()[0].StatusCode)
		}
	}
}

// TestFinal400StalledBodyDoesNotHoldRoundTrip: a 400 whose body stalls
// after its first bytes is returned without waiting for the rest, and the
// caller then reads the whole body once the upstream sends it.
func TestFinal400StalledBodyDoesNotHoldRoundTrip(t *testing.T) {
	for _, body := range [][]byte{
		[]byte(`{"error":{"message":"This model's maximum context length is 128000 tokens","code":"context_length_exceeded"}}`),
		errorBodyOf(100<<10, "invalid_request_error"),
	} {
		url, release := stallingUpstream(t, 400, body, 20)
		r, reps := newTestRouter(t, Config{Clock: newAutoClock(), Retry: RetryConfig{MaxAttempts: 3},
			ContextFallbacks: []string{"gpt-4.1"},
			Upstreams:        []Upstream{{Name: "a", BaseURL: url}}})
		resp := roundTripBounded(t, r, chatBody("gpt-4o", "x"))
		assert.Equal(t, 400, resp.StatusCode)
		release()
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err, "the body was cut")
		assert.Equal(t, string(body), string(got))
		require.Len(t, reps.all(), 1)
	}
}

// TestKeptBodyIntact: a retried answer, kept in case no later attempt
// gets one, is returned whole: past the bytes read ahead (1 MiB), and when
// its body stalls, the caller reads on as the upstream sends it.
func TestKeptBodyIntact(t *testing.T) {
	t.Run("large", func(t *testing.T) {
		body := errorBodyOf(3<<20, "server_error")
		busy := newRecorder(t, 503, body)
		r, reps := newTestRouter(t, Config{Clock: newAutoClock(), Retry: RetryConfig{MaxAttempts: 2}, Upstreams: []Upstream{{Name: "busy", BaseURL: busy.URL}, {Name: "dead", BaseURL: "http://127.0.0.1:1"}}})
		resp, got, err := send(t, r, chatBody("gpt-4.1", "x"))
		require.NoError(t, err)
		assert.Equal(t, 503, resp.StatusCode)
		assert.Equal(t, len(body), len(got), "the body is cut")
		assert.True(t, bytes.Equal(body, got))
		require.Len(t, reps.all(), 1)
		assert.Equal(t, "busy", reps.all()[0].Upstream)
	})
	t.Run("stalled", func(t *testing.T) {
		body := errorBodyOf(2000, "server_error")
		url, release := stallingUpstream(t, 503, body, 30)
		r, reps := newTestRouter(t, Config{Clock: newAutoClock(), Retry: RetryConfig{MaxAttempts: 2}, Upstreams: []Upstream{{Name: "busy", BaseURL: url}, {Name: "dead", BaseURL: "http://127.0.0.1:1"}}})
		resp := roundTripBounded(t, r, chatBody("gpt-4.1", "x"))
		assert.Equal(t, 503, resp.StatusCode)
		head := make([]byte, 30)
		_, err := io.ReadFull(resp.Body, head)
		require.NoError(t, err, "the bytes that came are read at once")
		release()
		rest, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err, "the body was cut")
		assert.Equal(t, string(body), string(head)+string(rest))
		require.Len(t, reps.all(), 1)
	})
}

// TestAheadBody: the read ahead hands every byte on, past its bound too;
// await ends with the request's context even while the body stalls; Close
// ends a Read waiting for the upstream, and the read ahead with it.
func TestAheadBody(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	pr, pw := io.Pipe()
	var done atomic.Int32
	b := readAhead(pr, 8, func() { done.Add(1) })
	go pw.Write([]byte("0123456789abcdef"))

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b.await(ctx, time.Hour, func(head []byte) bool { return false }) // returns: the context ended
	assert.True(t, b.await(context.Background(), time.Hour, func(head []byte) bool {
		return string(head) == "01234567" // the bound: 8 bytes
	}))
	got := make([]byte, 16)
	_, err := io.ReadFull(b, got)
	require.NoError(t, err)
	assert.Equal(t, "0123456789abcdef", string(got), "past the bound, from the upstream")

	waiting := make(chan error, 1)
	go func() {
		_, err := b.Read(got)
		waiting <- err
	}()
	b.Close()
	assert.Error(t, <-waiting, "Close ends a waiting Read")
	assert.EqualValues(t, 1, done.Load(), "onDone ran once, at Close")
	goleak.VerifyNone(t, ignore)

	// A body read to its end: onDone runs then, and Read hands out the rest.
	b = readAhead(io.NopCloser(strings.NewReader("short")), 8, func() { done.Add(1) })
	assert.True(t, b.await(context.Background(), time.Hour, func(head []byte) bool { return string(head) == "short" }))
	assert.EqualValues(t, 2, done.Load())
	all, err := io.ReadAll(b)
	require.NoError(t, err)
	assert.Equal(t, "short", string(all))
	b.Close()
	assert.EqualValues(t, 2, done.Load())
	goleak.VerifyNone(t, ignore)
}
