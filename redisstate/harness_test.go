package redisstate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/store"
)

// The fleet harness runs replicas as processes of their own, as a service
// runs them: the test binary runs again, once per replica, each a
// relay.Router at default settings (but for the scenario's limits) on a
// redisstate.State, with a client made as docs/fleet-state.md says,
// against a redis-server the test starts on a port of its own (so that it
// can stop and kill it) and a loopback upstream that enforces the limits
// the routers are given. Each replica runs its callers on the real clock
// and prints what they saw; the test checks counts and bounds, never a
// time: the host's speed changes what the run does, not whether the bounds
// hold. RELAY_FLEET_LONG=1 runs each scenario longer, with more callers.

// replicaEnv names the variable that makes the test binary a replica.
const replicaEnv = "RELAY_FLEET_REPLICA"

// replicaConfig is what a replica process is told.
type replicaConfig struct {
	ID, Replicas int
	Redis        string // address
	Prefix       string
	Upstream     string // base URL
	RPM, TPM     int
	MaxTokens    int       // of each request
	Budget       float64   // a budget on every request, 0: none
	Callers      int       // concurrent
	Requests     int       // per caller; 0: until Until
	Start, Until time.Time // wall clock
	Deadline     time.Duration
	Pause        time.Duration // a caller's pause after a refusal
	StateTimeout time.Duration // 0: the default
}

// replicaResult is what a replica reports.
type replicaResult struct {
	OK, Refused, Failed int
	Errors              map[string]int
	LateAnswers         int           // answered (RoundTrip returned) after the request's deadline
	Slowest             time.Duration // the slowest answer
	Fallbacks           uint64        // Router.StateFallbacks
	StateCalls          int
	StateP99, StateMax  time.Duration // of the State's commands, by the client's hook
	Leaked              string        // goroutines left after the router and client were done with
}

// runReplica is a replica process's work: it reads its configuration from
// the environment, runs its callers and prints its result as JSON.
func runReplica(raw string) int {
	var cfg replicaConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	res, err := replica(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	json.NewEncoder(os.Stdout).Encode(res)
	return 0
}

// timing is a go-redis hook that records each command's time.
type timing struct {
	mu  sync.Mutex
	lat []time.Duration
}

func (h *timing) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *timing) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *timing) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmd)
		d := time.Since(start)
		h.mu.Lock()
		h.lat = append(h.lat, d)
		h.mu.Unlock()
		return err
	}
}

