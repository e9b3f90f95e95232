// Package simfleet simulates a fleet of OpenAI-compatible upstreams on
// loopback: the regions and model paths of an LLM provider, with the
// queueing, caching and failures that decide tail latency in production.
// The simulation of the repository's examples/simulate and the simulated
// fleet of examples/gateway run on it. It is a model, not a measurement of
// any provider:
//
//   - Every (region, model) pair is one relaytest.Server (one base URL, one
//     upstream in router terms) with Model.Shards shards. A shard is a FIFO
//     worker that serves one request at a time; a request waits in the
//     shard's queue, which holds at most Model.QueueLimit requests. A
//     request that finds the queue full is answered at once with
//     Config.FullStatus (429 by default, with a retry-after-ms hint of
//     Config.FullRetryAfter; 503 with no hint when FullStatus is 503).
//   - Service time is Base + prefill + decode, multiplied by
//     Config.TimeScale: prefill costs PrefillPerToken per uncached prompt
//     token and CachedPerToken per cached one, decode DecodePerToken per
//     output token. A non-streaming answer is sent after the whole service
//     time; a stream sends its headers at once, its first content event
//     after Base + prefill, and the others paced DecodePerToken apart. The
//     shard is busy until the answer is written.
//   - Output tokens are the request's max_tokens (max_completion_tokens,
//     max_output_tokens), or Model.DefaultOutput when it sets none; the
//     answer then finishes with "stop". Prompt tokens are counted exactly as
//     a relaytest.Server counts them (relaytest.PromptTokens: o200k_base,
//     OpenAI's chat formula).
//   - The scheduler sends a request to the shard with the fewest requests
//     (in service plus queued), ties broken round-robin, except when
//     clustering is on (the default): a prompt whose token count is inside
//     [ClusterMin, ClusterMax] goes to shard 0, the "happy path" shard, what
//     ever its queue. Nothing fails; the hot shard's queue grows while the
//     others idle, which is the silent p99 inflation that batch jobs see.
//   - Each Server has a prefix cache: an LRU of at most CacheBlocks block
//     hashes. The canonical prompt text, the router's own definition
//     (internal/prompt.AppendCanonical: leading system and developer
//     messages, tool definitions, then the other messages with their text,
//     tool calls and tool outputs; Responses: instructions, tools, input;
//     completions: the prompt), is cut into fixed blocks of BlockBytes
//     bytes; block i's hash chains the hash of block i-1, so a block matches
//     only when the whole prefix up to it matches. The leading blocks found
//     in the cache are the cached prefix: the answer reports the o200k_base
//     tokens of that prefix text (at most the prompt tokens) as
//     cached_tokens, and prefill charges them at CachedPerToken. Every block
//     of the prompt is then inserted (or refreshed), the first block last,
//     so the LRU evicts the tail of a prefix before its head, as a
//     radix-tree cache evicts leaves first. A partial last block is never
//     cached. PrefixCache is the same cache on its own, for offline
//     replays; Model.AnswerTime is the time a served call takes.
//   - Faults on demand: SetDark makes a region refuse every call (the
//     connection is closed with no answer, or a 503 when DarkStatus is 503);
//     Burst429 answers the next calls of a region with 429 and a
//     retry-after-ms hint; SetSlowFirstToken delays the first token of every
//     answer of a region; SetStalls makes a random share of all calls meet a
//     shard that serves them many times slower, or a connection that hangs.
//     The router's retries, breakers and hedges see these as real failures.
//
// Calls that are not chat, Responses or completions calls (models,
// embeddings) are answered by the Server as usual, with no scheduling.
//
// The fleet runs on the wall clock: every service time is a real wait of
// its scaled length, so what a run measures (latency, throughput, the
// queues its arrivals build) also depends on how fast the machine runs the
// clients and the fleet.
package simfleet

import (
	"container/list"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tokenrelay/relay/internal/bpe"
	"github.com/tokenrelay/relay/internal/prompt"
	"github.com/tokenrelay/relay/relaytest"
)

