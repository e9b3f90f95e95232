package relayotel_test

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relayotel"
	"github.com/tokenrelay/relay/relaytest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// harness is a Router observed by an Observer over an SDK MeterProvider
// (read by hand) and TracerProvider (spans recorded in memory).
type harness struct {
	reader *sdkmetric.ManualReader
	rec    *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	router *relay.Router

	mu      sync.Mutex
	reports []relay.Report
}

// meterProvider returns a MeterProvider read by a ManualReader, shut down
// at the end of the test.
func meterProvider(t *testing.T) (*sdkmetric.ManualReader, *sdkmetric.MeterProvider) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	return reader, mp
}

func newHarness(t *testing.T, cfg relay.Config, opts ...relayotel.Option) *harness {
	t.Helper()
	h := &harness{reader: sdkmetric.NewManualReader(), rec: tracetest.NewSpanRecorder()}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(h.reader))
	h.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(h.rec))
	t.Cleanup(func() {
		mp.Shutdown(context.Background())
		h.tp.Shutdown(context.Background())
	})
	obs := relayotel.New(append([]relayotel.Option{
		relayotel.WithMeterProvider(mp),
		relayotel.WithTracerProvider(h.tp),
		relayotel.WithUpstreams(cfg.Upstreams...),
	}, opts...)...)
	cfg.Hooks = relay.JoinHooks(cfg.Hooks, obs.Hooks())
	cfg.OnReport = func(r relay.Report) {
		h.mu.Lock()
		h.reports = append(h.reports, r)
		h.mu.Unlock()
	}
	if cfg.Retry.Backoff == nil {
		cfg.Retry.Backoff = func(int) time.Duration { return 0 }
	}
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	cfg.Base = tr
	r, err := relay.New(cfg)
	require.NoError(t, err)
	h.router = r
	return h
}

// server starts a relaytest server closed at the end of the test.
func server(t *testing.T, name string) *relaytest.Server {
	t.Helper()
	s := relaytest.NewServer(relaytest.WithName(name))
	t.Cleanup(s.Close)
	return s
}

// do sends body to the router's endpoint (a path under /v1/) and reads the
// whole answer; err is RoundTrip's.
func (h *harness) do(t *testing.T, ctx context.Context, method, endpoint, body string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, "http://relay.test/v1/"+endpoint, strings.NewReader(body))
	require.NoError(t, err)
	resp, err := h.router.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	_, err = io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return resp, nil
}

func (h *harness) chat(t *testing.T, body string) *http.Response {
	t.Helper()
	resp, err := h.do(t, context.Background(), http.MethodPost, "chat/completions", body)
	require.NoError(t, err)
	return resp
}

func (h *harness) report(t *testing.T) relay.Report {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	require.Len(t, h.reports, 1)
	return h.reports[0]
}

// spans returns the ended spans by name; a call's name appears once (see
// attempts for several attempts).
func (h *harness) spans(t *testing.T) map[string]sdktrace.ReadOnlySpan {
	t.Helper()
	m := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range h.rec.Ended() {
		if s.Name() != "relay.attempt" {
			require.NotContains(t, m, s.Name(), "one span per name")
		}
		m[s.Name()] = s
	}
	return m
}

// attempts returns the ended attempt spans in the order of their number.
func (h *harness) attempts() []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range h.rec.Ended() {
		if s.Name() == "relay.attempt" {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b sdktrace.ReadOnlySpan) int {
		return int(attrs(a)["relay.attempt.number"].AsInt64() - attrs(b)["relay.attempt.number"].AsInt64())
	})
	return out
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// kvs is an attribute map written for comparison: values as text.
func kvs(m map[attribute.Key]attribute.Value) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[string(k)] = v.Emit()
	}
	return out
}

// instrument is one metric, flattened for comparison.
type instrument struct {
	Unit   string
	Kind   string    // "histogram", "counter", "updowncounter", "gauge"
	Bounds []float64 // histograms
	Points []point   // sorted by Attrs
}

