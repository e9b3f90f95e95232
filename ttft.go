package relay

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// The time-to-first-token model: per upstream, model and kind of answer
// (stream or not), time to first token ≈ a + b × uncached prompt tokens
// (+ c × output tokens for an answer that is not a stream, whose headers
// come once the whole answer is written), fitted online from the answers'
// own figures.
//
//   - A sample is one answered attempt (2xx, read to its end): its size
//     is the prompt tokens less the usage's cached tokens, its time the
//     first content byte's for a stream and the response headers' for an
//     answer that is not one, counted from when the attempt was sent.
//   - The fit keeps the last ttftRing samples in a ring (fixed memory).
//     Every ttftEvery new samples it is fitted again by robust regression:
//     iteratively reweighted least squares, first towards the least
//     absolute deviations, then with Tukey's biweight (residuals past
//     4.685 robust standard deviations weigh nothing), so a share of
//     stalls does not move the line; b and c are clamped at 0, a is the
//     median of what the line leaves, and the residuals' p50 and p95, as
//     shares of the line's value, are kept: the p95 for a size is the
//     line's value × (1 + the residuals' p95).
//     The stalls go into the residuals' tail, where the p95 sees them.
//   - The share of prompt tokens the upstream answered from its cache over
//     the ring predicts a request's uncached tokens: prompt × (1 − share).
//   - The coefficients are published as one immutable value behind an
//     atomic pointer: a prediction takes no lock. Adding a sample takes the
//     fit's own lock once the answer was read (when the report is made),
//     never before the response is returned.
//   - A fit predicts once it holds ttftMinSamples samples.

// ttftRing is the number of recent samples a fit keeps.
const ttftRing = 64

// ttftEvery is how many new samples trigger a refit.
const ttftEvery = 16

// ttftMinSamples is how many samples a fit needs before it predicts.
const ttftMinSamples = 20

// ttftMaxFits bounds the fits of one upstream (model × stream or not): an
// upstream that serves more models keeps no fit for the others, which
// then fall back to the upstream's overall latency.
const ttftMaxFits = 32

// ttftCoef is a fit's published state. Times are nanoseconds, b and c
// nanoseconds per uncached prompt token and per output token.
type ttftCoef struct {
	a, b, c  float64
	r50, r95 float64 // residuals' quantiles, as shares of the line's value
	cached   float64 // share of the prompt tokens answered from the cache
	out      float64 // median output tokens, for a request that sets no maximum
	n        int     // samples behind it
}

// at returns the predicted time to first token of a request of n
// uncached prompt tokens and out output tokens at the residual r (r50:
// the median, r95: the p95).
func (c *ttftCoef) at(n, out int, r float64) time.Duration {
	return time.Duration(max(c.line(n, out)*(1+r), 0))
}

// line is the fit's value for n uncached and out output tokens, at least
// ttftFloor.
func (c *ttftCoef) line(n, out int) float64 {
	return max(c.a+c.b*float64(max(n, 0))+c.c*float64(max(out, 0)), ttftFloor)
}

// ttftFloor is the least value of a fit's line: a residual is a share of
// the line, which must not be 0.
const ttftFloor = float64(time.Millisecond)

// predict returns the median and p95 for a request of prompt tokens,
// asking for at most maxOut output tokens (0: unknown).
func (c *ttftCoef) predict(prompt, maxOut int) (p50, p95 time.Duration) {
	return c.predictCached(prompt, int(float64(prompt)*c.cached), maxOut)
}

// predictCached is predict for a request whose cached tokens are known
// (StrategyExpectedCost's prediction) instead of taken from the
// upstream's recent share.
func (c *ttftCoef) predictCached(prompt, cached, maxOut int) (p50, p95 time.Duration) {
	n := prompt - min(max(cached, 0), prompt)
	out := maxOut
	if out <= 0 {
		out = int(c.out)
	}
	return c.at(n, out, c.r50), c.at(n, out, c.r95)
}

// ttftFit is the fit of one upstream, model and kind of answer.
type ttftFit struct {
	model  string
	stream bool

	mu    sync.Mutex
	ring  [ttftRing]ttftSample
	next  int
	n     int // samples held, at most ttftRing
	dirty int // samples added since the last refit
	coef  atomic.Pointer[ttftCoef]
}

type ttftSample struct {
	uncached, prompt, out int32
	d                     float64 // nanoseconds
}