func replica(cfg replicaConfig) (replicaResult, error) {
	client := redis.NewClient(&redis.Options{
		Addr:                  cfg.Redis,
		ContextTimeoutEnabled: true, // deadlines reach the connection
		DialerRetries:         1,    // a refused connection fails at once
		PoolSize:              128,  // a connection for every caller that may be waiting on one
		MinIdleConns:          32,   // opened by Load, before traffic
	})
	hook := &timing{}
	client.AddHook(hook)
	st := New(client, WithPrefix(cfg.Prefix))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err := st.Load(ctx)
	cancel()
	if err != nil {
		client.Close()
		return replicaResult{}, err
	}
	cfgR := relay.Config{
		Upstreams: []relay.Upstream{{Name: "a", BaseURL: cfg.Upstream, RPM: cfg.RPM, TPM: cfg.TPM}},
		State:     st, Replicas: cfg.Replicas, StateTimeout: cfg.StateTimeout,
		Retry:  relay.RetryConfig{MaxAttempts: 1},
		Prices: map[string]relay.Price{"m": {InputPerMTok: 1000, OutputPerMTok: 1000}}, // $1 a thousand tokens
	}
	if cfg.Budget > 0 {
		cfgR.Budgets = []relay.Budget{{Name: "cap", Limit: cfg.Budget, Window: relay.Window{Every: time.Hour}}}
	}
	r, err := relay.New(cfgR)
	if err != nil {
		client.Close()
		return replicaResult{}, err
	}
	time.Sleep(time.Until(cfg.Start))
	res := replicaResult{Errors: map[string]int{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for c := range cfg.Callers {
		wg.Go(func() {
			for i := 0; cfg.Requests == 0 || i < cfg.Requests; i++ {
				if cfg.Requests == 0 && !time.Now().Before(cfg.Until) {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), cfg.Deadline)
				status, took, err := answer(ctx, r, fmt.Sprintf("replica %d caller %d request %d", cfg.ID, c, i), cfg.MaxTokens)
				cancel()
				mu.Lock()
				res.Slowest = max(res.Slowest, took)
				if took > cfg.Deadline+cfg.Deadline/10 {
					res.LateAnswers++
				}
				refused := errors.Is(err, relay.ErrRateLimited) || errors.Is(err, relay.ErrBudgetExceeded) || errors.Is(err, relay.ErrCircuitOpen)
				switch {
				case err == nil && status == http.StatusOK:
					res.OK++
				case refused:
					res.Refused++
				default:
					res.Failed++
					key := fmt.Sprint(status)
					if err != nil {
						key = err.Error()
						if i := strings.Index(key, ": "); i > 0 && len(key) > 80 {
							key = key[:80]
						}
					}
					res.Errors[key]++
				}
				mu.Unlock()
				if refused || err != nil {
					time.Sleep(cfg.Pause)
				}
			}
		})
	}
	wg.Wait()
	res.Fallbacks = r.StateFallbacks()
	r.CloseIdleConnections()
	client.Close()
	hook.mu.Lock()
	lat := hook.lat
	hook.mu.Unlock()
	if len(lat) > 0 {
		slices.Sort(lat)
		res.StateCalls, res.StateP99, res.StateMax = len(lat), lat[len(lat)*99/100], lat[len(lat)-1]
	}
	if err := goleak.Find(goleak.IgnoreCurrent()); err != nil {
		res.Leaked = err.Error()
	}
	return res, nil
}

// answer sends one chat request of model m asking for maxTokens, reads
// and closes the answer, and says how long the answer (the response's
// headers, or an error) took: reading the body and closing it settle the
// request after that.
func answer(ctx context.Context, r http.RoundTripper, prompt string, maxTokens int) (int, time.Duration, error) {
	body := fmt.Sprintf(`{"model":"m","max_tokens":%d,"messages":[{"role":"user","content":%q}]}`, maxTokens, prompt)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://relay.test/v1/chat/completions", strings.NewReader(body))
	start := time.Now()
	resp, err := r.RoundTrip(req)
	took := time.Since(start)
	if err != nil {
		return 0, took, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, took, nil
}

// limitedUpstream is an OpenAI-compatible upstream on loopback that
// enforces an RPM and a TPM limit of its own (buckets of a minute of
// quota, as the router's; TPM charged with the tokens each call reports
// it used) and answers 429 past them. It answers each call with half its
// max_tokens as completion tokens, after delay.
type limitedUpstream struct {
	*httptest.Server
	lim   store.Limits
	st    *store.Local
	delay time.Duration
	hold  atomic.Int64 // Unix ns; when set, calls are answered at this time at the earliest
	mu    sync.Mutex
	at    []time.Time // of each call it served
	all   []time.Time // of each call that came, 429s too
	over  atomic.Int64
}

func newLimitedUpstream(t *testing.T, rpm, tpm int, delay time.Duration) *limitedUpstream {
	u := &limitedUpstream{lim: store.Limits{Name: "upstream", RPM: rpm, TPM: tpm}, st: store.NewLocal(), delay: delay}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.Close)
	return u
}

func (u *limitedUpstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var q struct {
		MaxTokens int `json:"max_tokens"`
	}
	json.Unmarshal(body, &q)
	prompt, completion := 20, q.MaxTokens/2
	u.mu.Lock()
	u.all = append(u.all, time.Now())
	u.mu.Unlock()
	v, _ := u.st.Admit(r.Context(), u.lim, store.Ask{Tokens: prompt + completion}, time.Now())
	if !v.Taken {
		u.over.Add(1)
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, `{"error":{"message":"rate limited","type":"rate_limit_exceeded"}}`)
		return
	}
	u.mu.Lock()
	u.at = append(u.at, time.Now())
	u.mu.Unlock()
	time.Sleep(max(u.delay, time.Until(time.Unix(0, u.hold.Load()))))
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":%d}}`, prompt, completion)
}

// served counts the calls served in [from, to).
func (u *limitedUpstream) served(from, to time.Time) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return within(u.at, from, to)
}

// came counts the calls that came in [from, to), 429s too.
func (u *limitedUpstream) came(from, to time.Time) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return within(u.all, from, to)
}

func within(times []time.Time, from, to time.Time) int {
	n := 0
	for _, at := range times {
		if !at.Before(from) && at.Before(to) {
			n++
		}
	}
	return n
}

