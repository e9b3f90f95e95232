package relayotel

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// collectSums reports the totals of one or more Observers (each a pair:
// cost sums, attempt sums) through one SDK reader, as the Observers do,
// and returns the cost and attempt totals by attribute set ("k=v,k=v").
func collectSums(t *testing.T, observers ...[2]*sums) (map[string]float64, map[string]int64) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	// Above the SDK's own cardinality limit (2000 by default), which
	// applies to observed sets as to recorded ones: the test looks at the
	// sums' bound.
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader), sdkmetric.WithCardinalityLimit(4*maxCached))
	defer mp.Shutdown(context.Background())
	var b breakers
	b.init(nil)
	for _, o := range observers {
		newInstruments(mp, &b, o[0], o[1])
	}
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	enc := attribute.DefaultEncoder()
	fs, ns := map[string]float64{}, map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[float64]:
				for _, p := range d.DataPoints {
					fs[p.Attributes.Encoded(enc)] = p.Value
				}
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					ns[p.Attributes.Encoded(enc)] = p.Value
				}
			}
		}
	}
	return fs, ns
}

// TestSumsConcurrent: totals added to from many goroutines at once are
// reported whole, each under its own attribute set.
func TestSumsConcurrent(t *testing.T) {
	var costs, attempts sums
	a := costs.get(attribute.NewSet(attribute.String("k", "a")))
	b := costs.get(attribute.NewSet(attribute.String("k", "b")))
	n := attempts.get(attribute.NewSet(attribute.String("k", "a")))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				a.addFloat(0.25)
				b.addFloat(1)
				n.addInt(1)
			}
		})
	}
	wg.Wait()
	fs, ns := collectSums(t, [2]*sums{&costs, &attempts})
	assert.Equal(t, map[string]float64{"k=a": 2000, "k=b": 8000}, fs)
	assert.Equal(t, map[string]int64{"k=a": 8000}, ns)
	assert.Same(t, a, costs.get(attribute.NewSet(attribute.String("k", "a"))), "one total per set")
}

// TestSumsUnusedAndOverflow: a set made but never added to is not
// reported; past maxCached sets, the rest add to the overflow set.
func TestSumsUnusedAndOverflow(t *testing.T) {
	var costs, attempts sums
	costs.get(attribute.NewSet(attribute.String("k", "never")))
	for i := range maxCached + 10 {
		costs.get(attribute.NewSet(attribute.Int("i", i))).addFloat(1)
	}
	fs, ns := collectSums(t, [2]*sums{&costs, &attempts})
	assert.Empty(t, ns)
	assert.NotContains(t, fs, "k=never")
	assert.Len(t, fs, maxCached)                           // maxCached-1 sets of their own, and the overflow
	assert.Equal(t, 11.0, fs["otel.metric.overflow=true"]) // the last 11 sets
	assert.Equal(t, 1.0, fs["i=0"])
}

// TestSumsTwoObservers: two Observers on one MeterProvider (two routers in
// a process) report under the same instruments, and the SDK adds their
// totals of the same attribute set, as it would their synchronous Adds.
func TestSumsTwoObservers(t *testing.T) {
	var c1, a1, c2, a2 sums
	set := attribute.NewSet(attribute.String("k", "a"))
	c1.get(set).addFloat(1)
	c2.get(set).addFloat(2)
	a2.get(set).addInt(5)
	fs, ns := collectSums(t, [2]*sums{&c1, &a1}, [2]*sums{&c2, &a2})
	assert.Equal(t, map[string]float64{"k=a": 3}, fs)
	assert.Equal(t, map[string]int64{"k=a": 5}, ns)
}
