package main

import (
	"encoding/json"
	"os"
	"time"
)

// -save FILE writes the run's rows for the charts of examples/simchart:
// one JSON array, a row per line, each row the object -json prints plus
// its latency CDF.

// cdfPoints is the most points of a mode's latency CDF.
const cdfPoints = 200

// savedRow is one row of a -save file.
type savedRow struct {
	result
	// LatencyCDF are points [ms, share] of the mode's empirical latency
	// CDF: the share of all its requests answered successfully within ms
	// (so the last point is at the mode's success rate). Absent from the
	// rows of the replicas comparison.
	LatencyCDF [][2]float64 `json:"latency_cdf,omitempty"`
}

// save writes results to path as a -save file.
func save(path string, results []result) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	b := []byte("[\n")
	for i, r := range results {
		row := savedRow{result: r}
		if r.Replicas == nil {
			row.LatencyCDF = cdf(r.okLatencies, r.Requests)
		}
		line, err := json.Marshal(row)
		if err != nil {
			f.Close()
			return err
		}
		b = append(b, line...)
		if i < len(results)-1 {
			b = append(b, ',')
		}
		b = append(b, '\n')
	}
	b = append(b, "]\n"...)
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// cdf returns up to cdfPoints points [ms, share] of the empirical CDF of
// sorted latencies out of total requests, at evenly spaced ranks;
// latencies of 0 are left out (a log axis has no room for them).
func cdf(sorted []time.Duration, total int) [][2]float64 {
	var pts [][2]float64
	n := len(sorted)
	for k := 1; k <= min(n, cdfPoints); k++ {
		i := k*n/min(n, cdfPoints) - 1
		if x := float64(sorted[i]) / float64(time.Millisecond); x > 0 {
			pts = append(pts, [2]float64{round(x, 3), float64(i+1) / float64(total)})
		}
	}
	return pts
}