// span returns the time between the first and the last call served.
func (u *limitedUpstream) span() time.Duration {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.at) < 2 {
		return 0
	}
	return u.at[len(u.at)-1].Sub(u.at[0])
}

// runFleet starts n replica processes of cfg and returns their results.
func runFleet(t *testing.T, n int, cfg replicaConfig) []replicaResult {
	t.Helper()
	out := make([]replicaResult, n)
	var wg sync.WaitGroup
	for i := range n {
		c := cfg
		c.ID, c.Replicas = i, n
		raw, _ := json.Marshal(c)
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), replicaEnv+"="+string(raw))
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			if err := cmd.Wait(); err != nil {
				t.Errorf("replica %d: %v: %s", i, err, stderr.String())
				return
			}
			if err := json.Unmarshal(stdout.Bytes(), &out[i]); err != nil {
				t.Errorf("replica %d: %v: %q", i, err, stdout.String())
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return out
}

// fleetLong reports whether the long form of the harness runs.
func fleetLong() bool { return os.Getenv("RELAY_FLEET_LONG") == "1" }

// sum adds a field of every result.
func sum[T int | uint64](rs []replicaResult, f func(replicaResult) T) T {
	var n T
	for _, r := range rs {
		n += f(r)
	}
	return n
}

// checkReplicas checks what every scenario must show: every request was
// answered within its deadline, no goroutine was left in a replica, and
// nothing failed but refusals (and what allowed lists).
//
// Whether a request is answered within its deadline depends on the host's
// speed as well as on the router (a replica process that gets no CPU for
// a second answers late, whatever it does): the default form, which runs
// in the test command on any host, logs late answers and requests that
// failed at their deadline; the long form (RELAY_FLEET_LONG=1), run on a
// quiet host to measure, fails on them.
func checkReplicas(t *testing.T, rs []replicaResult, allowed ...string) {
	t.Helper()
	if !fleetLong() {
		allowed = append(allowed, "context deadline exceeded")
	}
	for i, r := range rs {
		t.Logf("replica %d: %d ok, %d refused, %d failed %v; slowest answer %s; %d fallbacks; %d State commands, p99 %s, max %s",
			i, r.OK, r.Refused, r.Failed, r.Errors, r.Slowest.Round(time.Millisecond), r.Fallbacks, r.StateCalls,
			r.StateP99.Round(10*time.Microsecond), r.StateMax.Round(10*time.Microsecond))
		if r.LateAnswers > 0 && !fleetLong() {
			t.Logf("replica %d: %d requests answered after their deadline (the slowest in %s): timing, not counted outside the long form", i, r.LateAnswers, r.Slowest)
		} else if r.LateAnswers > 0 {
			t.Errorf("replica %d: %d requests answered after their deadline (the slowest in %s)", i, r.LateAnswers, r.Slowest)
		}
		if r.Leaked != "" {
			t.Errorf("replica %d: goroutines left: %s", i, r.Leaked)
		}
		for e, n := range r.Errors {
			if !slices.ContainsFunc(allowed, func(a string) bool { return strings.Contains(e, a) }) {
				t.Errorf("replica %d: %d requests failed: %s", i, n, e)
			}
		}
	}
}

// harnessFleet is the common setup: a redis-server of the test's own, a
// limited upstream, and a configuration for the replicas.
func harnessFleet(t *testing.T, rpm, tpm int, delay time.Duration) (*server, *limitedUpstream, replicaConfig) {
	if testing.Short() {
		t.Skip("the fleet harness runs replica processes for seconds")
	}
	srv := startServer(t, "")
	up := newLimitedUpstream(t, rpm, tpm, delay)
	cfg := replicaConfig{Redis: srv.addr(), Prefix: fmt.Sprintf("harness-%d-%d", os.Getpid(), time.Now().UnixNano()),
		Upstream: up.URL, RPM: rpm, TPM: tpm, MaxTokens: 100, Callers: 100, Deadline: 5 * time.Second,
		Pause: 50 * time.Millisecond, StateTimeout: harnessTimeout()}
	return srv, up, cfg
}

// harnessTimeout is the StateTimeout the replicas are given:
// RELAY_FLEET_STATE_TIMEOUT, or 0 (the default).
func harnessTimeout() time.Duration {
	d, _ := time.ParseDuration(os.Getenv("RELAY_FLEET_STATE_TIMEOUT"))
	return d
}

