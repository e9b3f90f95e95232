package relaytest

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newServer starts a Server closed at the end of the test.
func newServer(t *testing.T, opts ...Option) *Server {
	t.Helper()
	s := NewServer(opts...)
	t.Cleanup(s.Close)
	return s
}

// post sends body to the server's endpoint and returns the response with its
// body read.
func post(t *testing.T, s *Server, endpoint, body string) (*http.Response, []byte) {
	t.Helper()
	resp, err := s.Client().Post(s.URL+endpoint, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, b
}

// openStream posts body and returns the response, whose body the caller
// reads and closes; cancel ends the call.
func openStream(t *testing.T, s *Server, endpoint, body string) (*http.Response, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+endpoint, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.Client().Do(req)
	if err != nil {
		cancel()
		require.NoError(t, err)
	}
	t.Cleanup(func() { cancel(); resp.Body.Close() })
	return resp, cancel
}

// event is one server-sent event.
type event struct {
	Name string
	Data string
}

// sseReader reads server-sent events one at a time.
type sseReader struct{ r *bufio.Reader }

func newSSEReader(r io.Reader) *sseReader { return &sseReader{bufio.NewReader(r)} }

// next returns the next event; io.EOF at a clean end of the body.
func (s *sseReader) next() (event, error) {
	var ev event
	seen := false
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			if err == io.EOF && (seen || line != "") {
				return ev, io.ErrUnexpectedEOF
			}
			return ev, err
		}
		line = strings.TrimRight(line, "\r\n")
		switch {
		case line == "":
			if seen {
				return ev, nil
			}
		case strings.HasPrefix(line, "event: "):
			ev.Name, seen = strings.TrimPrefix(line, "event: "), true
		case strings.HasPrefix(line, "data: "):
			ev.Data, seen = strings.TrimPrefix(line, "data: "), true
		default:
			return ev, io.ErrUnexpectedEOF
		}
	}
}

// readAll reads events until the end of the body; err is nil at a clean end.
func (s *sseReader) readAll() ([]event, error) {
	var out []event
	for {
		ev, err := s.next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, ev)
	}
}
