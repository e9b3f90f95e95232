package bpe

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tokenrelay/relay/internal/corpus"
)

// coldTexts are the texts of BenchmarkFirstCount: a 4 KiB prompt of
// English prose, and the same with a 4 KiB run of one letter (a pre-token
// long enough for the backtracking encoder).
func coldTexts(tb testing.TB) map[string]string {
	prose := corpus.Prose(4 << 10)
	return map[string]string{
		"prompt":    prose,
		"longpiece": prose + " " + strings.Repeat("x", 4<<10),
	}
}

// TestFirstCountChild is run by BenchmarkFirstCount in a fresh process: it
// prints how long the first count of a text took and how long a second
// count of the same text takes.
func TestFirstCountChild(t *testing.T) {
	enc, text := os.Getenv("BPE_COLD_ENCODING"), os.Getenv("BPE_COLD_TEXT")
	if enc == "" {
		t.Skip("run by BenchmarkFirstCount")
	}
	s := coldTexts(t)[text]
	get := CL100K
	if enc == "o200k" {
		get = O200K
	}
	start := time.Now()
	first := get().Count(s)
	cold := time.Since(start)
	start = time.Now()
	second := get().Count(s)
	warm := time.Since(start)
	if first != second {
		t.Fatalf("first count %d, second %d", first, second)
	}
	fmt.Printf("coldstart %d %d\n", cold.Nanoseconds(), warm.Nanoseconds())
}

// BenchmarkFirstCount measures, each time in a fresh process, the first
// count of a text with an encoding (loading its tables) and a second count
// of the same text, and reports both (first-ms, warm-ms) and their
// difference (overhead-ms), the cost of the first request.
func BenchmarkFirstCount(b *testing.B) {
	for _, text := range []string{"prompt", "longpiece"} {
		for _, enc := range []string{"o200k", "cl100k"} {
			b.Run(text+"/"+enc, func(b *testing.B) {
				var cold, warm time.Duration
				for b.Loop() {
					cmd := exec.Command(os.Args[0], "-test.run=^TestFirstCountChild$", "-test.count=1", "-test.v")
					cmd.Env = append(os.Environ(), "BPE_COLD_ENCODING="+enc, "BPE_COLD_TEXT="+text)
					out, err := cmd.CombinedOutput()
					if err != nil {
						b.Fatalf("%v: %s", err, out)
					}
					c, w, err := parseColdStart(string(out))
					if err != nil {
						b.Fatalf("%v: %s", err, out)
					}
					cold += c
					warm += w
				}
				n := float64(b.N)
				b.ReportMetric(float64(cold.Microseconds())/1e3/n, "first-ms")
				b.ReportMetric(float64(warm.Microseconds())/1e3/n, "warm-ms")
				b.ReportMetric(float64((cold-warm).Microseconds())/1e3/n, "overhead-ms")
			})
		}
	}
}

func parseColdStart(out string) (cold, warm time.Duration, err error) {
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "coldstart" {
			c, err1 := strconv.ParseInt(f[1], 10, 64)
			w, err2 := strconv.ParseInt(f[2], 10, 64)
			if err1 == nil && err2 == nil {
				return time.Duration(c), time.Duration(w), nil
			}
		}
	}
	return 0, 0, fmt.Errorf("no coldstart line")
}
