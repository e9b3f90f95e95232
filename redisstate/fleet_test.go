package redisstate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/store"
)

// The fleet tests run four relay.Routers sharing one State, as four
// replicas of a service would, against an in-memory upstream, and check
// what the upstream receives. Each also runs the routers with State nil
// (every replica on its own), to show the test would catch a State that
// shares nothing.
//
// They run on the real redis-server (RELAY_TEST_REDIS), or on miniredis
// when none answers: miniredis runs every script through a Lua
// interpreter written in Go, under one lock, which a loaded machine (or
// the race detector) can slow past the State's timeout.
//
// They need the router to call Config.State. Until it does they skip;
// RELAY_FLEET_TESTS=1 runs them anyway (and they fail).

// fleetBackend returns the real redis-server, or miniredis when none
// answers.
func fleetBackend(t *testing.T) *backend {
	c, h := newClient(t, realAddr())
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Logf("no redis-server at %s: on miniredis", realAddr())
		return newMini(t)
	}
	return &backend{name: "redis", c: c, calls: h}
}

// needWiring skips the test unless the router calls its State.
func needWiring(t *testing.T, b *backend) {
	if os.Getenv("RELAY_FLEET_TESTS") == "1" {
		return
	}
	sp := &spy{State: b.state(t)}
	base := newFleetBase(newFleetClock())
	r, err := relay.New(relay.Config{State: sp, Base: base, Clock: base.clock,
		Upstreams: []relay.Upstream{{Name: "a", BaseURL: "http://a.test/v1", RPM: 10}}})
	if err != nil {
		t.Fatal(err)
	}
	send(r, "wiring")
	if sp.admits.Load() == 0 {
		t.Skip("needs the router's State wiring: relay.Router does not call Config.State yet (RELAY_FLEET_TESTS=1 runs this anyway)")
	}
}

// spy counts a State's admissions.
type spy struct {
	store.State
	admits atomic.Int64
}

func (s *spy) Admit(ctx context.Context, u store.Limits, a store.Ask, now time.Time) (store.Verdict, error) {
	s.admits.Add(1)
	return s.State.Admit(ctx, u, a, now)
}

// fleetClock is the routers' clock: it moves only when the test sets it
// (never backwards); waits use real time.
type fleetClock struct {
	start time.Time
	ns    atomic.Int64
}

func newFleetClock() *fleetClock { return &fleetClock{start: t0} }

func (c *fleetClock) Now() time.Time { return c.start.Add(time.Duration(c.ns.Load())) }

// at moves the clock to start+d, unless it is already past it.
func (c *fleetClock) at(d time.Duration) {
	for {
		old := c.ns.Load()
		if old >= int64(d) || c.ns.CompareAndSwap(old, int64(d)) {
			return
		}
	}
}

func (c *fleetClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

func (c *fleetClock) AfterFunc(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}

// fleetBase is the upstreams: it answers every call at once, with a
// status set per upstream (by host) and a fixed usage, and records when
// (by the fleet's clock) each upstream was called.
type fleetBase struct {
	clock              *fleetClock
	prompt, completion int

	mu     sync.Mutex
	calls  map[string][]time.Time
	status map[string]int
}

func newFleetBase(c *fleetClock) *fleetBase {
	return &fleetBase{clock: c, prompt: 8, completion: 42, calls: map[string][]time.Time{}, status: map[string]int{}}
}

func (b *fleetBase) RoundTrip(r *http.Request) (*http.Response, error) {
	io.Copy(io.Discard, r.Body)
	r.Body.Close()
	host := strings.TrimSuffix(r.URL.Host, ".test")
	b.mu.Lock()
	b.calls[host] = append(b.calls[host], b.clock.Now())
	status := b.status[host]
	b.mu.Unlock()
	if status == 0 {
		status = 200
	}
	body := fmt.Sprintf(`{"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"completion_tokens":%d}}`, b.prompt, b.completion)
	if status != 200 {
		body = `{"error":{"message":"down","type":"server_error"}}`
	}
	return &http.Response{StatusCode: status, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(strings.NewReader(body)), Request: r}, nil
}

func (b *fleetBase) set(upstream string, status int) {
	b.mu.Lock()
	b.status[upstream] = status
	b.mu.Unlock()
}

func (b *fleetBase) count(upstream string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.calls[upstream])
}