// TestHarnessLimits: 4 replicas × 100 callers against an upstream of RPM
// 600 and TPM 60,000 that enforces them: the upstream serves at most what
// its buckets allow (+2%), refuses (429) at most 1% of the calls, and no
// State call falls back on the healthy Redis at default settings.
func TestHarnessLimits(t *testing.T) {
	for _, c := range []struct {
		name     string
		rpm, tpm int
		tokens   int // charged per call, as the upstream counts (20 + max_tokens/2)
	}{
		{"RPM", 600, 0, 0},
		{"TPM", 0, 60_000, 20 + 500},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, up, cfg := harnessFleet(t, c.rpm, c.tpm, 0)
			cfg.MaxTokens = 1000
			span := 6 * time.Second
			if fleetLong() {
				span = 60 * time.Second
			}
			cfg.Start = time.Now().Add(2 * time.Second)
			cfg.Until = cfg.Start.Add(span)
			rs := runFleet(t, 4, cfg)
			checkReplicas(t, rs, "429")
			calls := up.served(cfg.Start.Add(-time.Hour), time.Now())
			// A bucket's bound over the calls' span: its minute of quota
			// and the refill since the first call.
			var bound float64
			switch {
			case c.rpm > 0:
				bound = float64(c.rpm) * (1 + up.span().Minutes())
			default:
				bound = float64(c.tpm) * (1 + up.span().Minutes()) / float64(c.tokens)
			}
			over := up.over.Load()
			t.Logf("upstream served %d calls in %s (bound %.0f), refused %d (429)", calls, up.span().Round(time.Millisecond), bound, over)
			if float64(calls) > 1.02*bound {
				t.Errorf("the upstream served %d calls, over its bound %.0f + 2%%", calls, bound)
			}
			if float64(over) > 0.01*float64(calls+int(over)) {
				t.Errorf("the upstream refused %d of %d calls (429): over 1%%", over, calls+int(over))
			}
			noFallbacks(t, rs)
			if ok := sum(rs, func(r replicaResult) int { return r.OK }); ok != calls {
				t.Errorf("%d requests answered 200, the upstream served %d", ok, calls)
			}
		})
	}
}

// TestHarnessBudget: 4 replicas × 100 callers send a request each at once,
// against a budget that fits 37 (each reserves about $1.01 of $37.80; the
// upstream answers them all 3 s after the start, once every request has
// reserved or been refused): exactly 37 reach the upstream, no State call
// falls back, and once every request settled the fleet's ledger holds no
// reservation.
func TestHarnessBudget(t *testing.T) {
	srv, up, cfg := harnessFleet(t, 0, 0, 0)
	cfg.MaxTokens, cfg.Requests, cfg.Budget, cfg.Deadline = 1000, 1, 37.8, 10*time.Second
	cfg.Start = time.Now().Add(2 * time.Second)
	up.hold.Store(cfg.Start.Add(3 * time.Second).UnixNano())
	rs := runFleet(t, 4, cfg)
	checkReplicas(t, rs)
	calls := up.served(cfg.Start.Add(-time.Hour), time.Now())
	fallbacks := sum(rs, func(r replicaResult) uint64 { return r.Fallbacks })
	t.Logf("upstream served %d calls for a budget that fits 37 (%d State calls fell back)", calls, fallbacks)
	// A replica that falls back reserves against its share of what the
	// fleet had left: never more than 37 in all, and exactly 37 when
	// every call was answered.
	if calls > 37 || calls != 37 && fallbacks == 0 {
		t.Errorf("%d calls reached the upstream, want 37", calls)
	}
	noFallbacks(t, rs)
	checkNothingReserved(t, srv, cfg)
}

// noFallbacks checks, in the harness's long form (RELAY_FLEET_LONG=1),
// that no State call fell back on the healthy Redis at default settings.
// (It is a statement about the host's speed too, so the default form only
// logs the count.)
func noFallbacks(t *testing.T, rs []replicaResult) {
	t.Helper()
	n := sum(rs, func(r replicaResult) uint64 { return r.Fallbacks })
	if n > 0 && fleetLong() && harnessTimeout() == 0 {
		t.Errorf("%d State calls fell back on a healthy Redis", n)
	}
}