// DefaultRegions are the regions of a Fleet whose Config names none.
var DefaultRegions = []string{"us-east", "eu-west", "ap-southeast", "sa-east"}

// Model is one model path of a simulated fleet: its name and speed.
// Durations are in simulated (real-world) time; Config.TimeScale turns
// them into wall-clock time.
type Model struct {
	Name string
	// Shards per region; 0: 4.
	Shards int
	// QueueLimit bounds the requests waiting in one shard's queue (the one in
	// service not counted); 0: 64.
	QueueLimit int
	// Base is a fixed cost per request before the first token.
	Base time.Duration
	// PrefillPerToken and CachedPerToken are the prefill costs of one
	// uncached and one cached prompt token.
	PrefillPerToken, CachedPerToken time.Duration
	// DecodePerToken is the cost of one output token.
	DecodePerToken time.Duration
	// DefaultOutput is the output tokens of a request that sets no max
	// tokens; 0: 32.
	DefaultOutput int
}

// ServiceTime returns the unscaled service time of a request: Base +
// (prompt−cached)·PrefillPerToken + cached·CachedPerToken +
// output·DecodePerToken.
func (m Model) ServiceTime(prompt, cached, output int) time.Duration {
	return m.firstToken(prompt, cached) + time.Duration(output)*m.DecodePerToken
}

// AnswerTime returns the unscaled time from a call taking its shard to the
// last byte of its answer when nothing slows it (no stall, no extra
// first-token delay): the least time the call can take once it is served.
// A non-streaming answer is sent whole after ServiceTime. A stream sends
// one content event per output token, the first after Base + prefill and
// each other DecodePerToken after the one before, and ends with its last:
// ServiceTime less one DecodePerToken (Base + prefill when output is 0).
func (m Model) AnswerTime(prompt, cached, output int, stream bool) time.Duration {
	if stream {
		return m.firstToken(prompt, cached) + time.Duration(max(output-1, 0))*m.DecodePerToken
	}
	return m.ServiceTime(prompt, cached, output)
}

func (m Model) firstToken(prompt, cached int) time.Duration {
	cached = min(max(cached, 0), prompt)
	return m.Base + time.Duration(prompt-cached)*m.PrefillPerToken + time.Duration(cached)*m.CachedPerToken
}

// DefaultModels returns the three model paths of the default fleet: the
// slow flagship gpt-5.5-codex (≈40 output tokens/s), the fast
// gemini-2.5-flash (≈200/s) and the cheap deepseek-v3.2 (≈80/s). Cached
// prompt tokens prefill about 10× faster than uncached ones.
func DefaultModels() []Model {
	return []Model{
		{Name: "gpt-5.5-codex", Base: 300 * time.Millisecond,
			PrefillPerToken: 400 * time.Microsecond, CachedPerToken: 40 * time.Microsecond,
			DecodePerToken: 25 * time.Millisecond},
		{Name: "gemini-2.5-flash", Base: 120 * time.Millisecond,
			PrefillPerToken: 80 * time.Microsecond, CachedPerToken: 8 * time.Microsecond,
			DecodePerToken: 5 * time.Millisecond},
		{Name: "deepseek-v3.2", Base: 200 * time.Millisecond,
			PrefillPerToken: 150 * time.Microsecond, CachedPerToken: 15 * time.Microsecond,
			DecodePerToken: 12 * time.Millisecond},
	}
}