// add records a sample and refits when due.
func (f *ttftFit) add(prompt, cached, out int, d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	prompt = min(max(prompt, 0), math.MaxInt32)
	cached = min(max(cached, 0), prompt)
	f.ring[f.next] = ttftSample{uncached: int32(prompt - cached), prompt: int32(prompt),
		out: int32(min(max(out, 0), math.MaxInt32)), d: float64(d)}
	f.next = (f.next + 1) % ttftRing
	f.n = min(f.n+1, ttftRing)
	f.dirty++
	if f.n >= ttftMinSamples && (f.dirty >= ttftEvery || f.coef.Load() == nil) {
		f.refitLocked()
	}
}

func (f *ttftFit) refitLocked() {
	f.dirty = 0
	s := f.ring[:f.n]
	var ls ttftLS
	for i, x := range s {
		ls.x[i] = [3]float64{1, float64(x.uncached), float64(x.out)}
		ls.y[i] = x.d
	}
	ls.n = len(s)
	if f.stream {
		ls.off[2] = true // a stream's first token comes before its output
	}
	beta := ls.fit(f.coef.Load())
	c := &ttftCoef{b: beta[1], c: beta[2], n: len(s)}
	var res, outs [ttftRing]float64
	var prompt, cached float64
	for i, x := range s {
		res[i] = x.d - c.b*float64(x.uncached) - c.c*float64(x.out)
		outs[i] = float64(x.out)
		prompt += float64(x.prompt)
		cached += float64(x.prompt - x.uncached)
	}
	c.a = median(res[:len(s)])
	for i, x := range s {
		res[i] = x.d/c.line(int(x.uncached), int(x.out)) - 1
	}
	c.r50 = quantileSelect(res[:len(s)], 0.5)
	c.r95 = quantileSelect(res[:len(s)], 0.95)
	c.out = median(outs[:len(s)])
	if prompt > 0 {
		c.cached = cached / prompt
	}
	f.coef.Store(c)
}

// The rounds of a fit: enough for the tests' lines with 15% stalls to
// settle within 5%, from the last fit's line; a refit costs about 2 µs a
// round.
const (
	ttftLADRounds      = 6
	ttftBiweightRounds = 3
)

// ttftLS is a robust least-squares fit of y on the columns of x (1, the
// uncached tokens, the output tokens); a column marked off, or without
// spread, is left out (its coefficient 0).
type ttftLS struct {
	x   [ttftRing][3]float64
	y   [ttftRing]float64
	n   int
	off [3]bool
}

// fit returns the coefficients: from the weights 1/|residual| of the line
// from (or of a flat line), ttftLADRounds rounds of weights 1/|residual|
// (towards the least absolute deviations), then
// ttftBiweightRounds of Tukey's biweight; slopes are clamped at 0 (a
// column whose slope would be negative is left out).
func (ls *ttftLS) fit(from *ttftCoef) [3]float64 {
	for j := 1; j < 3; j++ {
		lo, hi := math.Inf(1), math.Inf(-1)
		for i := range ls.n {
			lo, hi = min(lo, ls.x[i][j]), max(hi, ls.x[i][j])
		}
		if hi <= lo {
			ls.off[j] = true
		}
	}
	// The first weights come from the last fit's line (from), else from a
	// flat line at the median: either way the stalls weigh little from the
	// start.
	var w, r [ttftRing]float64
	var line [3]float64
	if from != nil {
		line = [3]float64{from.a, from.b, from.c}
	} else {
		for i := range ls.n {
			r[i] = ls.y[i]
		}
		line[0] = median(r[:ls.n])
	}
	for i := range ls.n {
		res := ls.y[i] - line[0] - line[1]*ls.x[i][1] - line[2]*ls.x[i][2]
		w[i] = 1 / max(math.Abs(res), float64(time.Microsecond))
	}
	var beta [3]float64
	for round := range ttftLADRounds + ttftBiweightRounds {
		beta = ls.solve(&w)
		for j := 1; j < 3; j++ {
			if beta[j] < 0 { // clamp: leave the column out and solve again
				ls.off[j] = true
				beta = ls.solve(&w)
			}
		}
		for i := range ls.n {
			r[i] = ls.y[i] - beta[0] - beta[1]*ls.x[i][1] - beta[2]*ls.x[i][2]
		}
		if round < ttftLADRounds {
			for i := range ls.n {
				w[i] = 1 / max(math.Abs(r[i]), float64(time.Microsecond))
			}
			continue
		}
		var abs [ttftRing]float64
		for i := range ls.n {
			abs[i] = math.Abs(r[i])
		}
		scale := max(1.4826*median(abs[:ls.n]), float64(time.Microsecond))
		for i := range ls.n {
			u := r[i] / (4.685 * scale)
			if math.Abs(u) >= 1 {
				w[i] = 0
			} else {
				w[i] = (1 - u*u) * (1 - u*u)
			}
		}
	}
	return beta
}

