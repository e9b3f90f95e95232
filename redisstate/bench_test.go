package redisstate

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/store"
)

// The benchmarks report, per Admit: p50 and p99 latency in µs (from every
// call's time), commands sent (a go-redis hook), EVALSHA calls Redis
// counted and the time it spent in them (INFO commandstats; other clients
// of a shared server add to both).
//
//	go test -run '^$' -bench Admit -benchtime 20000x ./redisstate/

// admitLimits always admit: the longest path of the script (both buckets
// read and written).
var admitLimits = store.Limits{Name: "bench", RPM: 1_000_000_000, TPM: 1_000_000_000}

// BenchmarkAdmit: one caller, loopback redis-server (RELAY_TEST_REDIS).
func BenchmarkAdmit(b *testing.B) {
	be := newReal(b)
	s := be.state(b)
	ctx := context.Background()
	noErr(b, s.Load(ctx))
	be.calls.quiet.Store(true)
	lat := make([]time.Duration, 0, b.N)
	evals := evalshaCalls(b, be)
	sent := be.calls.n.Load()
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		v, err := s.Admit(ctx, admitLimits, store.Ask{Tokens: 500}, start)
		lat = append(lat, time.Since(start))
		if err != nil || !v.Taken {
			b.Fatal(v, err)
		}
	}
	b.StopTimer()
	report(b, lat, be.calls.n.Load()-sent, sub(evalshaCalls(b, be), evals))
}

// BenchmarkAdmitPing is BenchmarkAdmit's baseline: a PING through the
// same client, the least one round trip to Redis costs on this host.
// BenchmarkAdmit's p99 over this one's is what the admission script adds.
//
//	go test -run '^$' -bench 'BenchmarkAdmit(Ping)?$' -benchtime 20000x ./redisstate/
func BenchmarkAdmitPing(b *testing.B) {
	be := newReal(b)
	ctx := context.Background()
	be.calls.quiet.Store(true)
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		err := be.c.Ping(ctx).Err()
		lat = append(lat, time.Since(start))
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	report(b, lat, int64(len(lat)), [2]int64{})
}

// BenchmarkAdmitParallel: 8 callers sharing one client, as the requests
// of one replica do.
func BenchmarkAdmitParallel(b *testing.B) {
	be := newReal(b)
	s := be.state(b)
	ctx := context.Background()
	noErr(b, s.Load(ctx))
	be.calls.quiet.Store(true)
	var mu sync.Mutex
	lat := make([]time.Duration, 0, b.N)
	evals := evalshaCalls(b, be)
	sent := be.calls.n.Load()
	b.SetParallelism(4) // 4 × GOMAXPROCS (2) goroutines
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		for pb.Next() {
			start := time.Now()
			v, err := s.Admit(ctx, admitLimits, store.Ask{Tokens: 500}, start)
			mine = append(mine, time.Since(start))
			if err != nil || !v.Taken {
				b.Error(v, err)
				return
			}
		}
		mu.Lock()
		lat = append(lat, mine...)
		mu.Unlock()
	})
	b.StopTimer()
	report(b, lat, be.calls.n.Load()-sent, sub(evalshaCalls(b, be), evals))
}

// BenchmarkAdmitLocal is the in-process equivalent: store.Local, the
// router's default store.
func BenchmarkAdmitLocal(b *testing.B) {
	l := store.NewLocal()
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		v, _ := l.Admit(ctx, admitLimits, store.Ask{Tokens: 500}, start)
		lat = append(lat, time.Since(start))
		if !v.Taken {
			b.Fatal("refused")
		}
	}
	b.StopTimer()
	report(b, lat, 0, [2]int64{})
}

func report(b *testing.B, lat []time.Duration, sent int64, evals [2]int64) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	q := func(p float64) float64 {
		return float64(lat[min(int(p*float64(len(lat))), len(lat)-1)]) / float64(time.Microsecond)
	}
	b.ReportMetric(q(0.50), "p50-µs")
	b.ReportMetric(q(0.99), "p99-µs")
	b.ReportMetric(float64(sent)/float64(len(lat)), "cmds/op")
	b.ReportMetric(float64(evals[0])/float64(len(lat)), "evalsha/op")
	if evals[0] > 0 {
		b.ReportMetric(float64(evals[1])/float64(evals[0]), "redis-µs/op")
	}
}