// Config configures a Fleet. The zero value is the default fleet.
type Config struct {
	// Regions names the regions; nil: DefaultRegions.
	Regions []string
	// Models are the model paths every region serves; nil:
	// DefaultModels().
	Models []Model
	// TimeScale multiplies every service time; 0: 0.01 (a 2 s answer takes
	// 20 ms of wall-clock time).
	TimeScale float64
	// NoClustering starts the fleet with clustering off (SetClustering
	// switches it at run time).
	NoClustering bool
	// ClusterMin and ClusterMax bound the clustered window, in prompt
	// tokens, inclusive; if both are 0, 150 and 220.
	ClusterMin, ClusterMax int
	// CacheBlocks bounds the prefix cache of each (region, model) Server, in
	// blocks; 0: 1024 (64 KB of prompt text, a few dozen prompts' worth:
	// small enough that where a request lands decides whether its prefix is
	// still cached); negative: no cache.
	CacheBlocks int
	// BlockBytes is the size of a prefix block; 0: 64 (about 16 tokens of
	// English text).
	BlockBytes int
	// FullStatus answers a request that finds its shard's queue full: 429
	// (the default, with a retry-after-ms hint) or 503.
	FullStatus int
	// FullRetryAfter is the hint of a full-queue 429, in simulated time
	// (scaled like service times); 0: 1 s.
	FullRetryAfter time.Duration
	// DarkStatus is how a dark region refuses calls: 0 closes the connection
	// with no answer (the client sees a connection error); 503 answers 503.
	DarkStatus int
	// Options are passed to every Server (e.g. relaytest.WithReply).
	Options []relaytest.Option
}

// Upstream is one (region, model) Server of a Fleet.
type Upstream struct {
	Name   string // region + "/" + model, e.g. "us-east/gpt-5.5-codex"
	Region string
	Model  string
	URL    string // base URL, ending in "/v1"
}

// Fleet is a running simulated fleet, started by New. It is safe
// for concurrent use by multiple goroutines. Call Close when done.
type Fleet struct {
	cfg        Config
	paths      []*simPath
	byName     map[string]*simPath
	regions    map[string]*simRegion
	clustering atomic.Bool

	stallMu sync.Mutex
	stalls  Stalls
	stallRN *rand.Rand

	closing   chan struct{} // closed by Close: calls waiting in a queue end
	closeOnce sync.Once
}

// Stalls makes a share of a fleet's calls misbehave the way a sick shard
// or a black-holed connection does (SetStalls). Each call to a chat,
// Responses or completions endpoint that is not refused by a dark region or
// a 429 burst draws once: with probability Hang it hangs, with probability
// Slow it is slowed, otherwise it is served as usual.
type Stalls struct {
	// Slow is the share of calls (0 to 1) served by a shard running
	// SlowMin to SlowMax times slower than usual (uniformly drawn): the
	// whole service time (first token and every output token) is
	// stretched, and the shard stays busy meanwhile, so the calls queued
	// behind it wait too. A stream's headers still come at once.
	Slow float64
	// SlowMin and SlowMax bound the slow-down factor; if both are 0, 10
	// and 50.
	SlowMin, SlowMax float64
	// Hang is the share of calls (0 to 1) whose connection hangs: no
	// headers, no shard taken, until the client gives up (its attempt
	// timeout or deadline) or the fleet closes.
	Hang float64
	// Seed seeds the draws.
	Seed uint64
}

type simRegion struct {
	dark      atomic.Bool
	burst     atomic.Int64 // 429s left to answer
	burstHint atomic.Int64 // retry-after of the burst, ns of wall-clock time
	slowFirst atomic.Int64 // extra first-token delay, ns of wall-clock time
}

