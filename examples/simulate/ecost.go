package main

import (
	"context"
	"math"
	"net/http"
	"slices"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/internal/bpe"
)

// The expected-cost mode and its figures: how close the router's
// predicted cached tokens come to those the fleet reported, and the cache
// hits on a conversation's history (the prompt past its system prompt).

// simCacheRules are the fleet's caching rules as relay.CacheRules: the
// fleet caches any prefix of whole 64-byte blocks (about 16 tokens), its
// reported tokens are exact, and nothing expires but by eviction (the
// runs take under a minute).
var simCacheRules = relay.CacheRules{MinTokens: 16, Step: 1}

// ecostLoadFactor is the expected-cost mode's Config.LoadFactor (unless
// -load-factor sets one): a request leaves the upstream that holds its
// conversation only when that one holds twice the average in flight.
const ecostLoadFactor = 2

// expectedCost sends through one Router under StrategyExpectedCost, the
// upstreams told the fleet's caching rules.
func expectedCost(e *env) (*sender, error) {
	cfg := relayConfig(e, nil)
	cfg.Strategy, cfg.LoadFactor = relay.StrategyExpectedCost, e.loadFactor
	if cfg.LoadFactor == 0 {
		cfg.LoadFactor = ecostLoadFactor
	}
	for _, u := range e.all {
		u.Cache = simCacheRules
		cfg.Upstreams = append(cfg.Upstreams, u)
	}
	r, err := relay.New(cfg)
	if err != nil {
		return nil, err
	}
	s := routed(r)
	s.finish = func(res *result, reports []relay.Report) { res.PredictErrPct = predictErrPct(reports) }
	return s, nil
}

// predictErrPct is the median of |Report.PredictedCached −
// Usage.CachedTokens| over the answered requests, as a percentage of their
// prompt tokens.
func predictErrPct(reports []relay.Report) float64 {
	var errs []float64
	for _, r := range reports {
		if r.Err != nil || r.StatusCode != http.StatusOK || r.Usage.PromptTokens == 0 {
			continue
		}
		d := math.Abs(float64(r.PredictedCached - r.Usage.CachedTokens))
		errs = append(errs, 100*d/float64(r.Usage.PromptTokens))
	}
	if len(errs) == 0 {
		return 0
	}
	slices.Sort(errs)
	return round(errs[len(errs)/2], 2)
}

// systemKey carries a request's system-prompt tokens in its context, for
// its report.
type systemKey struct{}

// withRequest returns ctx carrying what the figures need of q.
func withRequest(ctx context.Context, q *request) context.Context {
	if q.system == 0 {
		return ctx
	}
	return context.WithValue(ctx, systemKey{}, q.system)
}

// systemTokens are the tokens of a chat request's system message as the
// fleet's cache counts them in the canonical prompt: the role's line, the
// content, its end of line.
func systemTokens(content string) int {
	return bpe.O200K().Count("system\n" + content + "\n")
}

// historyHitPct is the share of the history tokens (prompt tokens past the
// system prompt) that were cached, over the answered requests that carry
// a system prompt; 0 when none does.
func historyHitPct(reports []relay.Report) float64 {
	var hist, hit int
	for _, r := range reports {
		if r.Err != nil || r.StatusCode != http.StatusOK || r.Context == nil {
			continue
		}
		sys, _ := r.Context.Value(systemKey{}).(int)
		if sys == 0 {
			continue
		}
		hist += max(r.Usage.PromptTokens-sys, 0)
		hit += max(r.Usage.CachedTokens-sys, 0)
	}
	if hist == 0 {
		return 0
	}
	return round(100*float64(hit)/float64(hist), 1)
}

// ecostTargets are the expected-cost mode's targets on the chat and agent
// workloads: its prediction within 10% of the prompt (median), input cost
// at least 25% below affinity's, at a p99 no worse.
func ecostTargets(results []result) (ts []target) {
	ec, okE := modeRow(results, "expected-cost")
	af, okA := modeRow(results, "affinity")
	if !okE {
		return nil
	}
	ts = append(ts, target{what: "expected-cost predicted cached tokens, median |error| / prompt tokens", value: ec.PredictErrPct, bound: 10, atMost: true, unit: "%", prec: 1})
	if okA {
		ts = append(ts,
			target{what: "expected-cost input $/1k req / affinity", value: ec.InputPer1kReq / af.InputPer1kReq, bound: 0.75, atMost: true, unit: "×", prec: 2},
			target{what: "expected-cost p99 / affinity p99", value: ec.P99ms / af.P99ms, bound: 1, atMost: true, unit: "×", prec: 2})
	}
	return ts
}