// solve returns the weighted least-squares coefficients of the columns
// not off (Gaussian elimination on the normal equations; a singular
// system leaves the slopes 0).
func (ls *ttftLS) solve(w *[ttftRing]float64) [3]float64 {
	var cols [3]int
	k := 0
	for j := range 3 {
		if j == 0 || !ls.off[j] {
			cols[k] = j
			k++
		}
	}
	var m [3][4]float64
	for i := range ls.n {
		for p := range k {
			xp := ls.x[i][cols[p]] * w[i]
			for q := range k {
				m[p][q] += xp * ls.x[i][cols[q]]
			}
			m[p][k] += xp * ls.y[i]
		}
	}
	var beta [3]float64
	for p := range k {
		piv := p
		for q := p + 1; q < k; q++ {
			if math.Abs(m[q][p]) > math.Abs(m[piv][p]) {
				piv = q
			}
		}
		m[p], m[piv] = m[piv], m[p]
		if math.Abs(m[p][p]) < 1e-12 {
			return beta
		}
		for q := range k {
			if q == p {
				continue
			}
			f := m[q][p] / m[p][p]
			for c := p; c <= k; c++ {
				m[q][c] -= f * m[p][c]
			}
		}
	}
	for p := range k {
		beta[cols[p]] = m[p][k] / m[p][p]
	}
	return beta
}

// median returns the median of s, reordering s.
func median(s []float64) float64 { return quantileSelect(s, 0.5) }

// quantileSelect returns the q-quantile of s (the nearest rank, as
// latencyWindow's), reordering s: a quickselect, linear on average.
func quantileSelect(s []float64, q float64) float64 {
	n := len(s)
	if n == 0 {
		return 0
	}
	k := min(max(int(math.Ceil(q*float64(n)))-1, 0), n-1)
	lo, hi := 0, n-1
	for lo < hi {
		// Median of three as the pivot: sorted or constant input stays linear.
		mid := lo + (hi-lo)/2
		if s[mid] < s[lo] {
			s[mid], s[lo] = s[lo], s[mid]
		}
		if s[hi] < s[lo] {
			s[hi], s[lo] = s[lo], s[hi]
		}
		if s[hi] < s[mid] {
			s[hi], s[mid] = s[mid], s[hi]
		}
		p := s[mid]
		i, j := lo, hi
		for i <= j {
			for s[i] < p {
				i++
			}
			for s[j] > p {
				j--
			}
			if i <= j {
				s[i], s[j] = s[j], s[i]
				i++
				j--
			}
		}
		switch {
		case k <= j:
			hi = j
		case k >= i:
			lo = i
		default:
			return s[k]
		}
	}
	return s[k]
}

// ttftFits are the fits of one upstream: an immutable list behind an
// atomic pointer, read without a lock; a new fit is added under mu.
type ttftFits struct {
	mu   sync.Mutex
	list atomic.Pointer[[]*ttftFit]
}

// get returns the fit of model and kind, or nil.
func (fs *ttftFits) get(model string, stream bool) *ttftFit {
	if l := fs.list.Load(); l != nil {
		for _, f := range *l {
			if f.stream == stream && f.model == model {
				return f
			}
		}
	}
	return nil
}