// New starts a fleet: one relaytest.Server per region and model.
func New(cfg Config) *Fleet {
	if cfg.Regions == nil {
		cfg.Regions = DefaultRegions
	}
	if cfg.Models == nil {
		cfg.Models = DefaultModels()
	}
	cfg.Regions = slices.Clone(cfg.Regions)
	cfg.Models = slices.Clone(cfg.Models)
	if cfg.TimeScale <= 0 {
		cfg.TimeScale = 0.01
	}
	if cfg.ClusterMin == 0 && cfg.ClusterMax == 0 {
		cfg.ClusterMin, cfg.ClusterMax = 150, 220
	}
	if cfg.CacheBlocks == 0 {
		cfg.CacheBlocks = 1024
	}
	if cfg.BlockBytes <= 0 {
		cfg.BlockBytes = 64
	}
	if cfg.FullStatus == 0 {
		cfg.FullStatus = http.StatusTooManyRequests
	}
	if cfg.FullRetryAfter == 0 {
		cfg.FullRetryAfter = time.Second
	}
	for i := range cfg.Models {
		m := &cfg.Models[i]
		if m.Shards <= 0 {
			m.Shards = 4
		}
		if m.QueueLimit <= 0 {
			m.QueueLimit = 64
		}
		if m.DefaultOutput <= 0 {
			m.DefaultOutput = 32
		}
	}
	f := &Fleet{cfg: cfg, byName: map[string]*simPath{}, regions: map[string]*simRegion{}, closing: make(chan struct{})}
	f.clustering.Store(!cfg.NoClustering)
	for _, region := range cfg.Regions {
		if _, dup := f.regions[region]; dup {
			f.Close()
			panic("simfleet: duplicate region " + region)
		}
		reg := &simRegion{}
		f.regions[region] = reg
		for _, m := range cfg.Models {
			p := &simPath{fleet: f, region: reg, regionName: region, model: m,
				shards: make([]*simShard, m.Shards)}
			for i := range p.shards {
				p.shards[i] = &simShard{limit: m.QueueLimit}
			}
			if cfg.CacheBlocks > 0 {
				p.cache = NewPrefixCache(cfg.CacheBlocks, cfg.BlockBytes)
			}
			name := region + "/" + m.Name
			opts := append(slices.Clone(cfg.Options), relaytest.WithName(name), relaytest.WithModels(m.Name),
				relaytest.WithSchedule(p.schedule))
			p.srv = relaytest.NewServer(opts...)
			p.up = Upstream{Name: name, Region: region, Model: m.Name, URL: p.srv.URL}
			f.paths = append(f.paths, p)
			f.byName[name] = p
		}
	}
	return f
}

// Upstreams lists the fleet's Servers, region by region, each region's
// models in the order of Config.Models.
func (f *Fleet) Upstreams() []Upstream {
	out := make([]Upstream, len(f.paths))
	for i, p := range f.paths {
		out[i] = p.up
	}
	return out
}

// Upstream returns the Server of a region and model; ok is false when the
// fleet has none.
func (f *Fleet) Upstream(region, model string) (Upstream, bool) {
	p, ok := f.byName[region+"/"+model]
	if !ok {
		return Upstream{}, false
	}
	return p.up, true
}

// Server returns the Server of a region and model, or nil. A fault scripted
// on it (Script, SetDefault) is answered as a plain Server answers it; the
// fleet's own faults (a dark region, a 429 burst) come first.
func (f *Fleet) Server(region, model string) *relaytest.Server {
	if p, ok := f.byName[region+"/"+model]; ok {
		return p.srv
	}
	return nil
}

// Config returns the fleet's configuration with its defaults filled in.
func (f *Fleet) Config() Config {
	c := f.cfg
	c.Regions = slices.Clone(c.Regions)
	c.Models = slices.Clone(c.Models)
	c.Options = slices.Clone(c.Options)
	return c
}

// Model returns the model path named name with its defaults filled in.
func (f *Fleet) Model(name string) (Model, bool) {
	for _, m := range f.cfg.Models {
		if m.Name == name {
			return m, true
		}
	}
	return Model{}, false
}

// SetClustering switches the clustering failure on or off.
func (f *Fleet) SetClustering(on bool) { f.clustering.Store(on) }

// SetDark makes a region refuse every call (dark) or serve again. Calls
// already being served finish normally.
func (f *Fleet) SetDark(region string, dark bool) {
	f.region(region).dark.Store(dark)
}

