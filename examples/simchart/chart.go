package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// The charts, one SVG file each.
const (
	plotLatency    = "latency-cdf.svg"
	plotThroughput = "throughput-success.svg"
	plotCache      = "cache-hits.svg"
	plotCost       = "cost.svg"
)

func chartFiles() []string { return []string{plotLatency, plotThroughput, plotCache, plotCost} }

// writeCharts writes the charts of rows into dir, creating it, and returns
// the files written.
func writeCharts(dir string, rows []row) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	about := runCaption(rows[0])
	cdfPlot, err := latencyCDF(rows, about)
	if err != nil {
		return nil, err
	}
	one := func(p *plot.Plot) func(*vgsvg.Canvas) { return func(c *vgsvg.Canvas) { p.Draw(inset(c)) } }
	bars := vg.Length(max(len(rows), 4))*0.4*vg.Inch + 1.2*vg.Inch
	charts := []struct {
		name string
		w, h vg.Length
		draw func(*vgsvg.Canvas)
	}{
		{plotLatency, 9 * vg.Inch, 6 * vg.Inch, one(cdfPlot)},
		{plotThroughput, 10 * vg.Inch, bars + 0.4*vg.Inch, throughputSuccess(rows, about)},
		{plotCache, 8 * vg.Inch, bars, one(modeBars(rows, "Prompt tokens served from cache\n"+about, "cache-hit %",
			func(r row) float64 { return r.CacheHitPct }))},
		{plotCost, 8 * vg.Inch, bars, one(modeBars(rows, "Cost per 1,000 requests\n"+about, "USD per 1k requests",
			func(r row) float64 { return r.CostPer1kReq }))},
	}
	var files []string
	for _, ch := range charts {
		c := vgsvg.New(ch.w, ch.h)
		ch.draw(c)
		path := filepath.Join(dir, ch.name)
		if err := writeTo(path, c); err != nil {
			return files, err
		}
		files = append(files, path)
	}
	return files, nil
}

// inset is the canvas of c a chart is drawn on: a margin is left, so that
// labels set in a font wider than the one the layout measured (a viewer
// without Liberation Serif) stay on the page.
func inset(c *vgsvg.Canvas) draw.Canvas {
	return draw.Crop(draw.New(c), vg.Inch/4, -vg.Inch/8, vg.Inch/16, -vg.Inch/16)
}

// writeTo writes c to the file at path.
func writeTo(path string, c *vgsvg.Canvas) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// runCaption names the run in the charts' titles.
func runCaption(r row) string {
	if r.RealEndpoint {
		return r.Workload + " workload, real endpoint"
	}
	return fmt.Sprintf("%s workload, %s scenario, simulated fleet", r.Workload, r.Scenario)
}

// latencyCDF plots, for each mode, the share of its requests answered
// successfully within a latency, on a log axis: a mode's curve ends at its
// success rate (failures, which may come at once, are not latencies).
func latencyCDF(rows []row, about string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Latency CDF\n" + about
	p.X.Label.Text = "latency, wall-clock ms (×50 simulated), log scale"
	p.Y.Label.Text = "share of requests answered successfully within"
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	p.Y.Min, p.Y.Max = 0, 1
	p.Legend.Top, p.Legend.Left = true, true
	p.Add(plotter.NewGrid())
	for i, r := range rows {
		if len(r.LatencyCDF) == 0 {
			continue
		}
		pts := make(plotter.XYs, len(r.LatencyCDF))
		for i, p := range r.LatencyCDF {
			pts[i] = plotter.XY{X: p[0], Y: p[1]}
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return nil, err
		}
		l.Color = plotutil.Color(i)
		l.Dashes = plotutil.Dashes(i / len(plotutil.DefaultColors))
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(r.Mode, l)
	}
	return p, nil
}

// modeBars is a horizontal bar per mode, the first mode on top.
func modeBars(rows []row, title, label string, value func(row) float64) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Title.Padding = vg.Points(10)
	p.X.Label.Text = label
	p.X.Min = 0
	p.Y.Padding = vg.Points(8) // room for a label set wider than measured
	var vs plotter.Values
	names := make([]string, len(rows))
	for i := range rows {
		r := rows[len(rows)-1-i]
		vs = append(vs, value(r))
		names[i] = r.Mode
	}
	bars, err := plotter.NewBarChart(vs, vg.Points(14))
	if err != nil {
		panic(err) // values are finite
	}
	bars.Horizontal = true
	bars.Color = plotutil.Color(0)
	bars.LineStyle.Width = 0
	p.Add(plotter.NewGrid(), bars)
	p.NominalY(names...)
	p.X.Tick.Marker, p.X.Max = niceTicks(slices.Max(vs))
	return p
}

// niceTicks returns ticks from 0 past top, 4 to 8 of them, a step of 1, 2
// or 5 times a power of ten apart, and the last one.
func niceTicks(top float64) (plot.ConstantTicks, float64) {
	if !(top > 0) {
		top = 1
	}
	step := math.Pow(10, math.Floor(math.Log10(top/4)))
	for _, m := range []float64{1, 2, 5, 10} {
		if top/(m*step) <= 7 {
			step *= m
			break
		}
	}
	places := max(0, int(-math.Floor(math.Log10(step))))
	var ticks plot.ConstantTicks
	for i := 0; ; i++ {
		v := float64(i) * step
		ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', places, 64)})
		if v >= top {
			return ticks, v
		}
	}
}

// throughputSuccess draws throughput and success side by side.
func throughputSuccess(rows []row, about string) func(*vgsvg.Canvas) {
	return func(c *vgsvg.Canvas) {
		tput := modeBars(rows, "Throughput", "requests per second (wall-clock)", func(r row) float64 { return r.ThroughputRPS })
		succ := modeBars(rows, "Success", "successful requests, %", func(r row) float64 { return r.SuccessPct })
		succ.X.Max = 100
		dc := inset(c)
		title := plot.New()
		title.Title.Text = "Throughput and success — " + about
		title.HideAxes()
		top := dc
		top.Min.Y = dc.Max.Y - 0.4*vg.Inch
		title.Draw(top)
		dc.Max.Y -= 0.4 * vg.Inch
		tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Inch / 2, PadY: vg.Inch / 8, PadTop: vg.Inch / 8, PadBottom: vg.Inch / 8,
			PadLeft: vg.Inch / 8, PadRight: vg.Inch / 4}
		cs := [][]draw.Canvas{{tiles.At(dc, 0, 0), tiles.At(dc, 1, 0)}}
		tput.Draw(cs[0][0])
		succ.Draw(cs[0][1])
	}
}
