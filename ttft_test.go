package relay

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// feedLine adds n samples of a + b·size (size spread over [lo, hi]) to f,
// a share of them outliers slower by a factor of 10 to 50, with a small
// jitter; deterministic from seed.
func feedLine(f *ttftFit, n int, a, b time.Duration, lo, hi int, outliers float64, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 1))
	for range n {
		size := lo + rng.IntN(hi-lo+1)
		d := float64(a) + float64(b)*float64(size)
		d *= 1 + 0.02*(rng.Float64()-0.5)
		if rng.Float64() < outliers {
			d *= 10 + 40*rng.Float64()
		}
		f.add(size, 0, 0, time.Duration(d))
	}
}

func TestTTFTFitConvergesDespiteOutliers(t *testing.T) {
	f := &ttftFit{}
	// 200 ms + 100 µs per uncached token; 15% of samples stall 10–50×.
	feedLine(f, 1000, 200*time.Millisecond, 100*time.Microsecond, 100, 20000, 0.15, 1)
	c := f.coef.Load()
	require.NotNil(t, c)
	assert.InEpsilon(t, float64(100*time.Microsecond), c.b, 0.05, "slope")
	assert.InDelta(t, float64(200*time.Millisecond), c.a, float64(60*time.Millisecond), "intercept")
	assert.InDelta(t, 0, c.r50, 0.02, "the median residual is near the line")
	// The stalls are in the tail: the p95 is several times the line, at
	// every size (the residuals are shares of the line).
	assert.Greater(t, c.r95, 2.0)
	small, large := c.at(500, 0, c.r50), c.at(15000, 0, c.r50)
	assert.InDelta(t, float64(250*time.Millisecond), float64(small), float64(60*time.Millisecond))
	assert.InDelta(t, float64(1700*time.Millisecond), float64(large), float64(100*time.Millisecond))
	assert.Less(t, c.at(500, 0, c.r95), c.at(15000, 0, c.r95))
	// Bounded memory: the ring holds the last ttftRing samples.
	assert.Equal(t, ttftRing, f.n)
	assert.Equal(t, ttftRing, c.n)
}

func TestTTFTFitSeparatesOutputAndCache(t *testing.T) {
	// Answers that are not streams: their headers wait for the whole
	// output. 300 ms + 100 µs per uncached token + 25 ms per output
	// token, 60% of each prompt cached; 10% stall 10–50×.
	f := &ttftFit{}
	rng := rand.New(rand.NewPCG(5, 5))
	for range 500 {
		prompt, out := 1000+rng.IntN(8000), 16+rng.IntN(1000)
		cached := prompt * 6 / 10
		d := 300*time.Millisecond + time.Duration(prompt-cached)*100*time.Microsecond + time.Duration(out)*25*time.Millisecond
		if rng.Float64() < 0.1 {
			d *= time.Duration(10 + rng.IntN(40))
		}
		f.add(prompt, cached, out, d)
	}
	c := f.coef.Load()
	require.NotNil(t, c)
	assert.InEpsilon(t, float64(100*time.Microsecond), c.b, 0.05, "per uncached token")
	assert.InEpsilon(t, float64(25*time.Millisecond), c.c, 0.05, "per output token")
	assert.InDelta(t, 0.6, c.cached, 0.01, "the cache's share of the prompt")
	// A 5000-token prompt (2000 uncached, predicted from the share) asking
	// for 100 tokens: 300 + 200 + 2500 ms.
	p50, p95 := c.predict(5000, 100)
	assert.InDelta(t, float64(3000*time.Millisecond), float64(p50), float64(100*time.Millisecond))
	assert.Greater(t, p95, p50)
	// Without a maximum, the median output the fit saw stands in.
	p50, _ = c.predict(5000, 0)
	assert.InDelta(t, float64(300*time.Millisecond+200*time.Millisecond)+c.c*c.out, float64(p50), float64(100*time.Millisecond))

	// A stream's first token does not wait for its output.
	g := &ttftFit{stream: true}
	for i := range 100 {
		g.add(1000+i*50, 0, 16+i*10, 200*time.Millisecond+time.Duration(1000+i*50)*100*time.Microsecond)
	}
	assert.Zero(t, g.coef.Load().c)
	assert.InEpsilon(t, float64(100*time.Microsecond), g.coef.Load().b, 0.01)
}

func TestTTFTFitFollowsAChange(t *testing.T) {
	f := &ttftFit{}
	feedLine(f, 200, 100*time.Millisecond, 50*time.Microsecond, 100, 10000, 0, 2)
	// The upstream gets 4× slower per token: a ring's worth of samples
	// later the fit has moved with it.
	feedLine(f, ttftRing, 100*time.Millisecond, 200*time.Microsecond, 100, 10000, 0, 3)
	assert.InEpsilon(t, float64(200*time.Microsecond), f.coef.Load().b, 0.05)
}