// Burst429 makes a region answer its next n calls (any model) with 429 and
// retry-after-ms set to retryAfter, in simulated time (scaled by TimeScale).
func (f *Fleet) Burst429(region string, n int, retryAfter time.Duration) {
	r := f.region(region)
	r.burstHint.Store(int64(f.scale(retryAfter)))
	r.burst.Store(int64(max(n, 0)))
}

// SetStalls sets the share of calls that meet a slow shard or a hung
// connection (see Stalls); the zero Stalls ends them. It panics on a
// share outside [0, 1], Slow+Hang over 1, or a factor range that is not
// 1 <= SlowMin <= SlowMax.
func (f *Fleet) SetStalls(s Stalls) {
	if s.SlowMin == 0 && s.SlowMax == 0 {
		s.SlowMin, s.SlowMax = 10, 50
	}
	if !(s.Slow >= 0 && s.Hang >= 0 && s.Slow+s.Hang <= 1) || !(1 <= s.SlowMin && s.SlowMin <= s.SlowMax) {
		panic("simfleet: invalid Stalls")
	}
	f.stallMu.Lock()
	defer f.stallMu.Unlock()
	f.stalls = s
	f.stallRN = rand.New(rand.NewPCG(s.Seed, 0x57a11))
}

// stall draws a call's fate: hang, or a slow-down factor (1: none).
func (f *Fleet) stall() (hang bool, factor float64) {
	f.stallMu.Lock()
	defer f.stallMu.Unlock()
	s := f.stalls
	if s.Slow == 0 && s.Hang == 0 {
		return false, 1
	}
	switch u := f.stallRN.Float64(); {
	case u < s.Hang:
		return true, 1
	case u < s.Hang+s.Slow:
		return false, s.SlowMin + f.stallRN.Float64()*(s.SlowMax-s.SlowMin)
	}
	return false, 1
}

// SetSlowFirstToken adds extra (simulated time, scaled by TimeScale) before
// the first token of every answer of a region (before the headers of a
// non-streaming answer); 0 ends it. The shard stays busy meanwhile.
func (f *Fleet) SetSlowFirstToken(region string, extra time.Duration) {
	f.region(region).slowFirst.Store(int64(f.scale(max(extra, 0))))
}

func (f *Fleet) region(name string) *simRegion {
	r, ok := f.regions[name]
	if !ok {
		panic("simfleet: no region " + name)
	}
	return r
}

func (f *Fleet) scale(d time.Duration) time.Duration {
	return time.Duration(math.Round(float64(d) * f.cfg.TimeScale))
}

// Close closes every Server. Calls waiting in a queue are aborted.
func (f *Fleet) Close() {
	f.closeOnce.Do(func() { close(f.closing) })
	for _, p := range f.paths {
		p.srv.Close()
	}
}

// Stats is a snapshot of a fleet's counters.
type Stats struct {
	Paths []PathStats // in the order of Upstreams
}

// PathStats are the counters of one (region, model) Server.
type PathStats struct {
	Name, Region, Model string
	// Served counts answers given after service; Rejected, calls answered
	// with FullStatus because the shard queue was full; Refused, calls
	// refused while the region was dark; Throttled, 429s of a Burst429;
	// Slowed, calls served by a slow shard and Hung, calls left hanging
	// (SetStalls).
	Served, Rejected, Refused, Throttled, Slowed, Hung int
	// PromptTokens and CachedTokens sum the served calls' usage; CacheHits
	// counts served calls with cached tokens.
	PromptTokens, CachedTokens, CacheHits int
	Shards                                []ShardStats
}

// ShardStats are the counters of one shard.
type ShardStats struct {
	Served   int           // calls served
	MaxQueue int           // most calls ever waiting in the queue
	Busy     time.Duration // wall-clock time spent serving
}

