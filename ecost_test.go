package relay

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay/relaytest"
)

// longChat is a chat body behind a system prompt of about sys tokens
// (" w<i>" words), then a user message.
func longChat(model string, sys int, user string) string {
	var b strings.Builder
	for i := range sys {
		fmt.Fprintf(&b, " w%d", i%10)
	}
	return `{"model":"` + model + `","messages":[{"role":"system","content":"` + b.String() + `"},{"role":"user","content":"` + user + `"}]}`
}

// classifiedOf classifies body as a chat request on r, with its blocks.
func classifiedOf(t *testing.T, r *Router, body string) *classified {
	t.Helper()
	c := r.classify(http.MethodPost, "/v1/chat/completions", http.Header{}, []byte(body))
	require.NotZero(t, c.req.PromptTokens)
	c.blocks = blocksOf(&c)
	return &c
}

// predictCached is predict's cached tokens alone.
func predictCached(u *upstream, b *promptBlocks, model string, promptTokens int, now time.Time) int {
	cached, _ := predict(u, b, model, promptTokens, now)
	return cached
}

func TestBlockRecordBounded(t *testing.T) {
	var rec blockRecord
	now := time.Unix(1000, 0)
	// 200 prompts of 9 blocks each into a record of 64 blocks.
	for i := range 200 {
		b := &promptBlocks{}
		for j := range 9 {
			b.hashes = append(b.hashes, fmix64(uint64(i*100+j+1)))
			b.ends = append(b.ends, (j+1)*blockBytes)
		}
		rec.served(b, "m", now, 64)
	}
	assert.Len(t, rec.keys, 64, "the table never grows")
	assert.Equal(t, 64, rec.len())

	// The latest prompt's head is held: the first block is stamped last.
	b := &promptBlocks{hashes: []uint64{fmix64(199*100 + 1)}, ends: []int{blockBytes}}
	assert.Equal(t, 1, rec.run(b, "m", now))
	assert.Equal(t, 0, rec.run(b, "other-model", now), "blocks are per model")
	assert.Equal(t, 0, rec.run(b, "m", now.Add(time.Nanosecond)), "served before since: not counted")
}

func TestPredictCachedRules(t *testing.T) {
	clock := newFakeClock()
	body := longChat("gpt-4.1", 3000, "hello")
	for _, tc := range []struct {
		name   string
		rules  CacheRules
		wait   time.Duration
		check  func(t *testing.T, got, prompt int)
		served bool
	}{
		{"cold: nothing served", CacheRules{}, 0, func(t *testing.T, got, _ int) { assert.Zero(t, got) }, false},
		{"OpenAI defaults: a multiple of 128, at least 1024", CacheRules{}, time.Minute, func(t *testing.T, got, prompt int) {
			assert.Zero(t, got%128)
			assert.GreaterOrEqual(t, got, 1024)
			assert.LessOrEqual(t, got, prompt)
			assert.Greater(t, got, prompt-128-blockBytes/2, "all but the partial last block and the step")
		}, true},
		{"step 1000", CacheRules{Step: 1000}, 0, func(t *testing.T, got, prompt int) {
			assert.Zero(t, got%1000)
			assert.Greater(t, got, prompt-1000-blockBytes/2)
		}, true},
		{"under MinTokens: 0", CacheRules{MinTokens: 100000}, 0, func(t *testing.T, got, _ int) { assert.Zero(t, got) }, true},
		{"past the TTL: 0", CacheRules{TTL: time.Minute}, time.Minute + time.Second, func(t *testing.T, got, _ int) { assert.Zero(t, got) }, true},
		{"at the TTL: cached", CacheRules{TTL: time.Minute}, time.Minute, func(t *testing.T, got, _ int) { assert.Positive(t, got) }, true},
		{"no cache", CacheRules{Off: true}, 0, func(t *testing.T, got, _ int) { assert.Zero(t, got) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := routerWith(t, Config{Strategy: StrategyExpectedCost, Clock: clock,
				Upstreams: []Upstream{{Name: "a", BaseURL: "http://127.0.0.1:1/v1", Cache: tc.rules}}})
			c := classifiedOf(t, r, body)
			u := r.ups[0]
			if tc.served {
				u.blocks.served(c.blocks, "gpt-4.1", clock.Now(), r.s.recordBlocks)
			}
			clock.Advance(tc.wait)
			tc.check(t, predictCached(u, c.blocks, "gpt-4.1", c.req.PromptTokens, clock.Now()), c.req.PromptTokens)
			assert.Zero(t, predictCached(u, c.blocks, "o3", c.req.PromptTokens, clock.Now()), "another model is cold")
		})
	}
}