func TestTTFTFitColdAndFlat(t *testing.T) {
	f := &ttftFit{}
	for range ttftMinSamples - 1 {
		f.add(1000, 0, 0, 300*time.Millisecond)
	}
	assert.Nil(t, f.coef.Load(), "no prediction before ttftMinSamples")
	f.add(1000, 0, 0, 300*time.Millisecond)
	c := f.coef.Load()
	require.NotNil(t, c)
	// One size only: no slope can be told, the level is the samples'.
	assert.Zero(t, c.b)
	assert.Equal(t, 300*time.Millisecond, c.at(1000, 0, c.r95))
	assert.Equal(t, 300*time.Millisecond, c.at(1_000_000, 0, c.r95))

	// Times falling with size (noise, or a cache the size hides) never
	// predict a negative slope.
	g := &ttftFit{}
	for i := range 40 {
		g.add(100+i*100, 0, 0, time.Duration(5000-i*100)*time.Millisecond)
	}
	assert.Zero(t, g.coef.Load().b)
}

func TestTTFTFitsAreBounded(t *testing.T) {
	var fs ttftFits
	for i := range ttftMaxFits + 5 {
		f := fs.make("m"+string(rune('a'+i)), false)
		if i < ttftMaxFits {
			assert.NotNil(t, f)
		} else {
			assert.Nil(t, f, "past ttftMaxFits no fit is added")
		}
	}
	assert.Same(t, fs.make("ma", false), fs.make("ma", false))
	assert.NotSame(t, fs.make("ma", false), fs.make("ma", true), "streams have a fit of their own")
	assert.Len(t, *fs.list.Load(), ttftMaxFits)
	assert.Nil(t, fs.predict("nope", false))
}

func TestQuantileSelectMatchesSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for n := 1; n < 200; n += 7 {
		s := make([]float64, n)
		for i := range s {
			s[i] = math.Round(rng.NormFloat64() * 10) // ties too
		}
		sorted := slices.Clone(s)
		slices.Sort(sorted)
		for _, q := range []float64{0, 0.05, 0.5, 0.95, 1} {
			k := min(max(int(math.Ceil(q*float64(n)))-1, 0), n-1)
			assert.Equal(t, sorted[k], quantileSelect(slices.Clone(s), q), "n=%d q=%g", n, q)
		}
	}
}

// warmFit gives upstream name's fit of model (answers that are not
// streams) ttftRing samples of a + b·size, sizes spread over 1–4000.
func warmFit(t *testing.T, r *Router, name, model string, a, b time.Duration) {
	t.Helper()
	for _, u := range r.ups {
		if u.cfg.Name == name {
			f := u.fits.make(model, false)
			for i := range ttftRing {
				size := 1 + i*4000/ttftRing
				f.add(size, 0, 0, a+time.Duration(size)*b)
			}
			return
		}
	}
	t.Fatalf("no upstream %q", name)
}

func decideFor(t *testing.T, r *Router, ctx context.Context, body string) (Decision, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "POST", "http://relay/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	return r.Decide(req)
}