// Stats returns a snapshot of the fleet's counters.
func (f *Fleet) Stats() Stats {
	var s Stats
	for _, p := range f.paths {
		ps := PathStats{Name: p.up.Name, Region: p.regionName, Model: p.model.Name,
			Rejected: int(p.rejected.Load()), Refused: int(p.refused.Load()), Throttled: int(p.throttled.Load()),
			Slowed: int(p.slowed.Load()), Hung: int(p.hung.Load())}
		p.mu.Lock()
		ps.PromptTokens, ps.CachedTokens, ps.CacheHits = p.prompt, p.cached, p.hits
		p.mu.Unlock()
		for _, sh := range p.shards {
			sh.mu.Lock()
			ss := ShardStats{Served: sh.served, MaxQueue: sh.maxQueue, Busy: sh.busyTime}
			sh.mu.Unlock()
			ps.Served += ss.Served
			ps.Shards = append(ps.Shards, ss)
		}
		s.Paths = append(s.Paths, ps)
	}
	return s
}

// simPath is one (region, model) Server and its shards.
type simPath struct {
	fleet      *Fleet
	region     *simRegion
	regionName string
	model      Model
	srv        *relaytest.Server
	up         Upstream
	shards     []*simShard
	cache      *PrefixCache // nil: none
	rr         atomic.Uint64

	rejected, refused, throttled, slowed, hung atomic.Int64

	mu                   sync.Mutex
	prompt, cached, hits int
}

func retryAfterMs(d time.Duration) http.Header {
	ms := float64(d) / float64(time.Millisecond)
	return http.Header{"Retry-After-Ms": {strconv.FormatFloat(ms, 'f', -1, 64)}}
}

// outage answers a call to a dark region, or one of a region's scripted
// burst of 429s.
func (p *simPath) outage() (relaytest.Fault, bool) {
	if p.region.dark.Load() {
		p.refused.Add(1)
		if p.fleet.cfg.DarkStatus != 0 {
			return relaytest.Fault{Status: p.fleet.cfg.DarkStatus}, true
		}
		return relaytest.Fault{Drop: true}, true
	}
	for {
		n := p.region.burst.Load()
		if n <= 0 {
			return relaytest.Fault{}, false
		}
		if p.region.burst.CompareAndSwap(n, n-1) {
			p.throttled.Add(1)
			return relaytest.Fault{Status: http.StatusTooManyRequests,
				Header: retryAfterMs(time.Duration(p.region.burstHint.Load()))}, true
		}
	}
}

// schedule schedules one call (a relaytest.Schedule): faults first, then
// the shard, the cache and the service time.
func (p *simPath) schedule(r *http.Request, rec relaytest.Recorded, f relaytest.Fault) (relaytest.Fault, func()) {
	switch rec.Endpoint {
	case prompt.Chat, prompt.Responses, prompt.Completions:
	default:
		return f, nil
	}
	if g, ok := p.outage(); ok {
		return g, nil
	}
	if !f.IsZero() {
		return f, nil // a fault the test scripted on this Server (Script, SetDefault)
	}
	if len(rec.Body) == 0 || !gjson.ValidBytes(rec.Body) {
		return f, nil // the Server answers 400
	}
	hang, factor := p.fleet.stall()
	if hang {
		p.hung.Add(1)
		return relaytest.Fault{Hang: true}, nil
	}
	promptToks := relaytest.PromptTokens(rec.Endpoint, rec.Body)
	output := p.model.DefaultOutput
	for _, k := range []string{"max_completion_tokens", "max_tokens", "max_output_tokens"} {
		if m := gjson.GetBytes(rec.Body, k).Int(); m > 0 {
			output = int(min(m, 1<<20))
			break
		}
	}

	sh := p.pick(promptToks)
	if !sh.enqueue(r.Context(), p.fleet.closing) {
		p.rejected.Add(1)
		st := p.fleet.cfg.FullStatus
		if st == http.StatusTooManyRequests {
			return relaytest.Fault{Status: st, Header: retryAfterMs(p.fleet.scale(p.fleet.cfg.FullRetryAfter))}, nil
		}
		return relaytest.Fault{Status: st}, nil
	}
	if factor != 1 {
		p.slowed.Add(1) // counted once a shard serves it, not when the full queue refused it
	}
	// The shard is ours until done; the call is served when its client
	// was still there for the whole answer (not a hedge's loser, an
	// attempt past its timeout or a stream given up on).
	start := time.Now()
	ctx := r.Context()
	done := func() { sh.release(ctx.Err() == nil, time.Since(start)) }

	cached := 0
	if p.cache != nil {
		cached = p.cache.lookup(rec.Endpoint, rec.Body, promptToks)
	}
	p.mu.Lock()
	p.prompt += promptToks
	p.cached += cached
	if cached > 0 {
		p.hits++
	}
	p.mu.Unlock()

	m := p.model
	stretch := func(d time.Duration) time.Duration { return time.Duration(float64(d) * factor) }
	first := stretch(p.fleet.scale(m.firstToken(promptToks, cached))) + time.Duration(p.region.slowFirst.Load())
	g := relaytest.Fault{CachedTokens: cached, CompletionTokens: output}
	if rec.Stream {
		g.FirstTokenDelay = first
		g.ChunkInterval = stretch(p.fleet.scale(m.DecodePerToken))
	} else {
		g.Delay = first + stretch(p.fleet.scale(time.Duration(output)*m.DecodePerToken))
	}
	return g, done
}

