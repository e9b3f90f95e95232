package interop

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/failsafe-go/failsafe-go/circuitbreaker"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/failsafe-go/failsafe-go/ratelimiter"
	"github.com/hashicorp/go-retryablehttp"

	. "github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/internal/corpus"
	"github.com/tokenrelay/relay/internal/tokens"
)

// countTexts counts the four contents with the counter alone (no memo,
// no router): what counting a new prompt costs, whoever does it with
// this counter.
func countTexts(ob *corpus.Chat) int {
	n := 0
	for _, t := range ob.Texts {
		n += tokens.O200K.Count(unsafe.String(unsafe.SliceData(t), len(t))) // no copy: the counter alone
	}
	return n
}

// overheadTransports returns the transports BenchmarkOverhead compares, each
// over base: the bare base, hashicorp/go-retryablehttp's RoundTripper
// (default retry policy, logging off), failsafe-go's failsafehttp
// RoundTripper with a retry policy, a circuit breaker and a rate limiter
// that never limits, and the router over two upstreams with its defaults
// (affinity, retries, breakers) and RPM/TPM limits that never limit.
func overheadTransports(tb testing.TB, base http.RoundTripper, reports *atomic.Int64) map[string]http.RoundTripper {
	rc := retryablehttp.NewClient()
	rc.HTTPClient = &http.Client{Transport: base}
	rc.Logger = nil
	fs := failsafehttp.NewRoundTripper(base,
		failsafehttp.NewRetryPolicyBuilder().Build(),
		circuitbreaker.NewBuilder[*http.Response]().HandleIf(func(r *http.Response, err error) bool {
			return err != nil || r.StatusCode >= 500
		}).WithFailureThreshold(5).WithDelay(time.Second).Build(),
		ratelimiter.NewBursty[*http.Response](1<<30, time.Second),
	)
	r, err := New(Config{
		Upstreams: []Upstream{
			{Name: "a", BaseURL: "http://a.mem/v1", APIKey: "sk-bench", RPM: 1 << 40, TPM: 1 << 50},
			{Name: "b", BaseURL: "http://b.mem/v1", APIKey: "sk-bench", RPM: 1 << 40, TPM: 1 << 50},
		},
		Base:     base,
		OnReport: func(Report) { reports.Add(1) },
	})
	if err != nil {
		tb.Fatal(err)
	}
	return map[string]http.RoundTripper{
		"bare":          base,
		"retryablehttp": &retryablehttp.RoundTripper{Client: rc},
		"failsafe":      fs,
		"relay":         r,
	}
}

// overheadCase is a row of BenchmarkOverhead.
type overheadCase struct {
	name, rt string
	renew    bool // every request new: no message seen before
}

var overheadCases = []overheadCase{
	{"bare", "bare", false},
	{"retryablehttp", "retryablehttp", false},
	{"failsafe", "failsafe", false},
	{"relay-warm", "relay", false},
	{"relay-new", "relay", true},
}

// BenchmarkOverhead puts the router beside its peers: the same 4 KB
// four-message chat request (corpus.Chat) sent through each transport
// over the same in-memory Base (corpus.MemBase), so that each row minus "bare" is
// what the transport itself costs per request in CPU and allocations.
//
//   - bare: the in-memory Base alone.
//   - retryablehttp: hashicorp/go-retryablehttp's RoundTripper.
//   - failsafe: failsafe-go's failsafehttp with retry, circuit breaker and
//     rate limiter.
//   - relay-warm: the router, the same prompt every time (every count a
//     token-memo hit): a client resending a conversation.
//   - relay-new: the router, every message of every request never seen
//     before: each string is counted by the tokenizer.
//
// The -parallel16 rows send from 16 goroutines (8 per core on 2 cores),
// each with its own body, to show contention. Every row reads and closes
// the response body. The serial rows also report cpu-ns/op, the CPU time of
// the sending thread per request (Linux): on a machine shared with other
// work it moves less than ns/op, which counts the waits for a core too
// (but it leaves out the garbage collector's background work).
func BenchmarkOverhead(b *testing.B) {
	answer := fixture(b, "chat_response_default.json")
	var reports atomic.Int64
	rts := overheadTransports(b, corpus.MemBase(answer), &reports)
	tokens.O200K.Count("load the encodings before timing")
	var seq atomic.Uint64 // numbers of new requests, unique across rows and runs
	send := func(b testing.TB, rt http.RoundTripper, body []byte) {
		req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", bytes.NewReader(body))
		resp, err := rt.RoundTrip(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	for _, c := range overheadCases {
		rt := rts[c.rt]
		b.Run(c.name, func(b *testing.B) {
			ob := corpus.NewChat()
			b.ReportAllocs()
			b.SetBytes(int64(len(ob.B)))
			runtime.LockOSThread() // for threadCPU
			defer runtime.UnlockOSThread()
			cpu0, cpuOK := threadCPU()
			n := 0
			for b.Loop() {
				if c.renew {
					ob.Renew(seq.Add(1))
				}
				send(b, rt, ob.B)
				n++
			}
			if cpu1, ok := threadCPU(); ok && cpuOK && n > 0 {
				b.ReportMetric(float64(cpu1-cpu0)/float64(n), "cpu-ns/op")
			}
		})
	}
	for _, c := range overheadCases {
		rt := rts[c.rt]
		b.Run(c.name+"-parallel16", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(corpus.NewChat().B)))
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				ob := corpus.NewChat()
				for pb.Next() {
					if c.renew {
						ob.Renew(seq.Add(1))
					}
					send(b, rt, ob.B)
				}
			})
		})
	}
	if reports.Load() == 0 {
		b.Fatal("no reports")
	}
}