func TestHedgeDelayFollowsTheRequestsSize(t *testing.T) {
	a, b := newGatedUpstream(t), newGatedUpstream(t)
	r, _, clock := hedgeRouter(t, HedgeConfig{P95: true, Delay: 10 * time.Millisecond, Budget: 1}, a.URL, b.URL)
	r.hedges.bal.Store(hedgeBudgetCap)
	// Upstream a: 100 ms + 1 ms per prompt token, no spread.
	warmFit(t, r, "a", "gpt-4.1", 100*time.Millisecond, time.Millisecond)

	small := chatBody("gpt-4.1", "hi")
	large := chatBody("gpt-4.1", strings.Repeat("word ", 500))
	ds, err := decideFor(t, r, context.Background(), small)
	require.NoError(t, err)
	dl, err := decideFor(t, r, context.Background(), large)
	require.NoError(t, err)
	ps, pl := ds.Request.PromptTokens, dl.Request.PromptTokens
	require.Less(t, ps, pl)
	assert.InDelta(t, 100*time.Millisecond+time.Duration(ps)*time.Millisecond, ds.Candidates[0].PredictedTTFTP95, float64(time.Microsecond))
	assert.InDelta(t, 100*time.Millisecond+time.Duration(pl)*time.Millisecond, dl.Candidates[0].PredictedTTFTP95, float64(time.Microsecond))
	assert.InDelta(t, ds.Candidates[0].PredictedTTFTP95, ds.Candidates[0].PredictedTTFT, float64(time.Microsecond), "no spread: p50 = p95")
	assert.Zero(t, ds.Candidates[1].PredictedTTFT, "b's fit is cold")

	send := func(id, body string) <-chan *http.Response {
		out := make(chan *http.Response, 1)
		go func() {
			req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("X-Req", id)
			resp, err := r.RoundTrip(req)
			if !assert.NoError(t, err) {
				out <- nil
				return
			}
			resp.Body.Close()
			out <- resp
		}()
		return out
	}
	// The small request is hedged at its own p95, the large one later, on
	// the same upstream.
	b.open("s")
	done := send("s", small)
	assert.Equal(t, ds.Candidates[0].PredictedTTFTP95, <-clock.armed)
	require.Eventually(t, func() bool { return a.Calls() == 1 }, 5*time.Second, time.Millisecond)
	clock.Advance(ds.Candidates[0].PredictedTTFTP95)
	resp := <-done
	require.NotNil(t, resp)
	assert.Equal(t, "b", resp.Header.Get(HeaderUpstream))
	// The cancelled attempt's wait goes into a's fit: it took at least that.
	fa := r.ups[0].fits.get("gpt-4.1", false)
	require.Eventually(t, func() bool {
		fa.mu.Lock()
		defer fa.mu.Unlock()
		last := fa.ring[(fa.next+ttftRing-1)%ttftRing]
		return last.d == float64(ds.Candidates[0].PredictedTTFTP95) && int(last.prompt) == ps
	}, 5*time.Second, time.Millisecond)

	b.open("l")
	done = send("l", large)
	assert.Equal(t, dl.Candidates[0].PredictedTTFTP95, <-clock.armed)
	require.Eventually(t, func() bool { return a.Calls() == 2 }, 5*time.Second, time.Millisecond)
	clock.Advance(ds.Candidates[0].PredictedTTFTP95)
	assert.Equal(t, 1, b.Calls(), "the large request is not hedged at the small one's delay")
	clock.Advance(dl.Candidates[0].PredictedTTFTP95 - ds.Candidates[0].PredictedTTFTP95)
	resp = <-done
	require.NotNil(t, resp)
	assert.Equal(t, "b", resp.Header.Get(HeaderUpstream))
	a.open("s")
	a.open("l")
}

func TestHedgeDelayFloorAndColdFit(t *testing.T) {
	a, b := newGatedUpstream(t), newGatedUpstream(t)
	r, _, _ := hedgeRouter(t, HedgeConfig{P95: true, Delay: 400 * time.Millisecond}, a.URL, b.URL)
	tr := &trip{r: r}
	tr.c.req.PromptTokens = 10
	cand := candidate{up: r.ups[0], model: "gpt-4.1"}
	assert.Equal(t, 400*time.Millisecond, tr.hedgeDelay(&cand), "cold: Delay")
	warmFit(t, r, "a", "gpt-4.1", 100*time.Millisecond, time.Millisecond)
	assert.Equal(t, 400*time.Millisecond, tr.hedgeDelay(&cand), "Delay is the floor")
	tr.c.req.PromptTokens = 1000
	assert.InDelta(t, 1100*time.Millisecond, tr.hedgeDelay(&cand), float64(time.Microsecond))
	tr.c.req.Stream = true
	assert.Equal(t, 400*time.Millisecond, tr.hedgeDelay(&cand), "a stream's fit is its own, cold")

	// Without P95 the fixed delay holds, whatever the fit.
	r2, _, _ := hedgeRouter(t, HedgeConfig{Delay: 400 * time.Millisecond}, a.URL, b.URL)
	warmFit(t, r2, "a", "gpt-4.1", 100*time.Millisecond, time.Millisecond)
	tr2 := &trip{r: r2}
	tr2.c.req.PromptTokens = 1000
	assert.Equal(t, 400*time.Millisecond, tr2.hedgeDelay(&candidate{up: r2.ups[0], model: "gpt-4.1"}))
}

// deadlineRouter is a router over two answering upstreams, slow and fast
// in configuration order, on a clock that stands still at the wall
// clock's now (so a context deadline and the router agree on the time
// left).
func deadlineRouter(t *testing.T) (*Router, *reports, *fakeClock, *recorder, *recorder) {
	slow := newRecorder(t, 200, fixture(t, "chat_response_default.json"))
	fast := newRecorder(t, 200, fixture(t, "chat_response_default.json"))
	clock := newFakeClock()
	clock.now = time.Now()
	r, reps := newTestRouter(t, Config{
		Clock:     clock,
		Upstreams: []Upstream{{Name: "slow", BaseURL: slow.URL}, {Name: "fast", BaseURL: fast.URL}},
	})
	return r, reps, clock, slow, fast
}

