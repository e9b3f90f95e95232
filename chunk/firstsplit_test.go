package chunk

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// randomLetters returns n random lowercase letters: a run without any
// pre-token boundary that does not repeat, which Split cuts by a search in
// every segment.
func randomLetters(n int) string {
	rng := rand.New(rand.NewPCG(3, 4))
	b := make([]byte, n)
	for i := range b {
		b[i] = "abcdefghijklmnopqrstuvwxyz"[rng.IntN(26)]
	}
	return string(b)
}

// TestFirstSplitChild is run by BenchmarkFirstSplit in a fresh process: it
// prints how long the process's first Split of a text took and how long a
// second Split of the same text took.
func TestFirstSplitChild(t *testing.T) {
	n, err := strconv.Atoi(os.Getenv("CHUNK_FIRST_SPLIT_BYTES"))
	if err != nil {
		t.Skip("run by BenchmarkFirstSplit")
	}
	text := randomLetters(n)
	start := time.Now()
	first := Split(text, 16, "gpt-4o")
	cold := time.Since(start)
	start = time.Now()
	second := Split(text, 16, "gpt-4o")
	again := time.Since(start)
	if strings.Join(first, "|") != strings.Join(second, "|") {
		t.Fatal("the second Split cut elsewhere")
	}
	fmt.Printf("firstsplit %d %d\n", cold.Nanoseconds(), again.Nanoseconds())
}

// BenchmarkFirstSplit measures, each time in a fresh process, the first
// Split of random letters into 16-token segments and a second Split of
// the same text (first-ms, second-ms). Their searches use the counter's
// tables for long runs once the process has spent about what building
// them costs without them (bpe's prefixBudget, over all calls): the
// tables are built during the first Split of a long text, the second of
// a text of a few hundred KiB, and neither of a short one.
func BenchmarkFirstSplit(b *testing.B) {
	for _, n := range []int{32 << 10, 256 << 10, 512 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("random-letters-%dKiB", n>>10), func(b *testing.B) {
			var first, second time.Duration
			for b.Loop() {
				cmd := exec.Command(os.Args[0], "-test.run=^TestFirstSplitChild$", "-test.count=1", "-test.v")
				cmd.Env = append(os.Environ(), "CHUNK_FIRST_SPLIT_BYTES="+strconv.Itoa(n))
				out, err := cmd.CombinedOutput()
				if err != nil {
					b.Fatalf("%v: %s", err, out)
				}
				var c, w int64
				for _, line := range strings.Split(string(out), "\n") {
					if _, err := fmt.Sscanf(line, "firstsplit %d %d", &c, &w); err == nil {
						break
					}
				}
				if c == 0 {
					b.Fatalf("no firstsplit line: %s", out)
				}
				first += time.Duration(c)
				second += time.Duration(w)
			}
			k := float64(b.N)
			b.ReportMetric(float64(first.Microseconds())/1e3/k, "first-ms")
			b.ReportMetric(float64(second.Microseconds())/1e3/k, "second-ms")
		})
	}
}
