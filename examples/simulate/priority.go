package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/examples/simulate/simfleet"
)

// The priority mode: a batch flood and a trickle of interactive requests
// share one upstream under one RPM limit (us-east's fast model; every
// request is routed to it), on the simulated clock, so the limit counts
// simulated minutes. The mode takes the workload's first priorityRequests
// requests. The flood is those but every interactiveEvery-th, sent by the
// -concurrency workers: more than the limit lets through, so the router's
// queue for the upstream's tokens stays long. The trickle is the others,
// sent on their own, evenly spaced over the time the flood takes. Before
// either starts, small warm-up calls (not counted) spend the upstream's
// first minute of quota, so the flood meets the limit from its first
// request, as a job does that starts while others use the upstream. The
// mode runs twice on a fresh fleet: without priorities (the queue is first
// come, first served), then with X-Relay-Priority: batch on the flood,
// interactive on the trickle. Limits.MaxWait is long enough that no
// request is shed.

// interactiveEvery: every interactiveEvery-th request of the workload is
// interactive.
const interactiveEvery = 20

// priorityRequests caps the requests of the priority mode: its run lasts
// as long as the limit takes to let them through, and one upstream's limit
// must stay well under what the upstream serves.
const priorityRequests = 400

// priorityRPM is the upstream's RPM limit for n requests: twice n, at most
// 400 (under 7 requests per simulated second, about half of what the
// upstream's four shards serve), so that the limit lets the flood through
// in half a simulated minute to a minute, whatever n.
func priorityRPM(n int) int { return min(max(2*n, 3), 400) }

// priorityResult is what the priority mode's row adds: the limit, the
// traffic, and each run's waits by class.
type priorityResult struct {
	Upstream    string        `json:"upstream"`
	RPM         int           `json:"rpm"`
	Interactive int           `json:"interactive_requests"`
	Batch       int           `json:"batch_requests"`
	Workers     int           `json:"workers"`            // sending the flood
	GapMs       float64       `json:"interactive_gap_ms"` // between interactive requests, wall-clock
	Runs        []priorityRun `json:"runs"`               // without priorities, then with
}

// priorityRun is one run of the priority mode.
type priorityRun struct {
	Prioritized bool       `json:"prioritized"`
	Interactive classStats `json:"interactive"`
	Batch       classStats `json:"batch"`
	// AheadOf is how many batch requests, started before it, the median
	// interactive request reached the upstream ahead of.
	AheadOf int `json:"interactive_ahead_of_batch"`
}

// classStats are one class's waits (time in the router's queue for the
// upstream's tokens, Hooks.OnWait) and latencies, wall-clock ms, and its
// failures.
type classStats struct {
	WaitP50ms float64 `json:"wait_p50_ms"`
	WaitP99ms float64 `json:"wait_p99_ms"`
	P50ms     float64 `json:"p50_ms"`
	P99ms     float64 `json:"p99_ms"`
	Failed    int     `json:"failed"`
}

// classLog collects one class's waits and latencies.
type classLog struct {
	mu        sync.Mutex
	waits     []time.Duration // simulated
	latencies []time.Duration // wall-clock
	failed    int
}

func (l *classLog) stats() classStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	w, lat := slices.Sorted(slices.Values(l.waits)), slices.Sorted(slices.Values(l.latencies))
	return classStats{WaitP50ms: ms(scaled(quantile(w, 0.5))), WaitP99ms: ms(scaled(quantile(w, 0.99))),
		P50ms: ms(quantile(lat, 0.5)), P99ms: ms(quantile(lat, 0.99)), Failed: l.failed}
}

// waitKey keys a request's wait counter in its context.
type waitKey struct{}

// onWait adds a wait to the counter of the request it belongs to.
func onWait(ev relay.WaitEvent) {
	if n, ok := ev.Context.Value(waitKey{}).(*atomic.Int64); ok {
		n.Add(int64(ev.Wait))
	}
}

// classSender sends through r with X-Relay-Priority set to prio (none when
// ""), logging each request's wait and latency in l, and its place in ord.
func classSender(r *relay.Router, prio string, interactive bool, l *classLog, ord *order) *sender {
	return &sender{close: func() {}, do: func(ctx context.Context, q *request) error {
		waited := new(atomic.Int64)
		ctx = context.WithValue(ctx, waitKey{}, waited)
		ctx = context.WithValue(ctx, placeKey{}, &place{interactive: interactive, started: ord.started.Add(1)})
		pq := *q
		pq.priority = prio
		start := time.Now()
		status, err := sendStatus(ctx, r, &pq)
		l.mu.Lock()
		l.waits = append(l.waits, time.Duration(waited.Load()))
		l.latencies = append(l.latencies, time.Since(start))
		if err != nil || status != http.StatusOK { // an answer with a failure status is lost too
			l.failed++
		}
		l.mu.Unlock()
		return err
	}}
}