func TestDeadlineReordersToAFasterCandidate(t *testing.T) {
	r, reps, clock, slow, fast := deadlineRouter(t)
	body := chatBody("gpt-4.1", "hi")

	// Cold fits: the configured order, whatever the deadline.
	ctx, cancel := context.WithDeadline(context.Background(), clock.Now().Add(time.Hour))
	defer cancel()
	d, err := decideFor(t, r, ctx, body)
	require.NoError(t, err)
	assert.Equal(t, []string{"slow", "fast"}, d.Upstreams)

	warmFit(t, r, "slow", "gpt-4.1", 2*time.Hour, 0)
	warmFit(t, r, "fast", "gpt-4.1", time.Minute, 0)
	d, err = decideFor(t, r, ctx, body)
	require.NoError(t, err)
	assert.Equal(t, []string{"fast", "slow"}, d.Upstreams, "slow cannot answer within the hour")
	assert.InDelta(t, 2*time.Hour, d.Candidates[1].PredictedTTFT, float64(time.Millisecond))

	// Without a deadline nothing moves.
	d, err = decideFor(t, r, context.Background(), body)
	require.NoError(t, err)
	assert.Equal(t, []string{"slow", "fast"}, d.Upstreams)

	req, err := http.NewRequestWithContext(ctx, "POST", "http://relay/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	resp, err := r.RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, "fast", resp.Header.Get(HeaderUpstream))
	assert.Len(t, fast.got(), 1)
	assert.Empty(t, slow.got())
	require.Eventually(t, func() bool { return len(reps.all()) == 1 }, 5*time.Second, time.Millisecond)
}

func TestDeadlineUnreachableIsRefusedAtOnce(t *testing.T) {
	r, reps, clock, slow, fast := deadlineRouter(t)
	warmFit(t, r, "slow", "gpt-4.1", 3*time.Hour, 0)
	warmFit(t, r, "fast", "gpt-4.1", 2*time.Hour, 0)
	ctx, cancel := context.WithDeadline(context.Background(), clock.Now().Add(time.Hour))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "hi")))
	require.NoError(t, err)
	resp, err := r.RoundTrip(req)
	require.Error(t, err)
	assert.Nil(t, resp)
	assert.ErrorIs(t, err, ErrDeadlineUnreachable)
	var e *Error
	require.True(t, errors.As(err, &e))
	assert.Contains(t, err.Error(), "1h0m0s left")
	assert.Contains(t, err.Error(), "2h0m0s")
	assert.Empty(t, slow.got(), "no upstream called")
	assert.Empty(t, fast.got())
	rep := reps.all()
	require.Len(t, rep, 1)
	assert.ErrorIs(t, rep[0].Err, ErrDeadlineUnreachable)
	assert.Zero(t, rep[0].Attempts)

	// One cold candidate is enough to try: nothing is refused on a guess.
	r2, _, clock2, _, fast2 := deadlineRouter(t)
	warmFit(t, r2, "slow", "gpt-4.1", 3*time.Hour, 0)
	ctx2, cancel2 := context.WithDeadline(context.Background(), clock2.Now().Add(time.Hour))
	defer cancel2()
	req, err = http.NewRequestWithContext(ctx2, "POST", "http://relay/v1/chat/completions", strings.NewReader(chatBody("gpt-4.1", "hi")))
	require.NoError(t, err)
	resp, err = r2.RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, "fast", resp.Header.Get(HeaderUpstream))
	assert.Len(t, fast2.got(), 1)
}

func TestAnswersTeachTheFit(t *testing.T) {
	up := newRecorder(t, 200, fixture(t, "chat_response_default.json"))
	r, reps := newTestRouter(t, Config{Upstreams: []Upstream{{Name: "a", BaseURL: up.URL}}})
	for i := range ttftMinSamples {
		_, _ = do(t, r, "POST", "http://relay/v1/chat/completions", chatBody("gpt-4.1", strings.Repeat("x ", i*10)))
	}
	require.Eventually(t, func() bool { return len(reps.all()) == ttftMinSamples }, 5*time.Second, time.Millisecond)
	f := r.ups[0].fits.get("gpt-4.1", false)
	require.NotNil(t, f)
	f.mu.Lock()
	n := f.n
	f.mu.Unlock()
	assert.Equal(t, ttftMinSamples, n)
	assert.NotNil(t, f.coef.Load())
	assert.Nil(t, r.ups[0].fits.get("gpt-4.1", true), "no stream was answered")
}

// BenchmarkTTFTFitAdd is the cost of one answer to its fit, refits
// included (one in ttftEvery), on spread sizes with stalls.
func BenchmarkTTFTFitAdd(b *testing.B) {
	f := &ttftFit{}
	rng := rand.New(rand.NewPCG(9, 9))
	b.ReportAllocs()
	for b.Loop() {
		prompt := 100 + rng.IntN(8000)
		d := 300*time.Millisecond + time.Duration(prompt)*100*time.Microsecond
		if rng.IntN(50) == 0 {
			d *= 20
		}
		f.add(prompt, prompt/2, 16+rng.IntN(500), d)
	}
}