// pick chooses the shard of a request with prompt tokens.
func (p *simPath) pick(prompt int) *simShard {
	cfg := &p.fleet.cfg
	if p.fleet.clustering.Load() && prompt >= cfg.ClusterMin && prompt <= cfg.ClusterMax {
		return p.shards[0]
	}
	n := len(p.shards)
	start := int(p.rr.Add(1) % uint64(n))
	best, bestLoad := p.shards[start], math.MaxInt
	for i := range n {
		sh := p.shards[(start+i)%n]
		if l := sh.load(); l < bestLoad {
			best, bestLoad = sh, l
		}
	}
	return best
}

// simShard is a FIFO worker with a bounded queue: one call in service, at
// most limit waiting, served in arrival order.
type simShard struct {
	limit int

	mu       sync.Mutex
	busy     bool
	queue    []chan struct{}
	served   int
	maxQueue int
	busyTime time.Duration
}

// load is the number of calls in service or waiting.
func (s *simShard) load() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.queue)
	if s.busy {
		n++
	}
	return n
}

// enqueue waits for the shard. It returns false at once when the queue is
// full; it aborts the call (panic(http.ErrAbortHandler)) when ctx or closing
// ends first. On true the caller must call release.
func (s *simShard) enqueue(ctx interface{ Done() <-chan struct{} }, closing <-chan struct{}) bool {
	s.mu.Lock()
	if !s.busy {
		s.busy = true
		s.mu.Unlock()
		return true
	}
	if len(s.queue) >= s.limit {
		s.mu.Unlock()
		return false
	}
	ch := make(chan struct{})
	s.queue = append(s.queue, ch)
	s.maxQueue = max(s.maxQueue, len(s.queue))
	s.mu.Unlock()
	select {
	case <-ch:
		return true
	case <-ctx.Done():
	case <-closing:
	}
	s.mu.Lock()
	if i := slices.Index(s.queue, ch); i >= 0 {
		s.queue = slices.Delete(s.queue, i, i+1)
		s.mu.Unlock()
	} else {
		// The shard was handed to us meanwhile: pass it on.
		s.mu.Unlock()
		s.release(false, 0)
	}
	panic(http.ErrAbortHandler)
}

// release ends the call in service (served, after busy time) and hands the
// shard to the next waiting call, if any.
func (s *simShard) release(served bool, busy time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if served {
		s.served++
	}
	s.busyTime += busy
	if len(s.queue) > 0 {
		ch := s.queue[0]
		s.queue[0] = nil
		s.queue = s.queue[1:]
		close(ch) // s.busy stays true: the shard passes to ch's call
		return
	}
	s.busy = false
}