// order is the order in which a run's requests started and the order in
// which they reached the upstream: which batch requests each interactive
// one went ahead of, whatever the machine's speed.
type order struct {
	started atomic.Int64
	mu      sync.Mutex
	arrived []*place // each request once, by its first call to the upstream
}

// place is one request's class, its rank among the requests started, and
// whether it reached the upstream.
type place struct {
	interactive bool
	started     int64
	arrived     bool
}

// placeKey keys a request's place in its context.
type placeKey struct{}

// orderBase records the first call of each request with a place in its
// context, then sends it.
type orderBase struct {
	next http.RoundTripper
	ord  *order
}

func (b orderBase) RoundTrip(req *http.Request) (*http.Response, error) {
	if p, ok := req.Context().Value(placeKey{}).(*place); ok {
		b.ord.mu.Lock()
		if !p.arrived {
			p.arrived = true
			b.ord.arrived = append(b.ord.arrived, p)
		}
		b.ord.mu.Unlock()
	}
	return b.next.RoundTrip(req)
}

// aheadOf returns, for the median interactive request, how many batch
// requests started before it reached the upstream after it.
func (o *order) aheadOf() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	var ahead []int
	for i, p := range o.arrived {
		if !p.interactive {
			continue
		}
		n := 0
		for _, later := range o.arrived[i+1:] {
			if !later.interactive && later.started < p.started {
				n++
			}
		}
		ahead = append(ahead, n)
	}
	if len(ahead) == 0 {
		return 0
	}
	slices.Sort(ahead)
	return ahead[(len(ahead)-1)/2]
}

// splitPriority splits requests into the flood and the trickle, each
// request a session of its own.
func splitPriority(reqs []request) (flood, trickle [][]request) {
	for i := range reqs {
		s := reqs[i : i+1 : i+1]
		if i%interactiveEvery == interactiveEvery-1 {
			trickle = append(trickle, s)
		} else {
			flood = append(flood, s)
		}
	}
	return flood, trickle
}

// priorityTraffic is the priority mode's traffic: the flood, the trickle,
// the upstream's RPM limit, and the gap between interactive requests
// (simulated).
type priorityTraffic struct {
	flood, trickle [][]request
	rpm            int
	gap            time.Duration
}

// runPriority runs the priority mode: without priorities, then with. Its
// row is the run with priorities; both runs' waits are in its Priority.
func runPriority(o options, m mode, w *workload, stderr io.Writer) (result, simfleet.Config, error) {
	var pt priorityTraffic
	pt.flood, pt.trickle = splitPriority(w.reqs[:min(len(w.reqs), priorityRequests)])
	pt.rpm = priorityRPM(len(pt.flood) + len(pt.trickle))
	// The flood drains at rpm a minute: the trickle is spread over that
	// time.
	drain := time.Duration(float64(len(pt.flood)) / float64(pt.rpm) * float64(time.Minute))
	pt.gap = drain / time.Duration(max(len(pt.trickle), 1))
	pr := &priorityResult{Upstream: "us-east/" + fast, RPM: pt.rpm, Interactive: len(pt.trickle), Batch: len(pt.flood),
		Workers: o.concurrency, GapMs: ms(scaled(pt.gap))}
	var res result
	var cfg simfleet.Config
	for _, prioritized := range []bool{false, true} {
		run, r, c, err := priorityOnce(o, m, w, pt, prioritized, stderr)
		if err != nil {
			return result{}, simfleet.Config{}, err
		}
		pr.Runs = append(pr.Runs, run)
		res, cfg = r, c
	}
	res.Priority = pr
	return res, cfg, nil
}

// warmUpKey marks the context of a warm-up call.
type warmUpKey struct{}

func isWarmUp(ctx context.Context) bool { return ctx != nil && ctx.Value(warmUpKey{}) != nil }

// priorityRouter is the priority mode's router over the rig's fleet: one
// upstream held to rpm, every request routed to it, waits logged in the
// requests' contexts (onWait) and their calls' order in ord, warm-up calls
// left out of the reports; spent is set once a warm-up call had to wait:
// the quota is spent.
func priorityRouter(g *rig, rpm int, spent *atomic.Bool, ord *order) (*relay.Router, error) {
	cfg := relayConfig(g.e, newSimClock())
	cfg.Base = orderBase{next: cfg.Base, ord: ord}
	up, _ := g.fleet.Upstream("us-east", fast)
	cfg.Upstreams = []relay.Upstream{{Name: up.Name, BaseURL: up.URL, Models: []string{fast}, RPM: rpm}}
	cfg.Policy = relay.PolicyFunc(func(relay.Request) relay.Route { return relay.Route{Model: fast} })
	cfg.Limits.MaxWait = callerDeadline / 2
	report := cfg.OnReport
	cfg.OnReport = func(r relay.Report) {
		if !isWarmUp(r.Context) {
			report(r)
		}
	}
	cfg.Hooks.OnWait = func(ev relay.WaitEvent) {
		if isWarmUp(ev.Context) {
			spent.Store(true)
			return
		}
		onWait(ev)
	}
	return relay.New(cfg)
}