// perMinute counts upstream's calls in each minute from the clock's start.
func (b *fleetBase) perMinute(upstream string) []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []int
	for _, at := range b.calls[upstream] {
		m := int(at.Sub(b.clock.start) / time.Minute)
		for len(out) <= m {
			out = append(out, 0)
		}
		out[m]++
	}
	return out
}

// send makes one chat request through r, reads and closes the answer.
func send(r *relay.Router, prompt string) (int, error) {
	return sendWith(context.Background(), r, prompt, 92)
}

// sendWith sends one chat request of model m asking for maxTokens, reads
// and closes the answer.
func sendWith(ctx context.Context, r http.RoundTripper, prompt string, maxTokens int) (int, error) {
	status, _, err := answer(ctx, r, prompt, maxTokens)
	return status, err
}

// costs adds up the cost of the reports it is given.
type costs struct {
	mu    sync.Mutex
	total float64
}

func (c *costs) add(r relay.Report) {
	c.mu.Lock()
	c.total += r.Cost
	c.mu.Unlock()
}

func (c *costs) sum() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total
}

// replicas returns 4 routers of cfg sharing st (nil: each on its own).
// The State's calls get 5 s each: these tests check what the fleet shares,
// not what the routers do when it is slow (a loaded 2-core machine, with
// the race detector, has missed a second); each checks at its end that no
// call fell back to the local share.
func replicas(t *testing.T, st store.State, cfg relay.Config) []*relay.Router {
	out := make([]*relay.Router, 4)
	for i := range out {
		c := cfg
		c.State, c.Replicas, c.StateTimeout = st, 4, 5*time.Second
		// The fleet's clock jumps ahead while a goroutine waits for a
		// core: the latency a request measures on it is not the
		// upstream's, and must not open the latency breaker.
		c.Breaker.P99 = -1
		r, err := relay.New(c)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = r
	}
	t.Cleanup(func() {
		for i, r := range out {
			if n := r.StateFallbacks(); n > 0 {
				t.Errorf("replica %d: %d State calls fell back to in-process state", i, n)
			}
		}
	})
	return out
}

// modes runs f with the routers sharing a State on b, then with State nil.
func modes(t *testing.T, b *backend, f func(t *testing.T, shared bool, st store.State) int) {
	got := map[bool]int{}
	for _, shared := range []bool{true, false} {
		t.Run(map[bool]string{true: "shared", false: "per-process"}[shared], func(t *testing.T) {
			var st store.State
			if shared {
				st = b.state(t)
			}
			got[shared] = f(t, shared, st)
		})
	}
	if got[true] > 0 && float64(got[false]) < 3.5*float64(got[true]) {
		t.Errorf("per-process state let %d through, shared %d: expected about 4×", got[false], got[true])
	}
}

// load sends n requests from 32 goroutines over span of the fleet's time,
// request k at k·span/n, round robin over the routers.
func load(rs []*relay.Router, clock *fleetClock, n int, span time.Duration) (refused int64, first error) {
	var next, no atomic.Int64
	var once sync.Once
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for {
				k := next.Add(1) - 1
				if k >= int64(n) {
					return
				}
				clock.at(time.Duration(k) * span / time.Duration(n))
				if _, err := send(rs[k%int64(len(rs))], fmt.Sprintf("prompt %d", k)); err != nil {
					no.Add(1)
					once.Do(func() { first = fmt.Errorf("request %d at %v: %w", k, clock.Now().Sub(clock.start), err) })
				}
			}
		})
	}
	wg.Wait()
	return no.Load(), first
}