// PrefixCache is the prefix cache of one of a Fleet's Servers, on its
// own: an LRU of at most a number of chained hashes of fixed-size blocks of
// the router's canonical prompt, as the package documents it. It serves
// offline replays of traffic through the fleet's cache model, such as a
// sweep of cache sizes, with the very code the fleet runs. Safe for
// concurrent use by multiple goroutines.
type PrefixCache struct {
	c     *prefixCache
	block int
}

// NewPrefixCache returns an empty cache of at most blocks blocks (at least
// 1) of blockBytes bytes each (0: 64), as Config.CacheBlocks and
// BlockBytes size a fleet's.
func NewPrefixCache(blocks, blockBytes int) *PrefixCache {
	if blockBytes <= 0 {
		blockBytes = 64
	}
	return &PrefixCache{c: newPrefixCache(max(blocks, 1)), block: blockBytes}
}

// Serve does what a fleet's Server does with the prompt of a call to
// endpoint ("chat/completions", "responses" or "completions") whose body
// is body: it returns the call's prompt tokens and the cached tokens its
// answer would report (those of the canonical prompt's leading blocks
// found in the cache, at most the prompt tokens), and inserts or refreshes
// every block of the prompt.
func (c *PrefixCache) Serve(endpoint string, body []byte) (promptToks, cached int) {
	promptToks = relaytest.PromptTokens(endpoint, body)
	return promptToks, c.lookup(endpoint, body, promptToks)
}

// lookup returns the cached tokens of a prompt of promptToks tokens and
// inserts or refreshes its blocks.
func (c *PrefixCache) lookup(endpoint string, body []byte, promptToks int) int {
	text := string(prompt.AppendCanonical(nil, endpoint, string(body), math.MaxInt))
	if n := c.c.touch(text, c.block); n > 0 {
		return min(bpe.O200K().Count(text[:n]), promptToks)
	}
	return 0
}

// Len returns the number of blocks cached.
func (c *PrefixCache) Len() int { return c.c.len() }

// prefixCache is a bounded LRU of chained prefix-block hashes. Safe for
// concurrent use.
type prefixCache struct {
	mu    sync.Mutex
	cap   int
	order *list.List // front: most recent; values are uint64 hashes
	items map[uint64]*list.Element
}

func newPrefixCache(capacity int) *prefixCache {
	return &prefixCache{cap: capacity, order: list.New(), items: make(map[uint64]*list.Element, capacity)}
}

// touch looks up the full blocks of text, returns the length in bytes of the
// cached prefix (the leading blocks found), and inserts or refreshes every
// block, the first one last (most recent).
func (c *prefixCache) touch(text string, block int) int {
	n := len(text) / block
	if n == 0 {
		return 0
	}
	hashes := make([]uint64, n)
	h := fnv.New64a()
	for i := range n {
		h.Write([]byte(text[i*block : (i+1)*block]))
		hashes[i] = h.Sum64() // the running hash chains every earlier block
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	hit := 0
	for hit < n {
		if _, ok := c.items[hashes[hit]]; !ok {
			break
		}
		hit++
	}
	// Refresh from the last block to the first, so the first block is the
	// most recent: the LRU then evicts the tail of a prefix before its
	// head, as a radix-tree cache evicts leaves first. (Refreshing in order
	// would evict block 0 first and lose the whole chained prefix while its
	// later blocks still take room.)
	for i := n - 1; i >= 0; i-- {
		k := hashes[i]
		if e, ok := c.items[k]; ok {
			c.order.MoveToFront(e)
			continue
		}
		c.items[k] = c.order.PushFront(k)
		if c.order.Len() > c.cap {
			old := c.order.Back()
			c.order.Remove(old)
			delete(c.items, old.Value.(uint64))
		}
	}
	return hit * block
}

// len returns the number of blocks cached.
func (c *prefixCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}