// warmUp sends calls asking for one token through r, conc at a time, until
// one had to wait (spent), or 3·rpm were sent.
func warmUp(r *relay.Router, rpm, conc int, spent *atomic.Bool) {
	q := &request{body: fmt.Sprintf(`{"model":%q,"max_tokens":1,"messages":[{"role":"user","content":"warm-up"}]}`, fast)}
	var sent atomic.Int64
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for !spent.Load() && sent.Add(1) <= int64(3*rpm) {
				ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), warmUpKey{}, true), scaled(callerDeadline))
				_ = send(ctx, r, q)
				cancel()
			}
		})
	}
	wg.Wait()
}

// priorityOnce is one run of the priority mode on a fresh fleet.
func priorityOnce(o options, m mode, w *workload, pt priorityTraffic, prioritized bool, stderr io.Writer) (priorityRun, result, simfleet.Config, error) {
	g := newRig(o, w)
	defer g.close()
	var spent atomic.Bool
	var ord order
	r, err := priorityRouter(g, pt.rpm, &spent, &ord)
	if err != nil {
		return priorityRun{}, result{}, simfleet.Config{}, err
	}
	defer r.CloseIdleConnections()
	warmUp(r, pt.rpm, o.concurrency, &spent)
	var batch, inter classLog
	batchPrio, interPrio, name := "", "", m.name+"/fifo"
	if prioritized {
		batchPrio, interPrio, name = "batch", "interactive", m.name
	}
	t := traffic{sessions: pt.flood, conc: o.concurrency, users: len(pt.flood)}
	total := t.total() + len(pt.trickle)
	var done atomic.Int64
	stop := progress(stderr, o.tty, name, total, &done)
	start := time.Now()
	var wg sync.WaitGroup
	wg.Go(func() { sendEvery(pt.trickle, scaled(pt.gap), classSender(r, interPrio, true, &inter, &ord), &done) })
	drive(t, classSender(r, batchPrio, false, &batch, &ord), g.fleet, &done)
	wg.Wait()
	wall := time.Since(start)
	stop()
	res, sc, err := g.result(m, o, &sender{}, wall, o.concurrency, total)
	run := priorityRun{Prioritized: prioritized, Interactive: inter.stats(), Batch: batch.stats(), AheadOf: ord.aheadOf()}
	return run, res, sc, err
}

// sendEvery sends each session's request through snd, one every gap
// (wall-clock), the first after half a gap, each on a goroutine of its
// own, and returns once all are answered; done counts them.
func sendEvery(sessions [][]request, gap time.Duration, snd *sender, done *atomic.Int64) {
	var wg sync.WaitGroup
	next := time.Now().Add(gap / 2)
	for _, s := range sessions {
		time.Sleep(time.Until(next))
		next = next.Add(gap)
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), scaled(callerDeadline))
			defer cancel()
			_ = snd.do(ctx, &s[0]) // failures are in the reports
			done.Add(1)
		})
	}
	wg.Wait()
}

// printPriority prints the priority mode's two runs side by side.
func printPriority(out io.Writer, results []result) {
	i := slices.IndexFunc(results, func(r result) bool { return r.Priority != nil })
	if i < 0 {
		return
	}
	p := results[i].Priority
	fmt.Fprintf(out, "\nPriority: every request to one upstream (%s), held to RPM %d per simulated minute by the router;\n"+
		"the workload's first %d requests: a flood of %d batch requests from %d workers, and a trickle of the %d others\n"+
		"(every %dth, interactive), one every %.1f s of simulated time (%.0f ms); warm-up calls spent the first minute's quota:\n",
		p.Upstream, p.RPM, p.Batch+p.Interactive, p.Batch, p.Workers, p.Interactive, interactiveEvery, p.GapMs/1000/timeScale, p.GapMs)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "priorities\tclass\trequests\twait p50 ms\twait p99 ms\tp50 ms\tp99 ms\tlost\tahead of")
	for _, run := range p.Runs {
		label := "none (FIFO)"
		if run.Prioritized {
			label = "X-Relay-Priority"
		}
		for _, c := range []struct {
			name  string
			n     int
			s     classStats
			ahead string
		}{{"interactive", p.Interactive, run.Interactive, strconv.Itoa(run.AheadOf)}, {"batch", p.Batch, run.Batch, "-"}} {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%d\t%s\n", label, c.name, c.n, c.s.WaitP50ms, c.s.WaitP99ms, c.s.P50ms, c.s.P99ms, c.s.Failed, c.ahead)
			label = ""
		}
	}
	tw.Flush()
	fmt.Fprint(out, "  wait      time in the router's queue for the upstream's RPM tokens (Hooks.OnWait), wall-clock ms (×50 simulated)\n"+
		"  lost      requests that failed (shed by the queue, or any other error)\n"+
		"  ahead of  batch requests that started before an interactive request but reached the upstream after it (median)\n")
}