type point struct {
	Attrs string  // "k=v,k=v", sorted by key
	Count uint64  // histograms
	Value float64 // a histogram's sum, a counter's or a gauge's value
}

// metrics collects every metric of the observer's scope.
func (h *harness) metrics(t *testing.T) map[string]instrument {
	t.Helper()
	return collect(t, h.reader)
}

// collect collects every metric of the observers' scope from reader.
func collect(t *testing.T, reader *sdkmetric.ManualReader) map[string]instrument {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	out := map[string]instrument{}
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, "github.com/tokenrelay/relay/relayotel", sm.Scope.Name)
		require.Equal(t, "https://opentelemetry.io/schemas/1.41.0", sm.Scope.SchemaURL)
		for _, m := range sm.Metrics {
			in := instrument{Unit: m.Unit}
			switch d := m.Data.(type) {
			case metricdata.Histogram[float64]:
				in.Kind = "histogram"
				for _, p := range d.DataPoints {
					in.Bounds = p.Bounds
					in.Points = append(in.Points, point{enc(p.Attributes), p.Count, p.Sum})
				}
			case metricdata.Histogram[int64]:
				in.Kind = "histogram"
				for _, p := range d.DataPoints {
					in.Bounds = p.Bounds
					in.Points = append(in.Points, point{enc(p.Attributes), p.Count, float64(p.Sum)})
				}
			case metricdata.Sum[float64]:
				in.Kind = "counter"
				require.True(t, d.IsMonotonic, m.Name)
				require.Equal(t, metricdata.CumulativeTemporality, d.Temporality, m.Name)
				for _, p := range d.DataPoints {
					in.Points = append(in.Points, point{Attrs: enc(p.Attributes), Value: p.Value})
				}
			case metricdata.Sum[int64]:
				in.Kind = "counter"
				if !d.IsMonotonic {
					in.Kind = "updowncounter"
				}
				require.Equal(t, metricdata.CumulativeTemporality, d.Temporality, m.Name)
				for _, p := range d.DataPoints {
					in.Points = append(in.Points, point{Attrs: enc(p.Attributes), Value: float64(p.Value)})
				}
			case metricdata.Gauge[int64]:
				in.Kind = "gauge"
				for _, p := range d.DataPoints {
					in.Points = append(in.Points, point{Attrs: enc(p.Attributes), Value: float64(p.Value)})
				}
			default:
				t.Fatalf("%s: unexpected data %T", m.Name, m.Data)
			}
			slices.SortFunc(in.Points, func(a, b point) int { return strings.Compare(a.Attrs, b.Attrs) })
			out[m.Name] = in
		}
	}
	return out
}

func enc(s attribute.Set) string {
	var parts []string
	for _, kv := range s.ToSlice() {
		parts = append(parts, string(kv.Key)+"="+kv.Value.Emit())
	}
	return strings.Join(parts, ",")
}

// timed returns in with every point's Value replaced by whether it is
// positive (1) or not (0): for durations, whose sums vary.
func timed(in instrument) instrument {
	in.Points = slices.Clone(in.Points)
	for i := range in.Points {
		if in.Points[i].Value > 0 {
			in.Points[i].Value = 1
		} else {
			in.Points[i].Value = 0
		}
	}
	return in
}

// hostPort returns server.address and server.port of a server's URL as
// they appear in attribute encodings.
func hostPort(t *testing.T, s *relaytest.Server) (string, string) {
	t.Helper()
	u, err := url.Parse(s.URL)
	require.NoError(t, err)
	p, err := strconv.Atoi(u.Port())
	require.NoError(t, err)
	return u.Hostname(), strconv.Itoa(p)
}

func chatBody(model string, stream bool) string {
	s := ""
	if stream {
		s = `,"stream":true`
	}
	return `{"model":"` + model + `","messages":[{"role":"user","content":"Say hello."}]` + s + `}`
}
