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

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"gonum.org/v1/plot/plotutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// runFile is testdata/run.json: the rows of
// `go run ./examples/simulate -requests 60 -concurrency 8 -modes direct,cluster-aware,budget -replicas 2 -save FILE`.
const runFile = "testdata/run.json"

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

// TestCharts draws the charts of a run of three modes and a replicas
// comparison and reads them back: valid SVG, the run in every title, every
// mode named (the replicas rows left out), and in the CDF a line of the
// mode's color per mode.
func TestCharts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "charts")
	var errb bytes.Buffer
	require.Equal(t, 0, run([]string{"-out", dir, runFile}, nil, &errb), errb.String())
	assert.Contains(t, errb.String(), "simchart: wrote "+filepath.Join(dir, plotLatency))
	names := []string{"direct", "cluster-aware", "budget"}
	for _, f := range chartFiles() {
		doc := readSVG(t, filepath.Join(dir, f))
		assert.NotEmpty(t, doc.Width, f)
		texts := strings.Join(doc.Texts, "\n")
		assert.Contains(t, texts, "batch workload, outage scenario, simulated fleet", f)
		for _, m := range names {
			assert.Contains(t, doc.Texts, m, "%s names mode %s", f, m)
		}
		assert.NotContains(t, texts, "replicas/", "%s: the replicas rows are not modes", f)
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
}

// TestStdin: FILE "-" reads the rows from standard input; a real
// endpoint's run says so in the titles.
func TestStdin(t *testing.T) {
	dir := t.TempDir()
	rows := `[{"mode":"direct","workload":"replay","scenario":"outage","real_endpoint":true,"throughput_rps":3,"success_pct":100,"latency_cdf":[[10,0.5],[20,1]]}]`
	var errb bytes.Buffer
	require.Equal(t, 0, run([]string{"-out", dir, "-"}, strings.NewReader(rows), &errb), errb.String())
	assert.Contains(t, strings.Join(readSVG(t, filepath.Join(dir, plotCost)).Texts, "\n"), "replay workload, real endpoint")
}

func TestErrors(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, []byte("not json"), 0o644))
	for _, tc := range []struct {
		args  []string
		stdin string
		code  int
		want  string
	}{
		{nil, "", 2, "simchart: want one FILE, got 0 arguments"},
		{[]string{"a", "b"}, "", 2, "want one FILE, got 2"},
		{[]string{"-nope", runFile}, "", 2, "flag provided but not defined"},
		{[]string{filepath.Join(t.TempDir(), "missing.json")}, "", 1, "no such file"},
		{[]string{file}, "", 1, "not the rows of simulate -save"},
		{[]string{"-"}, `[{"mode":"replicas/shared","replicas":{}}]`, 1, "-: no mode's row to draw"},
		{[]string{"-out", file, runFile}, "", 1, "simchart: mkdir"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var errb bytes.Buffer
			assert.Equal(t, tc.code, run(tc.args, strings.NewReader(tc.stdin), &errb))
			assert.Contains(t, errb.String(), tc.want)
		})
	}
	var errb bytes.Buffer
	assert.Equal(t, 0, run([]string{"-h"}, nil, &errb))
	assert.Contains(t, errb.String(), "usage: simchart [-out DIR] FILE")
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