// TestFleetRPM: 2400 requests over three minutes on four replicas of an
// upstream with RPM 120: shared, the upstream gets its bucket (120) plus
// 120 a minute, at most 2% more; on its own each replica lets that
// through, so the upstream gets 4× its limit.
func TestFleetRPM(t *testing.T) {
	b := fleetBackend(t)
	needWiring(t, b)
	modes(t, b, func(t *testing.T, shared bool, st store.State) int {
		clock := newFleetClock()
		base := newFleetBase(clock)
		var rec *admissions
		if shared {
			rec = &admissions{State: st, start: clock.start}
			st = rec
		}
		rs := replicas(t, st, relay.Config{Base: base, Clock: clock,
			Upstreams: []relay.Upstream{{Name: "a", BaseURL: "http://a.test/v1", RPM: 120}},
			Limits:    relay.Limits{MaxWait: -1}, Retry: relay.RetryConfig{MaxAttempts: 1}})
		refused, first := load(rs, clock, 2400, 3*time.Minute)
		got := base.count("a")
		t.Logf("upstream got %d (per minute of arrival %v), %d refused, the first: %v", got, base.perMinute("a"), refused, first)
		if !shared {
			return got
		}
		if limit := 1.02 * (120 + 3*120); float64(got) > limit || float64(got) < 0.9*limit {
			t.Errorf("upstream got %d in 3 minutes, want about 480 (bucket + 3 minutes), at most %.0f", got, limit)
		}
		// A minute after the first (whose bucket starts full) admits
		// at most the minute's refill. Counted by the time each
		// replica admitted the request: with 32 requests in flight, an
		// arrival can land a second or two after its admission, across
		// a minute's end.
		minutes := rec.perMinute()
		t.Logf("admitted per minute %v", minutes)
		for m, n := range minutes[1:] {
			if float64(n) > 1.02*120+1 {
				t.Errorf("minute %d: %d requests admitted, over 120 +2%%", m+1, n)
			}
		}
		return got
	})
}

// admissions is a State that counts, per minute of the time the router
// passed, the requests it admitted less those given back.
type admissions struct {
	store.State
	start time.Time
	mu    sync.Mutex
	n     []int
}

func (a *admissions) count(now time.Time, d int) {
	m := int(now.Sub(a.start) / time.Minute)
	a.mu.Lock()
	for len(a.n) <= m {
		a.n = append(a.n, 0)
	}
	a.n[m] += d
	a.mu.Unlock()
}

func (a *admissions) Admit(ctx context.Context, u store.Limits, ask store.Ask, now time.Time) (store.Verdict, error) {
	v, err := a.State.Admit(ctx, u, ask, now)
	if err == nil && v.Taken {
		a.count(now, 1)
	}
	return v, err
}

func (a *admissions) Refund(ctx context.Context, u store.Limits, requests, tokens int, now time.Time) error {
	err := a.State.Refund(ctx, u, requests, tokens, now)
	if err == nil && requests > 0 {
		a.count(now, -requests)
	}
	return err
}

func (a *admissions) perMinute() []int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.n)
}

// TestFleetTPM: the same with TPM 12000 and 4800 requests, each charging
// its prompt plus max_tokens (≈100 tokens) and using 50, the rest given
// back when its usage is known: shared, the upstream gets at most a
// bucket plus 12000 tokens a minute; on their own, 4× that.
func TestFleetTPM(t *testing.T) {
	b := fleetBackend(t)
	needWiring(t, b)
	modes(t, b, func(t *testing.T, shared bool, st store.State) int {
		clock := newFleetClock()
		base := newFleetBase(clock)
		rs := replicas(t, st, relay.Config{Base: base, Clock: clock,
			Upstreams: []relay.Upstream{{Name: "a", BaseURL: "http://a.test/v1", TPM: 12000}},
			Limits:    relay.Limits{MaxWait: -1}, Retry: relay.RetryConfig{MaxAttempts: 1}})
		load(rs, clock, 4800, 3*time.Minute)
		used := base.count("a") * (base.prompt + base.completion)
		t.Logf("upstream used %d tokens (%d requests)", used, base.count("a"))
		if !shared {
			return used
		}
		limit := 1.02*(12000+3*12000) + 100
		if float64(used) > limit {
			t.Errorf("upstream used %d tokens in 3 minutes, at most %.0f", used, limit)
		}
		if float64(used) < 0.8*48000 {
			t.Errorf("upstream used %d tokens of 48000: the unused part of each charge was not given back", used)
		}
		return used
	})
}