func TestPredictCachedSharedPrefix(t *testing.T) {
	r := routerWith(t, Config{Strategy: StrategyExpectedCost, Upstreams: upstreamsN(1)})
	u, now := r.ups[0], time.Now()
	first := classifiedOf(t, r, longChat("gpt-4.1", 2000, "first question"))
	u.blocks.served(first.blocks, "gpt-4.1", now, r.s.recordBlocks)
	// Another question behind the same system prompt: its prefix is cached.
	next := classifiedOf(t, r, longChat("gpt-4.1", 2000, "another question entirely"))
	got := predictCached(u, next.blocks, "gpt-4.1", next.req.PromptTokens, now)
	assert.Greater(t, got, first.req.PromptTokens*8/10)
	assert.Less(t, got, first.req.PromptTokens)
	// A different system prompt shares no block.
	other := classifiedOf(t, r, strings.Replace(longChat("gpt-4.1", 2000, "x"), " w0", " v0", 1))
	assert.Zero(t, predictCached(u, other.blocks, "gpt-4.1", other.req.PromptTokens, now))
}

func TestConfigRejectsBadCacheRules(t *testing.T) {
	_, err := New(Config{CacheRecordBlocks: -1, Upstreams: []Upstream{{Name: "a", BaseURL: "http://a.invalid/v1",
		Cache: CacheRules{MinTokens: -1, Step: -2, TTL: -time.Second}}}})
	require.Error(t, err)
	for _, want := range []string{"CacheRecordBlocks -1 is negative", "Cache.MinTokens is negative", "Cache.Step is negative", "Cache.TTL is negative"} {
		assert.Contains(t, err.Error(), want)
	}
	assert.Equal(t, "expected-cost", StrategyExpectedCost.String())
}

// ecostFleet is three relaytest upstreams under StrategyExpectedCost on a
// fake clock.
type ecostFleet struct {
	r     *Router
	reps  *reports
	srv   map[string]*relaytest.Server
	clock *fakeClock
}

func newEcostFleet(t *testing.T, factors map[string]float64) *ecostFleet {
	f := &ecostFleet{srv: map[string]*relaytest.Server{}, clock: newFakeClock()}
	var ups []Upstream
	for _, name := range []string{"a", "b", "c"} {
		s := relaytest.NewServer()
		t.Cleanup(s.Close)
		f.srv[name] = s
		ups = append(ups, Upstream{Name: name, BaseURL: s.URL, PriceFactor: factors[name]})
	}
	f.r, f.reps = newTestRouter(t, Config{Strategy: StrategyExpectedCost, Upstreams: ups, Clock: f.clock,
		Prices: map[string]Price{"gpt-4.1": {InputPerMTok: 2, CachedInputPerMTok: 0.5, OutputPerMTok: 8}}})
	return f
}

func (f *ecostFleet) decide(t *testing.T, body string) Decision {
	t.Helper()
	req, err := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	d, err := f.r.Decide(req)
	require.NoError(t, err)
	return d
}

func (f *ecostFleet) send(t *testing.T, body string) Report {
	t.Helper()
	n := len(f.reps.all())
	do(t, f.r, "POST", "http://relay/v1/chat/completions", body)
	all := f.reps.all()
	require.Len(t, all, n+1)
	return all[n]
}

func TestExpectedCostColdFollowsAffinity(t *testing.T) {
	f := newEcostFleet(t, nil)
	body := longChat("gpt-4.1", 1500, "q")
	d := f.decide(t, body)
	aff := routerWith(t, Config{Strategy: StrategyAffinity, Upstreams: []Upstream{
		{Name: "a", BaseURL: f.srv["a"].URL}, {Name: "b", BaseURL: f.srv["b"].URL}, {Name: "c", BaseURL: f.srv["c"].URL}}})
	req, err := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	want, err := aff.Decide(req)
	require.NoError(t, err)
	assert.Equal(t, want.Upstreams, d.Upstreams, "a cold prompt keeps the affinity ranking")
	for _, c := range d.Candidates {
		assert.Zero(t, c.PredictedCached)
	}
}

