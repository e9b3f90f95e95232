package main

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
)

// svgDoc is what a test reads of an SVG file: its size, its texts, and
// the style and outline of each path.
type svgDoc struct {
	Width, Height string
	Texts         []string
	Paths         []svgPath
}

type svgPath struct{ D, Style string }

// readSVG parses an SVG file as XML to its end.
func readSVG(t *testing.T, path string) svgDoc {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	dec := xml.NewDecoder(bytes.NewReader(b))
	var doc svgDoc
	var inText bool
	var root string
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		require.NoError(t, err, "%s is well-formed XML", path)
		switch e := tok.(type) {
		case xml.StartElement:
			attr := func(name string) string {
				for _, a := range e.Attr {
					if a.Name.Local == name {
						return a.Value
					}
				}
				return ""
			}
			if root == "" {
				root = e.Name.Local
				assert.Equal(t, "http://www.w3.org/2000/svg", e.Name.Space)
				doc.Width, doc.Height = attr("width"), attr("height")
			}
			switch e.Name.Local {
			case "text":
				inText = true
				doc.Texts = append(doc.Texts, "")
			case "path":
				doc.Paths = append(doc.Paths, svgPath{D: attr("d"), Style: attr("style")})
			}
		case xml.EndElement:
			inText = inText && e.Name.Local != "text"
		case xml.CharData:
			if inText {
				doc.Texts[len(doc.Texts)-1] += string(e)
			}
		}
	}
	require.Equal(t, "svg", root)
	return doc
}

func hexColor(c color.Color) string {
	r, g, b, _ := c.RGBA()
	return fmt.Sprintf("#%02X%02X%02X", r>>8, g>>8, b>>8)
}

// TestPlot runs three modes with -plot and reads the four charts back:
// valid SVG, the run in every title, every mode named, and in the CDF a
// line of the mode's color per mode.
func TestPlot(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "charts")
	var out, errb bytes.Buffer
	code := run([]string{"-requests", "60", "-concurrency", "8", "-modes", "direct,cluster-aware,budget", "-plot", dir}, &out, &errb)
	require.Equal(t, 0, code, errb.String())
	assert.Contains(t, out.String(), "SIMULATED FLEET", "the tables stay the output")
	assert.Contains(t, errb.String(), "simulate: wrote "+filepath.Join(dir, plotLatency))
	names := []string{"direct", "cluster-aware", "budget"}
	for _, f := range []string{plotLatency, plotThroughput, plotCache, plotCost} {
		doc := readSVG(t, filepath.Join(dir, f))
		assert.NotEmpty(t, doc.Width, f)
		texts := strings.Join(doc.Texts, "\n")
		assert.Contains(t, texts, "batch workload, outage scenario, simulated fleet", f)
		for _, m := range names {
			assert.Contains(t, doc.Texts, m, "%s names mode %s", f, m)
		}
	}
	cdf := readSVG(t, filepath.Join(dir, plotLatency))
	assert.Contains(t, cdf.Texts, "Latency CDF")
	assert.Contains(t, cdf.Texts, "latency, wall-clock ms (×50 simulated), log scale")
	for i, m := range names {
		stroke := "stroke:" + hexColor(plotutil.Color(i))
		lines := 0
		for _, p := range cdf.Paths {
			if strings.Contains(p.Style, stroke) && strings.Count(p.D, "L") >= 20 {
				lines++
			}
		}
		assert.Equal(t, 1, lines, "one CDF line for %s", m)
	}
	tput := readSVG(t, filepath.Join(dir, plotThroughput))
	for _, want := range []string{"Throughput", "Success", "requests per second (wall-clock)", "successful requests, %"} {
		assert.Contains(t, tput.Texts, want)
	}
	assert.Contains(t, readSVG(t, filepath.Join(dir, plotCache)).Texts, "cache-hit %")
	assert.Contains(t, readSVG(t, filepath.Join(dir, plotCost)).Texts, "USD per 1k requests")

	// A directory that cannot be made fails the run.
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	errb.Reset()
	assert.Equal(t, 1, run([]string{"-requests", "10", "-modes", "direct", "-plot", file}, io.Discard, &errb))
	assert.Contains(t, errb.String(), "simulate: -plot: ")
}

func TestCDF(t *testing.T) {
	ms := func(n ...int) []time.Duration {
		var out []time.Duration
		for _, v := range n {
			out = append(out, time.Duration(v)*time.Millisecond)
		}
		return out
	}
	assert.Equal(t, plotter.XYs{{X: 1, Y: 0.4}, {X: 2, Y: 0.6}, {X: 4, Y: 0.8}}, cdf(ms(0, 1, 2, 4), 5),
		"out of every request, failures included; no 0 on a log axis")
	long := make([]time.Duration, 1000)
	for i := range long {
		long[i] = time.Duration(i+1) * time.Millisecond
	}
	pts := cdf(long, 1000)
	require.Len(t, pts, cdfPoints)
	assert.Equal(t, plotter.XY{X: 5, Y: 0.005}, pts[0])
	assert.Equal(t, plotter.XY{X: 1000, Y: 1}, pts[len(pts)-1])
	assert.Empty(t, cdf(nil, 10))
}

func TestNiceTicks(t *testing.T) {
	labels := func(top float64) ([]string, float64) {
		ticks, last := niceTicks(top)
		var out []string
		for _, tk := range ticks {
			out = append(out, tk.Label)
		}
		return out, last
	}
	for _, tc := range []struct {
		top  float64
		want []string
	}{
		{26.2, []string{"0", "5", "10", "15", "20", "25", "30"}},
		{100, []string{"0", "20", "40", "60", "80", "100"}},
		{0.83, []string{"0.0", "0.2", "0.4", "0.6", "0.8", "1.0"}},
		{1491, []string{"0", "500", "1000", "1500"}},
		{0, []string{"0.0", "0.2", "0.4", "0.6", "0.8", "1.0"}},
	} {
		got, last := labels(tc.top)
		assert.Equal(t, tc.want, got, "%g", tc.top)
		assert.GreaterOrEqual(t, last, tc.top)
	}
}
