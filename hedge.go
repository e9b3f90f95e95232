package relay

import (
	"context"
	"sync/atomic"
	"time"
)

// hedgeBudget is a balance of hedges in millionths (hedgeUnit): each request deposits
// HedgeConfig.Budget of a hedge, up to a balance of 10, and each hedge
// spends one. It is lock-free.
type hedgeBudget struct {
	bal     atomic.Int64
	deposit atomic.Int64 // HedgeConfig.Budget's (Router.Update may change it)
}

const hedgeBudgetCap = 10 * hedgeUnit

// hedgeUnit is one hedge in the balance: a millionth is the finest share
// HedgeConfig.Budget keeps.
const hedgeUnit = 1_000_000

// hedgeReserve is the part of the balance, in millionths, that an
// attempt's first look at the hedge delay leaves for later looks (see
// sendHedged): a hedge at the first look needs 1 + 2 hedges in the
// balance, one at a later look 1. A new router's balance starts at the
// reserve.
const hedgeReserve = 2 * hedgeUnit

func (b *hedgeBudget) add() {
	for {
		old := b.bal.Load()
		nv := min(old+b.deposit.Load(), hedgeBudgetCap)
		if old == nv || b.bal.CompareAndSwap(old, nv) {
			return
		}
	}
}

// take spends a hedge if the balance holds one more than reserve.
func (b *hedgeBudget) take(reserve int64) bool {
	for {
		old := b.bal.Load()
		if old < hedgeUnit+reserve {
			return false
		}
		if b.bal.CompareAndSwap(old, old-hedgeUnit) {
			return true
		}
	}
}

// hedgeDelay is the delay after which an attempt on cand is hedged: with
// P95, the predicted p95 time to first token for the request's size on
// cand's upstream and model once that fit is warm (ttft.go), else the
// upstream's overall p95 once 20 samples are in; Delay is the floor.
func (t *trip) hedgeDelay(cand *candidate) time.Duration {
	r, u := t.r, cand.up
	d := r.s.hedge.delay
	if !r.s.hedge.p95 {
		return d
	}
	if _, p95, ok := t.predictedTTFT(cand); ok {
		return max(d, p95)
	}
	if u.lat.count() >= 20 {
		d = max(d, u.lat.p95())
	}
	return d
}

// loserUsage is what a hedge's losing attempt was billed.
type loserUsage struct {
	u        Usage
	model    string
	upstream string // its budgets' ledgers are the ones this cost goes to
	factor   float64
}

// sendHedged sends the attempt on cands[idx]; with hedging on and no
// response headers after the hedge delay, it also sends to the next
// candidate that can take the request at once (never the upstream already
// in flight), and returns the first good answer. The second return is the
// index after the hedge's candidate, or -1 when there was no hedge.
func (t *trip) sendHedged(ctx context.Context, cands []candidate, idx int, adm admission, out outBody, at time.Time) (attempt, int) {
	r := t.r
	cand := cands[idx]
	if !r.s.hedge.on {
		return t.send(ctx, cand, out, t.attempts, false, at), -1
	}
	results := make(chan attempt, 2)
	var cancels [2]context.CancelFunc
	launch := func(n int, c candidate, out outBody) {
		actx, cancel := context.WithCancel(ctx)
		cancels[n] = cancel
		seq := t.attempts
		go func() {
			a := t.send(actx, c, out, seq, n == 1, time.Time{})
			a.hedge = n
			if inner := a.cancel; inner != nil {
				a.cancel = func() { inner(); cancel() }
			} else {
				a.cancel = cancel
			}
			results <- a
		}()
	}
	launch(0, cand, out)
	// The attempt is looked at once the hedge delay is up, then each time
	// it has waited as long again (2, 4, 8… delays), until it answers or a
	// look finds a hedge in the budget. The first look leaves a reserve:
	// when more attempts pass the delay than the budget pays for (a stall
	// holds up the requests queued behind it; the delay itself lets 5% of
	// normal answers through), the hedges go to those still waiting at a
	// later look, the slowest, instead of to whichever came first.
	for wait, waited := t.hedgeDelay(&cand), time.Duration(0); ; wait = waited {
		fire := make(chan struct{})
		stop := r.s.clock.AfterFunc(wait, func() { close(fire) })
		select {
		case a := <-results:
			stop()
			return a, -1
		case <-ctx.Done():
			stop()
			return <-results, -1
		case <-fire:
		}
		reserve := int64(hedgeReserve)
		if waited > 0 {
			reserve = 0
		}
		waited += wait
		if r.hedges.take(reserve) {
			break
		}
	}
	adm.exclude, adm.mayWait = cand.up, false // a hedge goes elsewhere, at once
	idx2, _, err := r.acquire(ctx, cands, idx+1, adm)
	if err != nil {
		r.hedges.bal.Add(hedgeUnit) // unspent
		return <-results, -1
	}
	t.hedged = true
	t.attempts++
	launch(1, cands[idx2], t.bodyFor(cands[idx2]))
	return t.raceHedge(results, cancels), idx2 + 1
}

// raceHedge returns the first good answer of two racing attempts (else the
// better of the two: a response beats none) and settles the other.
func (t *trip) raceHedge(results chan attempt, cancels [2]context.CancelFunc) attempt {
	first := <-results
	if first.err == nil && !t.r.s.retry.shouldRetry(first.resp, nil) {
		select {
		case loser := <-results:
			// Both completed upstream: both are billed. The loser's body is
			// read for its usage on a goroutine of its own, and the report
			// waits for it instead of the caller.
			t.observe(&loser, t.r.s.clock.Now())
			if loser.resp != nil && loser.resp.StatusCode < 300 && !isEventStream(loser.resp.Header) {
				t.votes.Add(1)
				go func() {
					t.readLoser(&loser)
					t.vote()
				}()
			} else {
				loser.close()
			}
		default:
			cancels[1-first.hedge]()
			go func() { // ends as soon as the cancelled attempt returns
				loser := <-results
				t.observe(&loser, t.r.s.clock.Now())
				if loser.hedge == 0 {
					t.learnOutwaited(&loser)
				}
				loser.close()
			}()
		}
		return first
	}
	second := <-results
	if second.resp == nil && first.resp != nil {
		// A response, even a retryable one, beats none.
		second, first = first, second
	}
	t.observe(&first, t.r.s.clock.Now()) // the one not returned; the loop observes the other
	first.close()
	return second
}

// readLoser reads the usage of a hedge's losing attempt that completed
// upstream too, bounded in bytes and time, so the report's cost includes
// both; then it closes the attempt.
func (t *trip) readLoser(a *attempt) {
	decompress(a.resp)
	b, cut := readBounded(a.resp.Body, maxKeptBody)
	u, ok := parseUsage(b)
	if !ok && !cut && a.resp.StatusCode < 300 && len(b) > 0 && !isEventStream(a.resp.Header) {
		// An answer without usage is billed like the winner's would be:
		// an estimate (Usage.Estimated), not nothing.
		u, ok = t.estimated(t.r.counter.completion(t.c.enc, b))
	}
	if ok && !cut {
		t.loserMu.Lock()
		t.losers = append(t.losers, loserUsage{u: u, model: a.cand.model, upstream: a.cand.up.cfg.Name, factor: a.cand.up.factor})
		t.loserMu.Unlock()
	}
	a.close()
}