func TestExpectedCostWarmUpstreamWins(t *testing.T) {
	f := newEcostFleet(t, nil)
	first := longChat("gpt-4.1", 1500, "q1")
	home := f.decide(t, first).Upstreams[0]
	rep := f.send(t, first)
	assert.Equal(t, home, rep.Upstream)
	assert.Zero(t, rep.PredictedCached)

	// The next turn predicts the served prefix on the upstream that served
	// it, and nowhere else; it goes there.
	second := longChat("gpt-4.1", 1500, "q2")
	d := f.decide(t, second)
	require.Len(t, d.Candidates, 3)
	assert.Equal(t, home, d.Upstreams[0])
	assert.GreaterOrEqual(t, d.Candidates[0].PredictedCached, 1024)
	assert.Zero(t, d.Candidates[1].PredictedCached)
	assert.Zero(t, d.Candidates[2].PredictedCached)

	// The report carries the prediction beside what the upstream reported.
	f.srv[home].Script(relaytest.Fault{CachedTokens: 1280})
	rep = f.send(t, second)
	assert.Equal(t, home, rep.Upstream)
	assert.Equal(t, d.Candidates[0].PredictedCached, rep.PredictedCached)
	assert.Equal(t, 1280, rep.Usage.CachedTokens)

	// Past the TTL nothing is predicted: the ranking is affinity's again.
	f.clock.Advance(5*time.Minute + time.Second)
	d = f.decide(t, second)
	assert.Zero(t, d.Candidates[0].PredictedCached)
}

func TestExpectedCostCheaperColdUpstreamWins(t *testing.T) {
	// The warm upstream lists at full price; another is so discounted
	// that its uncached prompt costs less than the warm one's cached one.
	f := newEcostFleet(t, map[string]float64{"a": 1, "b": 1, "c": 1})
	body := longChat("gpt-4.1", 1500, "q1")
	home := f.decide(t, body).Upstreams[0]
	f.send(t, body)
	cheap := "a"
	if home == "a" {
		cheap = "b"
	}
	f2 := newEcostFleet(t, map[string]float64{cheap: 0.01})
	f2.r.current().ups[indexOf(f2.r, home)].learned = f.r.current().ups[indexOf(f.r, home)].learned
	d := f2.decide(t, longChat("gpt-4.1", 1500, "q2"))
	assert.Equal(t, cheap, d.Upstreams[0])
	assert.Equal(t, home, d.Upstreams[1], "the warm one comes next")
	assert.Positive(t, d.Candidates[1].PredictedCached)
}

func indexOf(r *Router, name string) int {
	for i, u := range r.current().ups {
		if u.cfg.Name == name {
			return i
		}
	}
	return -1
}

func TestExpectedCostSkipsOpenAndOverloaded(t *testing.T) {
	f := newEcostFleet(t, nil)
	body := longChat("gpt-4.1", 1500, "q1")
	home := f.send(t, body).Upstream
	u := f.r.current().ups[indexOf(f.r, home)]

	// Over its bounded load (⌈1.25·(6+1)/3⌉ = 3 in flight): the request
	// walks on to the next, though the warm one would be cheaper.
	u.inflight.Add(6)
	rep := f.send(t, longChat("gpt-4.1", 1500, "q2"))
	u.inflight.Add(-6)
	assert.NotEqual(t, home, rep.Upstream)
	assert.Zero(t, rep.PredictedCached)

	// An open circuit is skipped as under every strategy.
	u.circ.view.Store(f.clock.Now().Add(time.Minute).UnixNano())
	d := f.decide(t, longChat("gpt-4.1", 1500, "q3"))
	assert.NotContains(t, d.Upstreams, home)
}

func TestExpectedCostEqualWarmthGoesToLeastLoaded(t *testing.T) {
	f := newEcostFleet(t, nil)
	// The same system prompt served everywhere: every upstream predicts
	// the same cached tokens for a new question behind it.
	ups := f.r.current().ups
	for _, u := range ups {
		c := classifiedOf(t, f.r, longChat("gpt-4.1", 1500, "seed"))
		u.blocks.served(c.blocks, "gpt-4.1", f.clock.Now(), f.r.s.recordBlocks)
	}
	body := longChat("gpt-4.1", 1500, "a new question")
	d := f.decide(t, body)
	require.Len(t, d.Candidates, 3)
	for _, c := range d.Candidates {
		assert.Equal(t, d.Candidates[0].PredictedCached, c.PredictedCached)
		assert.Positive(t, c.PredictedCached)
	}
	// Load the first two: the third, now the least loaded, goes first.
	first, second := ups[indexOf(f.r, d.Upstreams[0])], ups[indexOf(f.r, d.Upstreams[1])]
	first.inflight.Add(2)
	second.inflight.Add(1)
	defer first.inflight.Add(-2)
	defer second.inflight.Add(-1)
	assert.Equal(t, []string{d.Upstreams[2], d.Upstreams[1], d.Upstreams[0]}, f.decide(t, body).Upstreams)
}

