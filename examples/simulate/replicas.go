package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/redisstate"
)

// The replicas comparison (-replicas N): N routers, one per simulated
// replica of a service, share one fleet whose upstreams enforce RPM and TPM
// limits (gate). Every router knows the limits (Upstream.RPM, TPM), routes
// as cluster-aware does and waits up to a simulated minute for tokens
// (Limits.MaxWait); requests go to the replicas in turn. It runs twice:
// with per-process state (Config.State nil: each replica holds each
// upstream to the whole limit, so together they send up to N times it, and
// the upstreams answer the excess 429), then with the limits shared on
// Redis (redisstate, Config.Replicas N: while Redis does not answer, each
// replica falls back to 1/N of the limits).

// State timeouts: the embedded server (miniredis) runs every script through
// a Lua interpreter written in Go, under one lock, so a call can take a few
// milliseconds on a loaded machine; a real server answers in well under
// one.
const (
	embeddedStateTimeout = 50 * time.Millisecond
	redisStateTimeout    = 20 * time.Millisecond
)

// replicaLimits are each upstream's RPM and TPM for a workload sent by conc
// workers: RPM a twentieth of its requests, and at least twice conc; TPM
// that RPM times the workload's mean TPM charge (prompt + max tokens). On
// the batch workload, cluster-aware routing sends about 18% of the
// requests to each fast-model upstream, over three times its RPM: what a
// run shows is what the replicas do when the limits bind. With the limits
// shared, every request still goes through within MaxWait: the overflow
// waits (at twice conc, the requests waiting for one upstream's tokens
// wait half a minute at most), or goes to the fallback model's upstreams.
func replicaLimits(w *workload, conc int) (rpm, tpm int) {
	rpm = max(len(w.reqs)/20, 2*conc)
	charge := 0
	for _, q := range w.reqs {
		charge += q.prompt + q.output
	}
	return rpm, max(rpm*charge/max(len(w.reqs), 1), 1000)
}

// replicasResult is what a row of the replicas comparison adds.
type replicasResult struct {
	Replicas       int            `json:"replicas"`
	State          string         `json:"state"`             // "per-process" or "shared"
	Backend        string         `json:"backend,omitempty"` // the Redis of the shared state
	StateTimeoutMs float64        `json:"state_timeout_ms,omitempty"`
	StateFallbacks uint64         `json:"state_fallbacks"` // Router.StateFallbacks, summed over the replicas
	Minutes        float64        `json:"simulated_minutes"`
	Rejected       int            `json:"rate_429s"` // calls the upstreams answered 429 for their limits
	PeakOfLimit    float64        `json:"peak_of_limit"`
	Upstreams      []upstreamLoad `json:"upstreams"`
}

// runReplicas runs the replicas comparison: per-process state, then shared.
func runReplicas(o options, w *workload, stderr io.Writer) ([]result, error) {
	var out []result
	for _, shared := range []bool{false, true} {
		m := mode{name: "replicas/per-process", newSender: replicated(o, shared)}
		if shared {
			m.name = "replicas/shared"
		}
		res, _, err := runMode(o, m, w, stderr)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", m.name, err)
		}
		out = append(out, res)
	}
	return out, nil
}