// TestFleetBreaker: a circuit opened by one replica keeps the other three
// off the upstream; after the cooldown exactly one replica probes it;
// after a successful probe all send to it again.
func TestFleetBreaker(t *testing.T) {
	b := fleetBackend(t)
	needWiring(t, b)
	for _, shared := range []bool{true, false} {
		t.Run(map[bool]string{true: "shared", false: "per-process"}[shared], func(t *testing.T) {
			var st store.State
			if shared {
				st = b.state(t)
			}
			clock := newFleetClock()
			base := newFleetBase(clock)
			rs := replicas(t, st, relay.Config{Base: base, Clock: clock,
				Upstreams: []relay.Upstream{{Name: "a", BaseURL: "http://a.test/v1"}, {Name: "b", BaseURL: "http://b.test/v1"}},
				Breaker:   relay.BreakerConfig{Failures: 2, Cooldown: 30 * time.Second},
				Retry:     relay.RetryConfig{MaxAttempts: 1}})
			base.set("a", 500)
			// Replica 0 meets the failures and opens the circuit.
			for i := 0; base.count("a") < 3; i++ {
				if i == 200 {
					t.Fatalf("200 requests and upstream a got only %d", base.count("a"))
				}
				send(rs[0], fmt.Sprintf("opening %d", i))
			}
			// The other replicas keep off it.
			before := base.count("a")
			for i := range 90 {
				send(rs[1+i%3], fmt.Sprintf("after %d", i))
			}
			others := base.count("a") - before
			if !shared {
				if others == 0 {
					t.Fatal("per-process: the other replicas kept off a circuit they never saw open")
				}
				return
			}
			if others != 0 {
				t.Fatalf("the other replicas sent %d requests to the open upstream", others)
			}
			// Half-open: of 64 concurrent requests on the four
			// replicas, one probes; it fails, the circuit opens again.
			clock.advance(31 * time.Second)
			before = base.count("a")
			var wg sync.WaitGroup
			for i := range 64 {
				wg.Go(func() { send(rs[i%4], fmt.Sprintf("half-open %d", i)) })
			}
			wg.Wait()
			if probes := base.count("a") - before; probes != 1 {
				t.Fatalf("%d requests reached the half-open upstream, want exactly 1 probe", probes)
			}
			// Healthy again: after the (doubled) cooldown, a probe
			// closes the circuit and every replica uses it.
			base.set("a", 200)
			clock.advance(6 * time.Minute)
			before = base.count("a")
			for i := range 200 {
				send(rs[i%4], fmt.Sprintf("closed %d", i))
			}
			if n := base.count("a") - before; n < 40 {
				t.Fatalf("after recovery upstream a got %d of 200 requests", n)
			}
		})
	}
}

// TestFleetBudget: four replicas share a $50 budget; requests reserve $1
// and cost $0.50. Shared, spend never passes $50; on their own, each
// replica spends its $50.
func TestFleetBudget(t *testing.T) {
	b := fleetBackend(t)
	needWiring(t, b)
	modes(t, b, func(t *testing.T, shared bool, st store.State) int {
		clock := newFleetClock()
		base := newFleetBase(clock)
		spent := &costs{}
		rs := replicas(t, st, relay.Config{Base: base, Clock: clock, OnReport: spent.add,
			Prices:    map[string]relay.Price{"m": {InputPerMTok: 1e4, OutputPerMTok: 1e4}}, // 1¢ a token
			Upstreams: []relay.Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
			Retry:     relay.RetryConfig{MaxAttempts: 1},
			Budgets:   []relay.Budget{{Name: "cap", Limit: 50, Window: relay.Window{Every: time.Hour}}}})
		var refused atomic.Int64
		var wg sync.WaitGroup
		for g := range 32 {
			wg.Go(func() {
				for i := range 16 {
					if _, err := send(rs[g%4], fmt.Sprintf("budget %d %d", g, i)); errors.Is(err, relay.ErrBudgetExceeded) {
						refused.Add(1)
					}
				}
			})
		}
		wg.Wait()
		total := spent.sum()
		t.Logf("spent $%.2f of $50 (%d calls, %d refused)", total, base.count("a"), refused.Load())
		if !shared {
			return int(total)
		}
		if total > 50+1e-9 {
			t.Errorf("the fleet spent $%.2f of a $50 budget", total)
		}
		if total < 40 {
			t.Errorf("the fleet spent only $%.2f of $50: reservations were not settled", total)
		}
		sp := rs[3].Spend()
		if len(sp) != 1 || sp[0].Spent < total-1e-6 || sp[0].Spent > total+1e-6 || sp[0].Reserved != 0 {
			t.Errorf("Router.Spend on a replica: %+v, want the fleet's $%.2f and nothing reserved", sp, total)
		}
		return int(total)
	})
}