// evalshaCalls returns the EVALSHA calls Redis has counted and the
// microseconds it spent in them (INFO commandstats); 0 if it does not say.
func evalshaCalls(b *testing.B, be *backend) [2]int64 {
	info, err := be.c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:")
		if !ok {
			continue
		}
		var out [2]int64
		for _, f := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "calls":
				out[0], _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				out[1], _ = strconv.ParseInt(v, 10, 64)
			}
		}
		return out
	}
	return [2]int64{}
}

func sub(a, b [2]int64) [2]int64 { return [2]int64{a[0] - b[0], a[1] - b[1]} }

// BenchmarkRouterShared is one request through a router whose upstream
// has RPM and TPM limits (and a budget, in the rows that say so), with
// its State on the real redis-server, beside the same router with
// in-process state: the latency of the whole request (the upstream
// answers from memory), and the round trips each request makes to Redis,
// by script. The difference between a redis row and its in-process row
// is what the shared State adds to a request.
//
//	go test -run '^$' -bench RouterShared -benchtime 5000x ./redisstate/
func BenchmarkRouterShared(b *testing.B) {
	for _, budget := range []bool{false, true} {
		for _, shared := range []bool{false, true} {
			name := map[bool]string{false: "in-process", true: "redis"}[shared]
			if budget {
				name += "+budget"
			}
			b.Run(name, func(b *testing.B) {
				be := newReal(b)
				var st store.State
				if shared {
					s := be.state(b)
					noErr(b, s.Load(context.Background()))
					st = s
				}
				cfg := relay.Config{Base: newFleetBase(newFleetClock()), State: st, Replicas: 4,
					Prices:    map[string]relay.Price{"m": {InputPerMTok: 1, OutputPerMTok: 1}},
					Upstreams: []relay.Upstream{{Name: "a", BaseURL: "http://a.test/v1", RPM: 1 << 30, TPM: 1 << 30}}}
				if budget {
					cfg.Budgets = []relay.Budget{{Name: "cap", Limit: 1e9, Window: relay.Window{Every: time.Hour}}}
				}
				r, err := relay.New(cfg)
				if err != nil {
					b.Fatal(err)
				}
				be.calls.mu.Lock()
				be.calls.names = nil
				be.calls.mu.Unlock()
				evals := evalshaCalls(b, be)
				sent := be.calls.n.Load()
				lat := make([]time.Duration, 0, b.N)
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					start := time.Now()
					if _, err := send(r, "hello "+strconv.Itoa(i)); err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(start))
				}
				b.StopTimer()
				report(b, lat, be.calls.n.Load()-sent, sub(evalshaCalls(b, be), evals))
				if shared {
					be.calls.mu.Lock()
					byName := map[string]float64{}
					for _, n := range be.calls.names {
						byName[n]++
					}
					be.calls.mu.Unlock()
					for n, c := range byName {
						b.ReportMetric(c/float64(len(lat)), n+"/op")
					}
					if f := r.StateFallbacks(); f > 0 {
						b.Fatalf("%d State calls fell back", f)
					}
				}
			})
		}
	}
}

// BenchmarkRefusal is the time a request takes to be refused when its
// turn in its upstream's queue cannot come within MaxWait: the fleet's
// minute of RPM 60 is spent, two requests wait (their turns at 1 and 2
// s), and with MaxWait 1.5 s every other request is refused at once, with
// no call to the State.
//
//	go test -run '^$' -bench Refusal -benchtime 2000x ./redisstate/
func BenchmarkRefusal(b *testing.B) {
	for _, shared := range []bool{false, true} {
		b.Run(map[bool]string{false: "in-process", true: "redis"}[shared], func(b *testing.B) {
			be := newReal(b)
			s := be.state(b)
			var st store.State
			if shared {
				st = s
			}
			r, err := relay.New(relay.Config{Base: newFleetBase(newFleetClock()), State: st, Replicas: 4,
				Limits:    relay.Limits{MaxWait: 1500 * time.Millisecond},
				Upstreams: []relay.Upstream{{Name: "a", BaseURL: "http://a.test/v1", RPM: 60}}})
			if err != nil {
				b.Fatal(err)
			}
			for range 60 { // the minute's quota
				if _, err := send(r, "spend"); err != nil {
					b.Fatal(err)
				}
			}
			waiters := sendAll(r, 2)
			time.Sleep(100 * time.Millisecond)
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				start := time.Now()
				if _, err := send(r, "refused "+strconv.Itoa(i)); !errors.Is(err, relay.ErrRateLimited) {
					b.Fatalf("%v, want ErrRateLimited", err)
				}
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			report(b, lat, 0, [2]int64{})
			for range 2 {
				<-waiters
			}
		})
	}
}