// make returns the fit of model and kind, adding it if there is room.
func (fs *ttftFits) make(model string, stream bool) *ttftFit {
	if f := fs.get(model, stream); f != nil {
		return f
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if f := fs.get(model, stream); f != nil {
		return f
	}
	var old []*ttftFit
	if l := fs.list.Load(); l != nil {
		old = *l
	}
	if len(old) >= ttftMaxFits {
		return nil
	}
	f := &ttftFit{model: model, stream: stream}
	l := append(old[:len(old):len(old)], f)
	fs.list.Store(&l)
	return f
}

// predict returns the fit's coefficients for model and kind once it holds
// enough samples; nil while it is cold.
func (fs *ttftFits) predict(model string, stream bool) *ttftCoef {
	if f := fs.get(model, stream); f != nil {
		return f.coef.Load()
	}
	return nil
}

// learnTTFT adds the answering attempt's time to first token to its fit:
// a 2xx answer read to its end, with the usage's cached tokens taken off
// the prompt.
func (t *trip) learnTTFT(end bodyEnd) {
	a := &t.att
	if a.cand.up == nil || a.resp == nil || a.resp.StatusCode >= 300 || end.err != nil {
		return
	}
	stream := t.c.req.Stream
	d := a.latency
	if stream {
		if end.ttft <= 0 {
			return
		}
		d = end.ttft - a.sent.Sub(t.start)
	}
	if d <= 0 {
		return
	}
	prompt, cached, out := t.c.req.PromptTokens, 0, t.c.req.MaxTokens
	if end.haveUsage {
		prompt, cached, out = max(end.usage.PromptTokens, prompt), end.usage.CachedTokens, end.usage.CompletionTokens
	}
	if f := a.cand.up.fits.make(a.cand.model, stream); f != nil {
		f.add(prompt, cached, out, d)
	}
}

// learnOutwaited adds to its fit the time a hedged attempt waited before
// the hedge's answer won and it was cancelled: at least its time to first
// token, which was never seen. Without it the fit would learn only the
// answers that came before the hedge delay and those of the hedges, and
// its p95 would fall with every hedge (then more would be sent). The
// cached tokens are the fit's share; the output, the request's maximum.
func (t *trip) learnOutwaited(a *attempt) {
	if a.cand.up == nil || a.latency <= 0 {
		return
	}
	f := a.cand.up.fits.get(a.cand.model, t.c.req.Stream)
	if f == nil {
		return
	}
	c := f.coef.Load()
	if c == nil {
		return
	}
	prompt, out := t.c.req.PromptTokens, t.c.req.MaxTokens
	if out <= 0 {
		out = int(c.out)
	}
	f.add(prompt, int(float64(prompt)*c.cached), out, a.latency)
}

// predictedTTFT returns the median and p95 time to first token of the
// trip's request on cand, and whether its fit is warm.
func (t *trip) predictedTTFT(cand *candidate) (p50, p95 time.Duration, ok bool) {
	c := cand.up.fits.predict(cand.model, t.c.req.Stream)
	if c == nil {
		return 0, 0, false
	}
	if t.r.s.strategy == StrategyExpectedCost {
		// The strategy predicted this upstream's cached tokens for this
		// very prompt: a better guess than the upstream's recent share.
		p50, p95 = c.predictCached(t.c.req.PromptTokens, int(cand.predicted), t.c.req.MaxTokens)
		return p50, p95, true
	}
	p50, p95 = c.predict(t.c.req.PromptTokens, t.c.req.MaxTokens)
	return p50, p95, true
}

// byDeadline orders cands by the request's deadline (deadline-aware
// admission): a candidate whose predicted median time to first token is
// past the time left goes after those that may make it, in the order they
// had; when every candidate is warm and none may make it, the request is
// refused with ErrDeadlineUnreachable. A cold candidate (a fit with too
// few samples) is taken to make it: nothing is refused on a guess. (Past
// 8 late candidates, the others keep their places: a request with that
// many is never refused.)
func (t *trip) byDeadline(ctx context.Context, cands []candidate) error {
	dl, ok := ctx.Deadline()
	if !ok || len(cands) == 0 {
		return nil
	}
	left := dl.Sub(t.r.s.clock.Now())
	var late [8]candidate
	k, nl := 0, 0
	var best time.Duration = -1
	for _, c := range cands {
		p50, _, warm := t.predictedTTFT(&c)
		if !warm || p50 <= left || nl == len(late) {
			cands[k] = c
			k++
			continue
		}
		if best < 0 || p50 < best {
			best = p50
		}
		late[nl] = c
		nl++
	}
	if k == 0 {
		return &Error{Op: "route", Model: t.route.Model,
			Err: deadlineErr{left: left, best: best}}
	}
	copy(cands[k:], late[:nl])
	return nil
}

// deadlineErr is ErrDeadlineUnreachable with the figures behind it.
type deadlineErr struct{ left, best time.Duration }

func (e deadlineErr) Error() string {
	return ErrDeadlineUnreachable.Error() + ": " + e.left.Round(time.Millisecond).String() +
		" left, the fastest candidate's predicted median time to first token is " + e.best.Round(time.Millisecond).String()
}

func (e deadlineErr) Unwrap() error { return ErrDeadlineUnreachable }