// TestFleetRedisDown: four replicas share a State on a redis-server that
// is killed mid-run and restarted. While it is down every request is
// still decided, each replica keeping to its share (RPM/Replicas), so the
// upstream gets at most what the fleet's limit allows; when it is back
// the replicas share again by themselves. (StateTimeout is a second, as
// in the other fleet tests: a refused connection fails at once anyway.)
func TestFleetRedisDown(t *testing.T) {
	needWiring(t, newMini(t))
	srv := startServer(t, "")
	// One dial attempt: a refused connection fails at once instead of
	// retrying until the deadline (a second here, to keep the shared
	// phases free of timeouts on a loaded machine).
	c := redis.NewClient(&redis.Options{Addr: srv.addr(), ContextTimeoutEnabled: true, DialerRetries: 1})
	defer closeClient(t, c)
	st := New(c)
	// Each replica has a clock of its own, as a process does.
	base := newFleetBase(newFleetClock())
	rs := make([]*relay.Router, 4)
	clocks := make([]*fleetClock, 4)
	for i := range rs {
		clocks[i] = newFleetClock()
		r, err := relay.New(relay.Config{Base: base, Clock: clocks[i], State: st, Replicas: 4, StateTimeout: time.Second,
			Upstreams: []relay.Upstream{{Name: "a", BaseURL: "http://a.test/v1", RPM: 120}},
			Limits:    relay.Limits{MaxWait: -1}, Retry: relay.RetryConfig{MaxAttempts: 1}})
		if err != nil {
			t.Fatal(err)
		}
		rs[i] = r
	}
	fallbacks := func() (n uint64) {
		for _, r := range rs {
			n += r.StateFallbacks()
		}
		return n
	}
	// A minute shared, a minute down, a minute shared again; each replica
	// sends 200 requests a minute, in order of its own clock.
	phase := func(name string, m int) (got int) {
		before := base.count("a")
		var wg sync.WaitGroup
		var failed atomic.Int64
		for i, r := range rs {
			wg.Go(func() {
				for j := range 200 {
					clocks[i].at(time.Duration(m)*time.Minute + time.Duration(j)*time.Minute/200)
					if _, err := send(r, fmt.Sprintf("%s %d %d", name, i, j)); err != nil && !errors.Is(err, relay.ErrRateLimited) {
						failed.Add(1)
					}
				}
			})
		}
		wg.Wait()
		if failed.Load() > 0 {
			t.Errorf("%s: %d requests failed with another error than ErrRateLimited", name, failed.Load())
		}
		got = base.count("a") - before
		t.Logf("%s: upstream got %d, %d State calls fell back so far", name, got, fallbacks())
		return got
	}
	if got := phase("shared", 0); got > 245 || fallbacks() > 0 {
		t.Fatalf("shared minute: upstream got %d (bucket 120 + 120), %d fallbacks", got, fallbacks())
	}
	srv.kill()
	// Each replica's share (30) starts where the fleet was, empty after a
	// minute of 800 requests: the fleet gets a minute of refill, 120.
	if got := phase("redis down", 1); got > 4*31 || got < 4*25 || fallbacks() == 0 {
		t.Fatalf("redis down: upstream got %d, want about 4 × 30, %d fallbacks", got, fallbacks())
	}
	restarted := startServer(t, srv.port)
	defer restarted.kill()
	time.Sleep(200 * time.Millisecond) // the fail-fast backoff
	// Wait for the first shared call through for upstream a (each
	// upstream's keys fail fast on their own), then a minute shared
	// again.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		_, err := st.Admit(ctx, store.Limits{Name: "a"}, store.Ask{}, t0) // takes nothing
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the State does not answer 10s after the restart: %v", err)
		}
	}
	down := fallbacks()
	if got := phase("back", 2); got > 245 {
		t.Fatalf("after the restart: upstream got %d", got)
	}
	if n := fallbacks() - down; n > 0 {
		t.Fatalf("%d fallbacks after Redis came back", n)
	}
}
