package relay

import (
	"cmp"
	"math"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/tokenrelay/relay/internal/prompt"
)

// Expected-cost routing (StrategyExpectedCost).
//
// The router keeps, per upstream, a bounded record of the prompt-prefix
// blocks it recently served, each stamped with when it was last served
// (Config.Clock). Before a request is sent, it predicts the cached tokens
// each candidate would report under that upstream's caching rules
// (Upstream.Cache), and ranks the candidates by the request's expected
// cost.
//
// Blocks, for a request's canonical prompt (internal/prompt, the text the
// affinity key is cut from):
//
//  1. The text considered is the canonical prompt cut to at most
//     blockTextLimit bytes (at a rune start), so a prompt of any size costs
//     bounded time: about 64k tokens of prefix are recorded.
//  2. Blocks tile it from its start: block i ends blockBytes bytes after
//     the end of block i-1 (moved back to a rune start); a partial last
//     block is not a block. A block is about 128 tokens.
//  3. Block i's hash continues block i-1's over its bytes eight at a time
//     (words, as the conversation anchor is hashed) and is finished by
//     fmix64, the first one seeded with "relay/blocks/v1/": each hash
//     covers all text up to the end of its block, as the prefix shards'
//     do. The record keys a block by its hash mixed with the model it was
//     sent for, since a provider caches per model.
//  4. The tokens up to the end of block i are estimated as the request's
//     prompt tokens times the share of the canonical prompt's bytes that
//     end covers (of the body's bytes when the text was cut).
//
// Prediction on an upstream serving model m, at time now: the longest run
// of leading blocks the upstream served for m within its TTL gives the
// tokens up to the run's end, rounded down to Step, 0 under MinTokens, at
// most the prompt tokens; 0 when the upstream's Cache is Off.
const (
	blockBytes     = 512       // bytes of canonical prompt per block: ~128 tokens
	blockTextLimit = 256 << 10 // bytes of canonical prompt the blocks cover
)

var blockSeed = fmix64(fnv1a(fnvOffset64, "relay/blocks/v1/"))

// CacheRules say how an upstream's provider caches prompt prefixes, for
// StrategyExpectedCost's prediction of the cached tokens a request would
// report there. The zero value is OpenAI's rules: prefixes of 1024 tokens
// or more, cached in steps of 128 tokens, for about 5 minutes.
type CacheRules struct {
	// MinTokens is the shortest prefix the provider caches. If 0, 1024.
	MinTokens int
	// Step is the granularity of a cached prefix: the cached tokens are a
	// multiple of it. If 0, 128.
	Step int
	// TTL is how long a served prefix stays cached. If 0, 5 minutes.
	TTL time.Duration
	// Off: the upstream caches nothing; its predicted cached tokens are 0.
	Off bool
}

// cacheRules are CacheRules resolved.
type cacheRules struct {
	minTokens, step int
	ttl             time.Duration
	off             bool
}

// resolveCache fills in the defaults of c and reports its problems.
func resolveCache(c CacheRules) (cacheRules, []string) {
	var errs []string
	if c.MinTokens < 0 {
		errs = append(errs, "Cache.MinTokens is negative")
	}
	if c.Step < 0 {
		errs = append(errs, "Cache.Step is negative")
	}
	if c.TTL < 0 {
		errs = append(errs, "Cache.TTL is negative")
	}
	return cacheRules{minTokens: orDefault(c.MinTokens, 1024), step: orDefault(c.Step, 128),
		ttl: orDefault(c.TTL, 5*time.Minute), off: c.Off}, errs
}

// defaultRecordBlocks is Config.CacheRecordBlocks' default.
const defaultRecordBlocks = 16384

// promptBlocks are a request's prefix blocks (see the definition above).
type promptBlocks struct {
	hashes []uint64
	ends   []int // byte offset of each block's end
	denom  int   // bytes the prompt tokens are spread over
}

// tokensAt estimates the prompt tokens up to the end of the first n
// blocks.
func (b *promptBlocks) tokensAt(n, promptTokens int) int {
	if n == 0 || b.denom == 0 {
		return 0
	}
	return min(int(int64(promptTokens)*int64(b.ends[n-1])/int64(b.denom)), promptTokens)
}

var blockPool = sync.Pool{New: func() any {
	b := make([]byte, 0, 16<<10)
	return &b
}}