// replicated builds the o.replicas routers of one run of the comparison.
func replicated(o options, shared bool) func(e *env) (*sender, error) {
	return func(e *env) (*sender, error) {
		clock := newSimClock()
		rpm, tpm := replicaLimits(e.w, o.concurrency)
		gt := newGate(simHints{e.base}, clock, e.all, rpm, tpm)
		rr := &replicasResult{Replicas: o.replicas, State: "per-process"}
		var st *sharedState
		if shared {
			var err error
			if st, err = openState(o.redis, clock); err != nil {
				return nil, err
			}
			rr.State, rr.Backend, rr.StateTimeoutMs = "shared", st.backend, ms(st.timeout)
		}
		routers := make([]*relay.Router, o.replicas)
		for i := range routers {
			cfg := relayConfig(e, clock)
			cfg.Base, cfg.Strategy = gt, relay.StrategyAffinity
			cfg.Policy = relay.ClusterPolicy{Fast: e.fast, Cheap: e.cheap}
			cfg.Limits.MaxWait = time.Minute
			for _, u := range e.all {
				u.RPM, u.TPM = rpm, tpm
				cfg.Upstreams = append(cfg.Upstreams, u)
			}
			if st != nil {
				cfg.State, cfg.StateTimeout, cfg.Replicas = st.state, st.timeout, o.replicas
			}
			r, err := relay.New(cfg)
			if err != nil {
				st.Close()
				return nil, err
			}
			routers[i] = r
		}
		s := replicaSender(routers)
		s.close = func() {
			for _, r := range routers {
				r.CloseIdleConnections()
			}
			st.Close()
		}
		s.finish = func(res *result, _ []relay.Report) {
			rr.Minutes = round(clock.Now().Sub(simEpoch).Minutes(), 2)
			for _, r := range routers {
				rr.StateFallbacks += r.StateFallbacks()
			}
			rr.Upstreams = gt.loads(e.all, rr.Minutes)
			for _, l := range rr.Upstreams {
				rr.Rejected += l.Rejected
				rr.PeakOfLimit = max(rr.PeakOfLimit, l.OfRPM, l.OfTPM)
			}
			res.Replicas = rr
			res.About = replicasAbout(rr, rpm, tpm)
		}
		return s, nil
	}
}

func replicasAbout(rr *replicasResult, rpm, tpm int) string {
	if rr.State == "shared" {
		return fmt.Sprintf("%d routers sharing Upstream.RPM %d and TPM %d on %s (Config.State, Replicas %d, StateTimeout %.0f ms)",
			rr.Replicas, rpm, tpm, rr.Backend, rr.Replicas, rr.StateTimeoutMs)
	}
	return fmt.Sprintf("%d routers, each holding every upstream to Upstream.RPM %d and TPM %d on its own (Config.State nil)", rr.Replicas, rpm, tpm)
}

// replicaSender sends the requests to the routers in turn.
func replicaSender(routers []*relay.Router) *sender {
	var next atomic.Uint64
	return &sender{do: func(ctx context.Context, q *request) error {
		return send(ctx, routers[(next.Add(1)-1)%uint64(len(routers))], q)
	}}
}

// sharedState is the replicas' State on Redis.
type sharedState struct {
	state   *redisstate.State
	backend string        // what it runs on, for the table
	timeout time.Duration // Config.StateTimeout
	client  *redis.Client
	mini    *miniredis.Miniredis // the embedded server; nil on a real one
	prefix  string
}

// openState opens a State on the Redis at addr, or on an embedded
// miniredis when addr is "", under a key prefix of its own, and checks
// that the server answers. Keys live by the simulated clock.
func openState(addr string, clock *simClock) (*sharedState, error) {
	s := &sharedState{prefix: fmt.Sprintf("simulate-%d-%d", os.Getpid(), time.Now().UnixNano()),
		backend: "redis at " + addr, timeout: redisStateTimeout}
	if addr == "" {
		s.mini = miniredis.NewMiniRedis()
		if err := s.mini.Start(); err != nil {
			return nil, fmt.Errorf("embedded redis: %w", err)
		}
		addr, s.backend, s.timeout = s.mini.Addr(), "miniredis (embedded)", embeddedStateTimeout
	}
	s.client = redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, DialerRetries: 1, MaxRetries: -1})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := s.client.Ping(ctx).Err(); err != nil {
		s.Close()
		return nil, fmt.Errorf("no Redis answers at %s: %w", addr, err)
	}
	s.state = redisstate.New(s.client, redisstate.WithPrefix(s.prefix))
	return s, nil
}

// Close deletes the run's keys and closes the client and the embedded
// server. A nil sharedState is closed already.
func (s *sharedState) Close() {
	if s == nil {
		return
	}
	if s.state != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		deleteKeys(ctx, s.client, s.prefix)
		cancel()
	}
	s.client.Close()
	if s.mini != nil {
		s.mini.Close()
	}
}

