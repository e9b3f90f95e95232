package relay

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// The time-to-first-token model: per upstream, model and kind of answer
// (stream or not), time to first token ≈ a + b × uncached prompt tokens,
// fitted online from the answers' own figures.
//
//   - A sample is one answered attempt (2xx, read to its end): its size
//     is the prompt tokens less the usage's cached tokens, its time the
//     first content byte's for a stream and the response headers' for an
//     answer that is not one, counted from when the attempt was sent.
//   - The fit keeps the last ttftRing samples in a ring (fixed memory).
//     Every ttftEvery new samples, b is the Theil–Sen slope (the median of
//     the slopes between every two samples of different sizes, clamped at
//     0), a the median of time − b × size, and the residuals' p50 and p95
//     are kept: the p95 for a size n is a + b·n + the residuals' p95. A
//     median-based fit stands up to a share of stalls (up to ~29% of the
//     samples) without its line moving; the stalls go into the residuals'
//     tail, where the p95 sees them.
//   - The coefficients are published as one immutable value behind an
//     atomic pointer: a prediction takes no lock. Adding a sample takes the
//     fit's own lock, off the request's path (when the report is made).
//   - A fit predicts once it holds ttftMinSamples samples.

// ttftRing is the number of recent samples a fit keeps.
const ttftRing = 64

// ttftEvery is how many new samples trigger a refit.
const ttftEvery = 8

// ttftMinSamples is how many samples a fit needs before it predicts.
const ttftMinSamples = 20

// ttftMaxFits bounds the fits of one upstream (model × stream or not): an
// upstream that serves more models keeps no fit for the others, which
// then fall back to the upstream's overall latency.
const ttftMaxFits = 32

// ttftCoef is a fit's published state. Times are nanoseconds, b is
// nanoseconds per uncached prompt token.
type ttftCoef struct {
	a, b     float64
	r50, r95 float64
	n        int // samples behind it
}

// at returns the predicted time to first token of a request of n uncached
// prompt tokens at the residual r (r50: the median, r95: the p95).
func (c *ttftCoef) at(n int, r float64) time.Duration {
	return time.Duration(max(c.a+c.b*float64(max(n, 0))+r, 0))
}

// ttftFit is the fit of one upstream, model and kind of answer.
type ttftFit struct {
	model  string
	stream bool

	mu     sync.Mutex
	xs, ys [ttftRing]float64 // uncached tokens, nanoseconds
	next   int
	n      int // samples held, at most ttftRing
	dirty  int // samples added since the last refit
	coef   atomic.Pointer[ttftCoef]
}

// add records a sample and refits when due.
func (f *ttftFit) add(uncached int, d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.xs[f.next], f.ys[f.next] = float64(max(uncached, 0)), float64(d)
	f.next = (f.next + 1) % ttftRing
	f.n = min(f.n+1, ttftRing)
	f.dirty++
	if f.n >= ttftMinSamples && (f.dirty >= ttftEvery || f.coef.Load() == nil) {
		f.refitLocked()
	}
}

// ttftScratch holds the pairwise slopes of a refit: ttftRing·(ttftRing−1)/2.
var ttftScratch = sync.Pool{New: func() any {
	s := make([]float64, 0, ttftRing*(ttftRing-1)/2)
	return &s
}}

func (f *ttftFit) refitLocked() {
	f.dirty = 0
	n := f.n
	xs, ys := f.xs[:n], f.ys[:n]
	sp := ttftScratch.Get().(*[]float64)
	s := (*sp)[:0]
	for i := 0; i < n; i++ {
		for j := i + 1; j < n; j++ {
			if dx := xs[j] - xs[i]; dx != 0 {
				s = append(s, (ys[j]-ys[i])/dx)
			}
		}
	}
	b := 0.0
	if len(s) >= n { // sizes spread enough to tell a slope
		b = max(median(s), 0)
	}
	s = s[:0]
	for i := range n {
		s = append(s, ys[i]-b*xs[i])
	}
	a := median(s)
	for i := range s {
		s[i] -= a
	}
	c := &ttftCoef{a: a, b: b, n: n}
	c.r50 = quantileSelect(s, 0.5)
	c.r95 = quantileSelect(s, 0.95)
	*sp = s
	ttftScratch.Put(sp)
	f.coef.Store(c)
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

// sizeOf is the request's size for a prediction: its uncached prompt
// tokens. No prediction of the cache is made, so it is the whole prompt:
// a prediction errs towards the slow side for a request whose prefix the
// upstream holds.
func (t *trip) sizeOf() int { return t.c.req.PromptTokens }

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
	n := t.c.req.PromptTokens
	if end.haveUsage {
		n = max(end.usage.PromptTokens, n) - end.usage.CachedTokens
	}
	if f := a.cand.up.fits.make(a.cand.model, stream); f != nil {
		f.add(n, d)
	}
}

// predictedTTFT returns the median and p95 time to first token of the
// trip's request on cand, and whether its fit is warm.
func (t *trip) predictedTTFT(cand *candidate) (p50, p95 time.Duration, ok bool) {
	c := cand.up.fits.predict(cand.model, t.c.req.Stream)
	if c == nil {
		return 0, 0, false
	}
	n := t.sizeOf()
	return c.at(n, c.r50), c.at(n, c.r95), true
}

// byDeadline orders cands by the request's deadline (deadline-aware
// admission): a candidate whose predicted median time to first token is
// past the time left goes after those that may make it, in the order they
// had; when every candidate is warm and none may make it, the request is
// refused with ErrDeadlineUnreachable. A cold candidate (a fit with too
// few samples) is taken to make it: nothing is refused on a guess.
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