// blocksOf computes the prefix blocks of the request c.
func blocksOf(c *classified) *promptBlocks {
	bp := blockPool.Get().(*[]byte)
	buf := prompt.AppendCanonical((*bp)[:0], c.req.Endpoint, c.body, blockTextLimit+1)
	b := &promptBlocks{}
	t := buf
	if len(t) > blockTextLimit {
		t = t[:runeStartAtOrBefore(t, blockTextLimit)]
		b.denom = max(len(c.body), len(t))
	} else {
		b.denom = len(t)
	}
	n := len(t) / blockBytes
	b.hashes, b.ends = make([]uint64, 0, n), make([]int, 0, n)
	h, start := blockSeed, 0
	for start+blockBytes <= len(t) {
		end := runeStartAtOrBefore(t, start+blockBytes)
		if end <= start {
			end = start + blockBytes
		}
		h = fmix64(words(h, t[start:end]))
		b.hashes, b.ends = append(b.hashes, h), append(b.ends, end)
		start = end
	}
	if cap(buf) <= 1<<20 {
		*bp = buf[:0]
		blockPool.Put(bp)
	}
	return b
}

// runeStartAtOrBefore returns the largest offset i <= n, within
// utf8.UTFMax bytes of n, where t[i] starts a rune (len(t) when n is past
// it; n itself when no byte there starts one).
func runeStartAtOrBefore[T ~string | ~[]byte](t T, n int) int {
	if n >= len(t) {
		return len(t)
	}
	for i := n; i >= 0 && i > n-utf8.UTFMax; i-- {
		if utf8.RuneStart(t[i]) {
			return i
		}
	}
	return n
}

// blockKey is the record's key of a block hash for a model: never 0.
func blockKey(h uint64, model string) uint64 {
	return fmix64(h^fnv1a(fnvOffset64, model)) | 1
}

// blockRecord is a bounded record of the blocks one upstream served: a
// 4-way set-associative table of keys and the times they were last
// served, allocated on first use. A new key takes an empty way of its set,
// or the least recently served one. Safe for concurrent use.
type blockRecord struct {
	mu   sync.Mutex
	keys []uint64 // 0: empty
	at   []int64  // UnixNano of the last serving
	mask uint64   // sets - 1
}

const recordWays = 4

// init sizes the record for at least n blocks (a power of two of sets).
func (rec *blockRecord) initLocked(n int) {
	sets := 1
	for sets*recordWays < n {
		sets <<= 1
	}
	rec.keys = make([]uint64, sets*recordWays)
	rec.at = make([]int64, sets*recordWays)
	rec.mask = uint64(sets - 1)
}

// served stamps the blocks of b, sent for model, with now; size is the
// record's capacity in blocks.
func (rec *blockRecord) served(b *promptBlocks, model string, now time.Time, size int) {
	if len(b.hashes) == 0 {
		return
	}
	ns := now.UnixNano()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.keys == nil {
		rec.initLocked(size)
	}
	// The first block last: an eviction then takes a prefix's tail before
	// its head, as a provider's cache does.
	for i := len(b.hashes) - 1; i >= 0; i-- {
		k := blockKey(b.hashes[i], model)
		set := int(k>>32&rec.mask) * recordWays
		way := -1
		for j := set; j < set+recordWays; j++ {
			if rec.keys[j] == k {
				way = j
				break
			}
			if way < 0 || rec.keys[j] == 0 || (rec.keys[way] != 0 && rec.at[j] < rec.at[way]) {
				way = j
			}
		}
		rec.keys[way], rec.at[way] = k, ns
	}
}

// run returns how many leading blocks of b the record holds for model,
// served at or after since.
func (rec *blockRecord) run(b *promptBlocks, model string, since time.Time) int {
	if len(b.hashes) == 0 {
		return 0
	}
	ns := since.UnixNano()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.keys == nil {
		return 0
	}
	n := 0
	for _, h := range b.hashes {
		k := blockKey(h, model)
		set := int(k>>32&rec.mask) * recordWays
		j := slices.Index(rec.keys[set:set+recordWays], k)
		if j < 0 || rec.at[set+j] < ns {
			break
		}
		n++
	}
	return n
}

// len returns the number of blocks the record holds.
func (rec *blockRecord) len() int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	n := 0
	for _, k := range rec.keys {
		if k != 0 {
			n++
		}
	}
	return n
}