// checkNothingReserved checks that the fleet's budget ledger of the
// current window holds no reservation.
func checkNothingReserved(t *testing.T, srv *server, cfg replicaConfig) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: srv.addr()})
	defer c.Close()
	s := New(c, WithPrefix(cfg.Prefix))
	now := time.Now()
	for _, end := range []time.Time{now.Truncate(time.Hour).Add(time.Hour), now.Truncate(time.Hour)} {
		_, reserved, err := s.Usage(ctxT(t), store.BudgetKey{Budget: "cap", Window: end}, now)
		if err != nil {
			t.Fatal(err)
		}
		if reserved != 0 {
			t.Errorf("the fleet's ledger (window ending %s) holds %d reserved after every request settled", end.Format("15:04"), reserved)
		}
	}
}

// TestHarnessRedisStopped: the fleet spends its minute of RPM 120 (4 ×
// 25 callers), then Redis stops answering (SIGSTOP) for 3 s. Each replica
// decides from its share, kept in step with the fleet: the upstream gets
// at most what the fleet had left (nothing) plus the limit's refill over
// the stop, 120 × 3/60 = 6 calls, and one more per replica for a call
// admitted as the stop began (docs/fleet-state.md). Every request is
// answered within its deadline. (A share that started full let each
// replica's 30 through, and the upstream refused most with 429.)
func TestHarnessRedisStopped(t *testing.T) {
	srv, up, cfg := harnessFleet(t, 120, 0, 0)
	cfg.Callers, cfg.Deadline = 25, 2*time.Second
	cfg.Start = time.Now().Add(2 * time.Second)
	stop := cfg.Start.Add(2 * time.Second) // the minute's 120 are spent in the first instants
	cfg.Until = stop.Add(5 * time.Second)
	done := make(chan []replicaResult)
	go func() { done <- runFleet(t, 4, cfg) }()
	time.Sleep(time.Until(stop))
	srv.signal(syscall.SIGSTOP)
	stopped := time.Now()
	time.Sleep(3 * time.Second)
	srv.signal(syscall.SIGCONT)
	resumed := time.Now()
	rs := <-done
	// Requests whose State calls waited for the stopped Redis (at most
	// StateTimeout each, then fail-fast) may reach their deadline; a call
	// the fleet admitted can reach the upstream a little later than the
	// one before it did, and find the upstream's own bucket short (429).
	checkReplicas(t, rs, "context deadline exceeded", "429")
	before, during := up.came(cfg.Start.Add(-time.Hour), stopped), up.came(stopped, resumed)
	bound := 120*resumed.Sub(stopped).Minutes() + 4
	t.Logf("%d calls came to the upstream before the stop, %d during its %s (bound %.1f; %d served), %d after", before, during,
		resumed.Sub(stopped).Round(time.Millisecond), bound, up.served(stopped, resumed), up.came(resumed, time.Now()))
	if float64(during) > bound {
		t.Errorf("%d calls came to the upstream while Redis was stopped, over the bound %.1f", during, bound)
	}
	if n := sum(rs, func(r replicaResult) uint64 { return r.Fallbacks }); n == 0 {
		t.Error("no State call fell back: Redis was not stopped while the replicas ran")
	}
}

// TestHarnessRedisKilled: the replicas run with a budget; Redis is killed
// (SIGKILL) and restarted a second later, empty. Every request is answered
// within its deadline, no goroutine is left in a replica, and once every
// request settled the restarted Redis holds no reservation.
func TestHarnessRedisKilled(t *testing.T) {
	srv, _, cfg := harnessFleet(t, 600, 0, 0)
	cfg.Callers, cfg.Deadline, cfg.Budget = 25, 2*time.Second, 1e6
	cfg.Start = time.Now().Add(2 * time.Second)
	kill := cfg.Start.Add(2 * time.Second)
	cfg.Until = kill.Add(4 * time.Second)
	done := make(chan []replicaResult)
	go func() { done <- runFleet(t, 4, cfg) }()
	time.Sleep(time.Until(kill))
	srv.kill()
	time.Sleep(time.Second)
	restarted := startServer(t, srv.port)
	rs := <-done
	// A Redis restarted without persistence comes back empty: its buckets
	// are full again, and the fleet's next burst can go past what the
	// upstream, which forgot nothing, allows (429).
	checkReplicas(t, rs, "context deadline exceeded", "429")
	if n := sum(rs, func(r replicaResult) uint64 { return r.Fallbacks }); n == 0 {
		t.Error("no State call fell back: Redis was not down while the replicas ran")
	}
	checkNothingReserved(t, restarted, cfg)
}
