package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay"
)

// TestBudgetMode runs the budget mode beside cluster-aware on a short
// batch run: unbudgeted, the run spends more than the budget; budgeted, the
// ledger stops at the limit, long prompts go cheap past the threshold, and
// the last requests are refused, each failure a refusal.
func TestBudgetMode(t *testing.T) {
	rows := runJSON(t, "-requests", "240", "-concurrency", "16", "-modes", "cluster-aware,budget")
	ca, bm := rows["cluster-aware"], rows["budget"]
	assert.Nil(t, ca.Budget, "only the budget mode has a budget")
	b := bm.Budget
	require.NotNil(t, b)
	w := newWorkload(1, 240)
	limit, share := budgetLimit(w, simPrices())
	assert.Equal(t, limit, b.LimitUSD)
	assert.Equal(t, budgetShares["batch"], share)
	assert.Greater(t, ca.CostUSD, b.LimitUSD, "without the budget the run costs more than its limit")

	assert.LessOrEqual(t, b.SpentUSD, b.LimitUSD, "settled spend stays within the limit")
	assert.Greater(t, b.SpentUSD, 0.9*b.LimitUSD, "the budget was spent")
	assert.InDelta(t, bm.CostUSD, b.SpentUSD, 1e-3*b.LimitUSD, "the ledger holds what the reports cost")
	assert.Zero(t, b.ReservedUSD, "every reservation was settled")
	assert.Greater(t, b.Refused, 0, "refusals once spent")
	assert.LessOrEqual(t, b.Refused, bm.Failed, "a refusal is a failure")
	if simTargets { // a request may also time out on a loaded host
		assert.Equal(t, b.Refused, bm.Failed, "every failure is a refusal")
	}
	assert.Greater(t, b.CheapPast, 0, "long prompts moved to the cheap model past the threshold")
	assert.Greater(t, b.FirstRefusal, 0.5, "refusals come late in the run")
	assert.Less(t, bm.AttemptsPerReq, ca.AttemptsPerReq, "a refused request calls no upstream")
	assert.Contains(t, bm.About, "limit $")
}

// TestBudgetCounts classifies reports: a refusal, a downgrade, a long
// prompt the policy sent cheap, and what counts as none of these.
func TestBudgetCounts(t *testing.T) {
	refused := &relay.Error{Op: "admit", Budget: budgetName, Err: relay.ErrBudgetExceeded}
	reports := []relay.Report{
		{RequestedModel: flagship, Model: fast, Bucket: relay.BucketMid, StatusCode: 200},
		{RequestedModel: flagship, Model: cheap, Bucket: relay.BucketLong, StatusCode: 200},                                     // cheap past the threshold
		{RequestedModel: flagship, Model: cheap, Bucket: relay.BucketLong, StatusCode: 200, Constraint: relay.ConstraintBudget}, // Downgrade
		{RequestedModel: flagship, Model: cheap, Bucket: relay.BucketMid, StatusCode: 200},                                      // cluster-aware's own
		{RequestedModel: flagship, Model: cheap, Bucket: relay.BucketLong, StatusCode: 503},                                     // failed
		{RequestedModel: flagship, Model: flagship, Err: refused, Budget: budgetName},
	}
	b := budgetCounts(reports, cheap)
	assert.Equal(t, budgetResult{Refused: 1, Downgraded: 1, CheapPast: 1, FirstRefusal: 1}, b)

	var out bytes.Buffer
	b.LimitUSD, b.SpentUSD = 0.5, 0.4987
	printSpend(&out, []result{{Mode: "cluster-aware", Requests: 6, CostUSD: 0.9}, {Mode: "budget", Requests: 6, CostUSD: 0.4987, Budget: &b}})
	containsAll(t, out.String(),
		"mode           requests  spent $  budget $  ledger $  refused    downgraded  cheap past 50%\n",
		"cluster-aware  6         0.9000   -         -         -          -           -\n",
		"budget         6         0.4987   0.5000    0.4987    1 (16.7%)  1           1\n",
		"  cheap past 50%  long prompts ClusterPolicy.CheapWhenSpent sent to the cheap model once 50% of the budget was spent")

	out.Reset()
	printSpend(&out, []result{{Mode: "cluster-aware"}})
	assert.Empty(t, out.String(), "no budget, no spend table")
}

func TestFlagshipWorstCase(t *testing.T) {
	w := &workload{name: "batch", reqs: []request{{prompt: 1000, output: 100}, {prompt: 3000, output: 0}}}
	p := simPrices()[flagship]
	want := (4000*p.InputPerMTok + 100*p.OutputPerMTok) / 1e6
	assert.InDelta(t, want, flagshipWorstCase(w, simPrices()), 1e-12)
	limit, share := budgetLimit(w, simPrices())
	assert.InDelta(t, sig(share*want, 3), limit, 1e-12)
	w.name = "replay"
	_, share = budgetLimit(w, simPrices())
	assert.Equal(t, defaultBudgetShare, share)
}
