// Command simchart draws SVG charts of a fleet simulation's modes from the
// rows that `go run ./examples/simulate -save FILE` writes:
//
//	go run ./examples/simulate -save run.json > run.txt
//	go run ./examples/simchart -out charts run.json
//
// It writes four charts into the -out directory (created if needed):
// latency-cdf.svg (per mode, the share of requests answered successfully
// within a latency, log axis), throughput-success.svg, cache-hits.svg and
// cost.svg ($ per 1,000 requests). The rows of a -replicas comparison are
// left out. FILE "-" reads standard input.
//
// It is a module of its own so that the simulation, and any module that
// imports relay, does not build the plotting library (gonum.org/v1/plot).
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

func main() { os.Exit(run(os.Args[1:], os.Stdin, os.Stderr)) }

// row is what the charts read of a row of a -save file.
type row struct {
	Mode          string       `json:"mode"`
	Workload      string       `json:"workload"`
	Scenario      string       `json:"scenario"`
	RealEndpoint  bool         `json:"real_endpoint"`
	ThroughputRPS float64      `json:"throughput_rps"`
	SuccessPct    float64      `json:"success_pct"`
	CacheHitPct   float64      `json:"cache_hit_pct"`
	CostPer1kReq  float64      `json:"cost_per_1k_requests_usd"`
	LatencyCDF    [][2]float64 `json:"latency_cdf"`
	Replicas      any          `json:"replicas"`
}

// run is the command: it returns the exit code (2 for bad flags).
func run(args []string, stdin io.Reader, stderr io.Writer) int {
	fs := flag.NewFlagSet("simchart", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", ".", "the `DIR`ectory to write the charts into (created if needed)")
	fs.Usage = func() {
		fmt.Fprint(stderr, "usage: simchart [-out DIR] FILE\n\nDraws "+strings.Join(chartFiles(), ", ")+
			"\nfrom the rows of `go run ./examples/simulate -save FILE` (FILE - reads standard input).\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprintf(stderr, "simchart: want one FILE, got %d arguments\n", fs.NArg())
		fs.Usage()
		return 2
	}
	rows, err := read(fs.Arg(0), stdin)
	if err == nil && len(rows) == 0 {
		err = fmt.Errorf("%s: no mode's row to draw", fs.Arg(0))
	}
	var files []string
	if err == nil {
		files, err = writeCharts(*out, rows)
	}
	if err != nil {
		fmt.Fprintf(stderr, "simchart: %v\n", err)
		return 1
	}
	fmt.Fprintf(stderr, "simchart: wrote %s\n", strings.Join(files, ", "))
	return 0
}

// read returns the rows of the modes in the file at path ("-": stdin),
// without those of a -replicas comparison.
func read(path string, stdin io.Reader) ([]row, error) {
	var b []byte
	var err error
	if path == "-" {
		b, err = io.ReadAll(stdin)
	} else {
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, err
	}
	var all []row
	if err := json.Unmarshal(b, &all); err != nil {
		return nil, fmt.Errorf("%s: not the rows of simulate -save: %w", path, err)
	}
	var rows []row
	for _, r := range all {
		if r.Replicas == nil {
			rows = append(rows, r)
		}
	}
	return rows, nil
}