// BenchmarkDecideExpectedCost compares Decide under StrategyAffinity and
// StrategyExpectedCost for a conversation turn of about 6k tokens over 4
// upstreams, one of which served its prefix: what the blocks, the record's
// lookups and the ranking add to a request (read as the ratio of the two).
func BenchmarkDecideExpectedCost(b *testing.B) {
	body := longChat("gpt-4.1", 3000, "the next question")
	for _, st := range []Strategy{StrategyAffinity, StrategyExpectedCost} {
		b.Run(st.String(), func(b *testing.B) {
			r, err := New(Config{Strategy: st, Upstreams: upstreamsN(4)})
			if err != nil {
				b.Fatal(err)
			}
			c := r.classify(http.MethodPost, "/v1/chat/completions", http.Header{}, []byte(body))
			r.ups[0].blocks.served(blocksOf(&c), "gpt-4.1", time.Now(), r.s.recordBlocks)
			b.ReportAllocs()
			for b.Loop() {
				req, _ := http.NewRequest("POST", "http://relay/v1/chat/completions", strings.NewReader(body))
				if _, err := r.Decide(req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestBlocksBoundedOnHugePrompts(t *testing.T) {
	r := routerWith(t, Config{Strategy: StrategyExpectedCost, Upstreams: upstreamsN(1), MaxBodyBytes: 8 << 20})
	c := classifiedOf(t, r, longChat("gpt-4.1", 400000, "q")) // about 1.4 MB of prompt
	assert.LessOrEqual(t, len(c.blocks.hashes), blockTextLimit/blockBytes, "at most 256 KiB are read")
	assert.Greater(t, len(c.blocks.hashes), blockTextLimit/blockBytes-8)
	last := 0
	for n := 1; n <= len(c.blocks.hashes); n++ {
		got := c.blocks.tokensAt(n, c.req.PromptTokens)
		require.GreaterOrEqual(t, got, last)
		last = got
	}
	assert.Less(t, last, c.req.PromptTokens/2, "the blocks cover the prompt's head only")
	// The record is as large as configured, and Update keeps it.
	r2 := routerWith(t, Config{Strategy: StrategyExpectedCost, CacheRecordBlocks: 100, Upstreams: upstreamsN(1)})
	r2.ups[0].blocks.served(c.blocks, "gpt-4.1", time.Now(), r2.s.recordBlocks)
	assert.Len(t, r2.ups[0].blocks.keys, 128, "100 blocks: 32 sets of 4")
	require.NoError(t, r2.Update(Config{Strategy: StrategyExpectedCost, Upstreams: upstreamsN(2)}))
	assert.Positive(t, r2.current().ups[0].blocks.run(c.blocks, "gpt-4.1", time.Time{}), "the upstream keeps what it served")
}

// TestExpectedCostPredictsTimeToFirstTokenFromCachedTokens: under
// StrategyExpectedCost, a candidate's predicted time to first token takes
// off the cached tokens predicted on that upstream for this very prompt,
// not the upstream's recent cache share.
func TestExpectedCostPredictsTimeToFirstTokenFromCachedTokens(t *testing.T) {
	f := newEcostFleet(t, nil)
	first := longChat("gpt-4.1", 1500, "q1")
	home := f.decide(t, first).Upstreams[0]
	f.send(t, first)
	for _, name := range []string{"a", "b", "c"} { // 100 ms + 1 ms per uncached token, everywhere
		warmFit(t, f.r, name, "gpt-4.1", 100*time.Millisecond, time.Millisecond)
	}
	d := f.decide(t, longChat("gpt-4.1", 1500, "q2"))
	require.Len(t, d.Candidates, 3)
	p := d.Request.PromptTokens
	for _, c := range d.Candidates {
		want := 100*time.Millisecond + time.Duration(p-c.PredictedCached)*time.Millisecond
		assert.InDelta(t, want, c.PredictedTTFT, float64(time.Microsecond), c.Upstream)
	}
	require.Equal(t, home, d.Candidates[0].Upstream)
	require.Positive(t, d.Candidates[0].PredictedCached)
	assert.Less(t, d.Candidates[0].PredictedTTFT, d.Candidates[1].PredictedTTFT, "the warm upstream answers sooner")
}