// predict returns the cached tokens a request of promptTokens tokens,
// whose blocks are b, would report on u serving model at now, and the run
// of leading blocks u served for model within its TTL.
func predict(u *upstream, b *promptBlocks, model string, promptTokens int, now time.Time) (cached, run int) {
	rules := u.cache
	if rules.off || b == nil {
		return 0, 0
	}
	run = u.blocks.run(b, model, now.Add(-rules.ttl))
	cached = b.tokensAt(run, promptTokens)
	if rules.step > 1 {
		cached -= cached % rules.step
	}
	if cached < rules.minTokens {
		return 0, run
	}
	return cached, run
}

// rankByCost orders each model's candidates in cands by expected cost:
// (prompt − predicted cached)·input + cached·cached input + output
// estimate·output, at the model's price and the upstream's price factor;
// a model without a price by uncached prompt tokens. Equal costs go by
// expected prefill (uncached tokens count 10× cached ones), then, when
// some of them served part of the prompt, by the fewest requests in
// flight, then by rendezvous hashing on tieKey (a cold prompt: the
// affinity ranking, so cold requests keep cache locality). Each candidate
// keeps its prediction.
func (r *Router) rankByCost(cands []candidate, c *classified, key uint64, now time.Time) {
	if c.req.Endpoint == "" {
		return
	}
	if c.blocks == nil {
		c.blocks = blocksOf(c)
	}
	p := c.req.PromptTokens
	out := r.s.defaultMaxTokens
	if c.req.MaxTokens > 0 {
		out = c.req.MaxTokens
	}
	for start := 0; start < len(cands); {
		end := start + 1
		for end < len(cands) && cands[end].model == cands[start].model {
			end++
		}
		r.rankModel(cands[start:end], c, key, p, out, now)
		start = end
	}
}

// rankModel is rankByCost for the candidates of one model.
func (r *Router) rankModel(seg []candidate, c *classified, key uint64, p, out int, now time.Time) {
	price, priced := lookupPrice(r.s.prices, seg[0].model)
	type score struct {
		cost, prefill float64
		tie           uint64
		i             int
	}
	var buf [16]score
	scores := buf[:0]
	longest := 0
	for i := range seg {
		cd := &seg[i]
		cached, run := predict(cd.up, c.blocks, cd.model, p, now)
		longest = max(longest, run)
		cd.predicted = int32(min(cached, math.MaxInt32))
		s := score{prefill: float64(p-cached) + float64(cached)/10, i: i}
		if priced {
			s.cost = price.Cost(Usage{PromptTokens: p, CachedTokens: cached, CompletionTokens: out}) * cd.up.factor
		} else {
			s.cost = float64(p - cached)
		}
		scores = append(scores, s)
	}
	if len(seg) < 2 {
		return
	}
	tk := tieKey(c.blocks, key, longest)
	for i := range scores {
		scores[i].tie = ^rendezvous(tk, seg[i].up.seed)
		if longest > 0 { // the fewest in flight first, then the hash ranking
			scores[i].tie = uint64(min(seg[i].up.inflight.Load(), 1<<15))<<48 | scores[i].tie>>16
		}
	}
	slices.SortStableFunc(scores, func(a, b score) int {
		return cmp.Or(cmp.Compare(a.cost, b.cost), cmp.Compare(a.prefill, b.prefill), cmp.Compare(a.tie, b.tie))
	})
	var tmp [16]candidate
	old := append(tmp[:0], seg...)
	for i, s := range scores {
		seg[i] = old[s.i]
	}
}

// tieKey is the key equal costs are ranked by last: the affinity key when no
// candidate served a block of the prompt (a cold prompt goes where the
// requests sharing its prefix go); else the hash of the first block past
// the longest run served (of the last block, when all were), since the
// served part is as good anywhere it is held, and the rest goes where
// requests sharing it go: a conversation's first turn behind a system
// prompt held everywhere finds a home of its own.
func tieKey(b *promptBlocks, key uint64, longest int) uint64 {
	if longest == 0 || len(b.hashes) == 0 {
		return key
	}
	return b.hashes[min(longest, len(b.hashes)-1)]
}

// noteServed records the blocks of the answered request on the upstream
// that answered, under expected-cost routing.
func (t *trip) noteServed(rep *Report) {
	a := &t.att.cand
	if t.c.blocks == nil || a.up == nil || rep.Err != nil || rep.StatusCode >= 400 || a.model == "" {
		return
	}
	a.up.blocks.served(t.c.blocks, a.model, t.r.s.clock.Now(), t.r.s.recordBlocks)
}
