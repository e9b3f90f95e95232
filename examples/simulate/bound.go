package main

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/examples/simulate/simfleet"
	"github.com/tokenrelay/relay/internal/prompt"
)

// The unloaded lower bound of a policy's p99: the latency each request of
// the workload would have if it were served alone, on the model path the
// policy routes it to, straight from the fleet's service-time model
// (simfleet.Model.AnswerTime, scaled by the fleet's TimeScale), with
// the best case of the prefix cache:
//
//   - no queue: the request finds its shard idle;
//   - no fault: no stall, no dark region, no retry and no hedge; the path
//     is the policy's route (ClusterPolicy gives long prompts no other);
//   - the cache: the request's prompt is cached as far as it shares whole
//     blocks of the canonical prompt with any other request of the
//     workload, as if one cache of unbounded size on its path had seen
//     every other request (whatever path served it, in whatever order). A
//     prefix cache holds prompts the fleet was sent, so no cache can hold
//     more of a request's prompt than that.
//
// No request can be answered sooner than its bound, whatever the routing
// among the upstreams of its model and the order of the requests (unless
// it is sent again to a path that already served it, where a retry or a
// hedge would find its own prompt cached; cluster-aware retries elsewhere
// and does not hedge), so the p99 of the bounds is a lower bound of the
// p99 of any run that keeps the policy's choice of model and answers every
// request (the p99 of the latencies is at least the p99 of any smaller
// values, request by request). A failed request is not answered: it enters
// a mode's p99 with the time it took to fail, which may be less than its
// bound, so a run with failures can read under the bound. Router and
// loopback overheads are left out, which only lowers the bound.

// unloaded is one request's bound.
type unloaded struct {
	model          string // the policy's model
	prompt, cached int    // prompt tokens and the best-case cached tokens
	output         int
	stream         bool
	time           time.Duration // wall-clock time: AnswerTime × TimeScale
}

// unloadedTimes returns the bound of every request of w, in order, on the
// fleet cfg describes (its models, block size and time scale), for the
// model each request's route picks under policy.
func unloadedTimes(w *workload, cfg simfleet.Config, policy relay.Policy) ([]unloaded, error) {
	var ups []relay.Upstream
	for _, m := range cfg.Models {
		ups = append(ups, relay.Upstream{Name: m.Name, BaseURL: "http://sim.invalid/v1", Models: []string{m.Name}})
	}
	r, err := relay.New(relay.Config{Upstreams: ups, Policy: policy})
	if err != nil {
		return nil, err
	}
	n := len(w.reqs)
	out := make([]unloaded, n)
	// The best case of the cache: the longest prefix a request shares with
	// a request before it (a cache that saw them all, in order) or with one
	// after it (the same, in reverse order).
	blocks := 1
	for _, q := range w.reqs {
		blocks += len(prompt.AppendCanonical(nil, endpointOf(q), q.body, math.MaxInt)) / cfg.BlockBytes
	}
	fwd, back := simfleet.NewPrefixCache(blocks, cfg.BlockBytes), simfleet.NewPrefixCache(blocks, cfg.BlockBytes)
	for i := range n {
		q := &w.reqs[i]
		out[i].prompt, out[i].cached = fwd.Serve(endpointOf(*q), []byte(q.body))
	}
	for i := n - 1; i >= 0; i-- {
		q := &w.reqs[i]
		_, c := back.Serve(endpointOf(*q), []byte(q.body))
		out[i].cached = max(out[i].cached, c)
	}
	for i := range n {
		q, u := &w.reqs[i], &out[i]
		d, err := decideBody(r, q, q.body)
		if err != nil {
			return nil, err
		}
		u.model = d.Route.Model
		if u.model == "" {
			u.model = d.Request.Model
		}
		j := slices.IndexFunc(cfg.Models, func(m simfleet.Model) bool { return m.Name == u.model })
		if j < 0 {
			return nil, fmt.Errorf("the fleet serves no %s", u.model)
		}
		u.output, u.stream = q.output, q.stream
		u.time = time.Duration(float64(cfg.Models[j].AnswerTime(u.prompt, u.cached, u.output, u.stream)) * cfg.TimeScale)
	}
	return out, nil
}

// unloadedP99 is the p99 of the bounds of w's requests (see unloadedTimes).
func unloadedP99(w *workload, cfg simfleet.Config, policy relay.Policy) (time.Duration, error) {
	us, err := unloadedTimes(w, cfg, policy)
	if err != nil {
		return 0, err
	}
	ts := make([]time.Duration, len(us))
	for i, u := range us {
		ts[i] = u.time
	}
	slices.Sort(ts)
	return quantile(ts, 0.99), nil
}

// addBound sets the unloaded bound of the cluster-aware row of a run of
// the batch workload on the simulated fleet cfg describes.
func addBound(o options, cfg simfleet.Config, w *workload, results []result) error {
	i := slices.IndexFunc(results, func(r result) bool { return r.Mode == "cluster-aware" })
	if i < 0 || o.replay != "" || o.baseURL != "" || o.workload != "batch" || len(cfg.Models) == 0 {
		return nil
	}
	// The cluster-aware mode's own policy, from the constructor it runs.
	policy := clusterPolicy(false)(&env{fast: o.fast, cheap: o.cheap})
	p99, err := unloadedP99(w, cfg, policy)
	if err != nil {
		return err
	}
	results[i].UnloadedP99ms = ms(p99)
	return nil
}