// BenchmarkOverheadPaired measures BenchmarkOverhead's rows as paired
// differences, which a machine whose speed drifts (a shared VM) does not
// reach: each iteration is a round that sends 256 calls through each of
// bare, failsafe-go, relay warm and relay new, in an order that rotates,
// from one goroutine or from 16 (8 per core on 2 cores). Rounds this long
// keep each transport's code and data in the caches for most of its calls,
// as the unpaired rows do; shorter ones charge the switch to the transport
// with the larger footprint, relay. The
// metrics are the medians over the rounds of each transport's per-call
// time minus bare's in the same round (failsafe-ns, warm-ns, new-ns), and
// warm÷failsafe and new÷failsafe of those medians. A fifth row, count,
// is not a transport: each of its calls is a bare call plus the counter
// alone (internal/bpe, its piece cache warm, no memo) counting the four
// contents of a new body, already decoded; count-ns and count÷failsafe
// are what counting a new prompt costs by itself, a floor under new-ns
// for any router that counts with this counter. ns/op is one round.
//
// Who pays for the garbage collector differs between the two kinds of
// run. In the plain rows (goroutines=N) a collection runs when the heap
// has grown enough, concurrently with whichever round is on, so a round
// can pay for garbage an earlier round made: failsafe-go allocates 13.6 KB
// a call and relay 10.2 KB, and their rounds alternate. In the
// ",gc=round" rows each round ends with runtime.GC() on its clock, so the
// sweep of a round's garbage is charged to that round; the marking of the
// live heap, the same for every round, cancels out in the differences,
// which under-charges the transport that allocates most by what marking
// costs per byte it allocates (little here: the counter's large tables
// hold no pointers). The first kind leans against the transport whose
// round follows a heavy allocator's, the second a little towards the one
// that allocates most; BenchmarkOverhead, where each row runs alone for
// its whole time, charges each its own collections, but drifts with the
// host's speed.
func BenchmarkOverheadPaired(b *testing.B) {
	answer := fixture(b, "chat_response_default.json")
	var reports atomic.Int64
	rts := overheadTransports(b, corpus.MemBase(answer), &reports)
	tokens.O200K.Count("load the encodings before timing")
	var seq atomic.Uint64
	rows := []overheadCase{overheadCases[0], overheadCases[2], overheadCases[3], overheadCases[4], {"count", "bare", false}}
	for _, run := range []struct {
		par     int
		gcRound bool
	}{{1, false}, {16, false}, {1, true}, {16, true}} {
		par := run.par
		name := fmt.Sprintf("goroutines=%d", par)
		if run.gcRound {
			name += ",gc=round"
		}
		b.Run(name, func(b *testing.B) {
			calls := 256 / par // per goroutine and round
			if calls < 8 {
				calls = 8
			}
			bodies := make([]*corpus.Chat, par)
			for g := range bodies {
				bodies[g] = corpus.NewChat()
			}
			round := func(c overheadCase) time.Duration {
				start := time.Now()
				var wg sync.WaitGroup
				for g := range par {
					wg.Go(func() {
						ob := bodies[g]
						for range calls {
							if c.renew {
								ob.Renew(seq.Add(1))
							}
							if err := sendOnce(rts[c.rt], ob.B); err != nil {
								b.Error(err)
								return
							}
							if c.name == "count" {
								ob.RenewTexts(seq.Add(1))
								if countTexts(ob) == 0 {
									b.Error("no tokens")
									return
								}
							}
						}
					})
				}
				wg.Wait()
				if run.gcRound {
					runtime.GC() // this round's garbage, collected on its clock
				}
				return time.Since(start) / time.Duration(calls*par)
			}
			for _, c := range rows { // warm up
				round(c)
			}
			over := make([][]float64, len(rows))
			for i := 0; b.Loop(); i++ {
				var d [5]time.Duration
				for k := range rows {
					j := (i + k) % len(rows)
					d[j] = round(rows[j])
				}
				for j := 1; j < len(rows); j++ {
					over[j] = append(over[j], float64(d[j]-d[0]))
				}
			}
			med := make([]float64, len(rows))
			for j := 1; j < len(rows); j++ {
				slices.Sort(over[j])
				med[j] = over[j][len(over[j])/2]
			}
			b.ReportMetric(med[1], "failsafe-ns")
			b.ReportMetric(med[2], "warm-ns")
			b.ReportMetric(med[3], "new-ns")
			b.ReportMetric(med[4], "count-ns")
			b.ReportMetric(med[2]/med[1], "warm÷failsafe")
			b.ReportMetric(med[3]/med[1], "new÷failsafe")
			b.ReportMetric(med[4]/med[1], "count÷failsafe")
		})
	}
}

// sendOnce sends body through rt and reads and closes the answer.
func sendOnce(rt http.RoundTripper, body []byte) error {
	req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", bytes.NewReader(body))
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}
