package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"text/tabwriter"
	"time"

	"github.com/tokenrelay/relay"
)

// The budget mode: cluster-aware routing under a relay.Budget that the
// workload outspends. Past cheapWhenSpent of the limit the policy sends
// long prompts to the cheap model (ClusterPolicy.CheapWhenSpent); a request
// whose worst-case cost no longer fits goes to the cheap model
// (Budget.Downgrade); once even that does not fit, requests are refused
// with relay.ErrBudgetExceeded and no upstream is called.

// budgetShares size the budget per workload: this share of the workload's
// worst case on the flagship (see flagshipWorstCase), chosen so that the
// budget runs out in the last sixth or so of a run at the default settings.
// Cluster-aware routing spends about a third of that worst case on the
// batch workload (the window goes to the fast model, cached prompts cost
// less, answers are shorter than max_tokens), and much less on the chat
// and agent workloads, whose long prompts go to the cheap model once
// CheapWhenSpent applies. Other workloads (a replay) get defaultBudgetShare.
var budgetShares = map[string]float64{"batch": 0.21, "chat": 0.08, "agent": 0.16}

const defaultBudgetShare = 0.2

// cheapWhenSpent is the budget mode's ClusterPolicy.CheapWhenSpent.
const cheapWhenSpent = 0.5

// budgetName names the budget mode's one budget.
const budgetName = "run"

// budgetResult is what the budget mode's row adds: the budget, the spend
// its ledger holds at the end (Router.Spend), and what it did to requests.
type budgetResult struct {
	LimitUSD    float64 `json:"limit_usd"`
	SpentUSD    float64 `json:"spent_usd"`    // settled spend in the ledger
	ReservedUSD float64 `json:"reserved_usd"` // still reserved at the end (0 once every request is done)
	Refused     int     `json:"refused"`      // requests refused with relay.ErrBudgetExceeded
	Downgraded  int     `json:"downgraded"`   // requests moved to Budget.Downgrade
	CheapPast   int     `json:"cheap_past_threshold"`
	// FirstRefusal is the share of the requests answered (in order of
	// their reports) when the first refusal came; 0 when none did.
	FirstRefusal float64 `json:"first_refusal_at"`
}

// flagshipWorstCase is the workload's cost if every request went to the
// flagship and produced its max_tokens: every prompt at the flagship's
// input price and every max_tokens at its output price, what a budget
// reserves for each such request.
func flagshipWorstCase(w *workload, prices map[string]relay.Price) float64 {
	p := prices[flagship]
	sum := 0.0
	for _, q := range w.reqs {
		sum += p.Cost(relay.Usage{PromptTokens: q.prompt, CompletionTokens: q.output})
	}
	return sum
}

// budgetLimit is the budget mode's limit for w, in USD, and the share of
// w's worst case on the flagship it is.
func budgetLimit(w *workload, prices map[string]relay.Price) (limit, share float64) {
	share, ok := budgetShares[w.name]
	if !ok {
		share = defaultBudgetShare
	}
	return sig(share*flagshipWorstCase(w, prices), 3), share
}

// budgeted routes as cluster-aware does, on the simulated clock (the
// budget's window, a day from simEpoch, never ends during a run), under
// one budget covering all traffic.
func budgeted(e *env) (*sender, error) {
	limit, share := budgetLimit(e.w, e.prices)
	cfg := relayConfig(e, newSimClock())
	cfg.Upstreams, cfg.Strategy = e.all, relay.StrategyAffinity
	cfg.Policy = relay.ClusterPolicy{Fast: e.fast, Cheap: e.cheap, CheapWhenSpent: cheapWhenSpent}
	cfg.Budgets = []relay.Budget{{Name: budgetName, Limit: limit,
		Window: relay.Window{Every: 24 * time.Hour}, Downgrade: e.cheap}}
	r, err := relay.New(cfg)
	if err != nil {
		return nil, err
	}
	s := routed(r)
	s.finish = func(res *result, reports []relay.Report) {
		b := budgetCounts(reports, e.cheap)
		b.LimitUSD = limit
		for _, sp := range r.Spend() {
			if sp.Budget == budgetName {
				b.SpentUSD, b.ReservedUSD = sig(sp.Spent, 4), sig(sp.Reserved, 4)
			}
		}
		res.Budget = &b
		res.About += fmt.Sprintf(": limit $%.4g (%.0f%% of the workload's worst case on %s)", limit, 100*share, flagship)
	}
	return s, nil
}

// budgetCounts counts, in reports, the requests a budget refused, those
// it moved to its Downgrade model, and the long prompts the policy sent to
// cheap once the budget was past its threshold.
func budgetCounts(reports []relay.Report, cheap string) budgetResult {
	var b budgetResult
	for i, r := range reports {
		switch {
		case errors.Is(r.Err, relay.ErrBudgetExceeded):
			b.Refused++
			if b.FirstRefusal == 0 {
				b.FirstRefusal = round(float64(i+1)/float64(len(reports)), 3)
			}
		case r.Err != nil || r.StatusCode != http.StatusOK:
		case r.Constraint == relay.ConstraintBudget:
			b.Downgraded++
		case r.Bucket == relay.BucketLong && r.Model == cheap && r.RequestedModel != cheap:
			b.CheapPast++
		}
	}
	return b
}

// printSpend prints what every mode spent and, for the budget mode, what
// its budget did.
func printSpend(out io.Writer, results []result) {
	if !hasBudget(results) {
		return
	}
	fmt.Fprintf(out, "\nSpend (USD, effective cost of the successful requests):\n")
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "mode\trequests\tspent $\tbudget $\tledger $\trefused\tdowngraded\tcheap past %.0f%%\n", 100*cheapWhenSpent)
	for _, r := range results {
		if r.Budget == nil {
			fmt.Fprintf(tw, "%s\t%d\t%.4f\t-\t-\t-\t-\t-\n", r.Mode, r.Requests, r.CostUSD)
			continue
		}
		b := r.Budget
		fmt.Fprintf(tw, "%s\t%d\t%.4f\t%.4f\t%.4f\t%d (%.1f%%)\t%d\t%d\n", r.Mode, r.Requests, r.CostUSD,
			b.LimitUSD, b.SpentUSD, b.Refused, 100*float64(b.Refused)/float64(r.Requests), b.Downgraded, b.CheapPast)
	}
	tw.Flush()
	fmt.Fprintf(out, budgetLegend, 100*cheapWhenSpent, 100*cheapWhenSpent)
}

// budgetLegend explains the spend table's budget columns.
const budgetLegend = `  budget $        the budget mode's relay.Budget: Limit per window, all traffic in one ledger
  ledger $        what its ledger holds as spent at the end (Router.Spend): the settled cost of every request
  refused         requests refused with relay.ErrBudgetExceeded, no upstream called (share of the mode's requests)
  downgraded      requests whose worst case no longer fitted, sent to the budget's Downgrade model instead
  cheap past %.0f%%  long prompts ClusterPolicy.CheapWhenSpent sent to the cheap model once %.0f%% of the budget was spent
`

func hasBudget(results []result) bool {
	for _, r := range results {
		if r.Budget != nil {
			return true
		}
	}
	return false
}