// deleteKeys deletes every key of the State prefix and returns how many
// are left (0 unless Redis failed).
func deleteKeys(ctx context.Context, c *redis.Client, prefix string) int {
	match := "{relay:" + prefix + ":*"
	var keys []string
	it := c.Scan(ctx, 0, match, 500).Iterator()
	for it.Next(ctx) {
		keys = append(keys, it.Val())
	}
	for chunk := range slices.Chunk(keys, 500) {
		c.Del(ctx, chunk...)
	}
	left, _ := c.Keys(ctx, match).Result()
	return len(left)
}

// printReplicas prints the replicas comparison: a row per run, then what
// each upstream received against its limits.
func printReplicas(out io.Writer, results []result) {
	var rows []result
	for _, r := range results {
		if r.Replicas != nil {
			rows = append(rows, r)
		}
	}
	if len(rows) == 0 {
		return
	}
	rr := rows[0].Replicas
	fmt.Fprintf(out, "\nReplicas: %d routers, one per simulated replica, over one fleet whose upstreams enforce RPM %d and TPM %d\n"+
		"per simulated minute, as a provider does (token buckets of a minute's quota; a call over either: 429 + retry-after-ms,\n"+
		"not served). Each router: cluster-aware routing, those limits in Upstream.RPM and TPM, MaxWait 1 simulated minute,\n"+
		"on the simulated clock; requests go to the replicas in turn.\n", rr.Replicas, rr.Upstreams[0].RPM, rr.Upstreams[0].TPM)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "state\tp50 ms\tp99 ms\tsuccess %\tattempts/req\tupstream 429s\tpeak × limit\tstate fallbacks\tsimulated min")
	for _, r := range rows {
		x := r.Replicas
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.2f\t%.3f\t%d\t%.2f\t%d\t%.2f\n", replicaLabel(x), r.P50ms, r.P99ms, r.SuccessPct,
			r.AttemptsPerReq, x.Rejected, x.PeakOfLimit, x.StateFallbacks, x.Minutes)
	}
	tw.Flush()
	for _, r := range rows {
		x := r.Replicas
		fmt.Fprintf(out, "\nWhat each upstream received, %s: %.2f simulated minutes, in which the limits let through\n"+
			"%.1f calls/min and %.0f tokens/min:\n",
			replicaLabel(x), x.Minutes, allowedPerMin(x.Upstreams[0].RPM, x.Minutes), allowedPerMin(x.Upstreams[0].TPM, x.Minutes))
		tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "upstream\tcalls/min\t× RPM\ttokens/min\t× TPM\t429s")
		for _, l := range x.Upstreams {
			fmt.Fprintf(tw, "%s\t%.1f\t%.2f\t%.0f\t%.2f\t%d\n", l.Name, l.CallsPerMin, l.OfRPM, l.TokensPerMin, l.OfTPM, l.Rejected)
		}
		tw.Flush()
	}
	fmt.Fprint(out, replicasLegend)
}

// allowedPerMin is what a limit lets through per minute, on average, over
// a run of minutes: its bucket starts with a minute's quota, then refills
// at the limit per minute.
func allowedPerMin(limit int, minutes float64) float64 {
	return float64(limit) * (1 + minutes) / minutes
}

func replicaLabel(x *replicasResult) string {
	if x.State == "shared" {
		return fmt.Sprintf("shared on %s", x.Backend)
	}
	return "per-process (State nil)"
}

// replicasLegend explains the replicas tables.
const replicasLegend = `  upstream 429s    calls the upstreams answered 429 because the replicas together went over a limit
  × RPM, × TPM     calls (tokens) an upstream received ÷ what its limit lets through over the run: a minute's
                   quota to start with (the bucket is full), then the limit per minute; over 1: the replicas
                   together sent more than the limit
  peak × limit     the largest × RPM or × TPM of any upstream
  state fallbacks  calls to the shared State that failed or timed out (Router.StateFallbacks, all replicas):
                   those decisions fell back to in-process limits of 1/N each
`
