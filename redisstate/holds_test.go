package redisstate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
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

// Regression tests of holds and refunds across the fleet: each failed
// before the fix named in its comment.

// slowProxy forwards TCP to a Redis, delaying every reply by delay: a
// Redis that executes commands but answers late.
type slowProxy struct {
	l     net.Listener
	to    string
	delay atomic.Int64
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func newSlowProxy(t *testing.T, to string) *slowProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &slowProxy{l: l, to: to}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", to)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); io.Copy(s, c) }()
			go func() {
				defer p.wg.Done()
				buf := make([]byte, 64<<10)
				for {
					n, err := s.Read(buf)
					if n > 0 {
						time.Sleep(time.Duration(p.delay.Load()))
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						c.Close()
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *slowProxy) addr() string { return p.l.Addr().String() }

// slowState is a State on the real redis-server through a slowProxy,
// under a prefix of its own.
func slowState(t *testing.T, opts ...Option) (*slowProxy, *State) {
	real := newReal(t)
	p := newSlowProxy(t, realAddr())
	pc := redis.NewClient(&redis.Options{Addr: p.addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { pc.Close() })
	prefix := fmt.Sprintf("holds-%d-%d", os.Getpid(), time.Now().UnixNano())
	t.Cleanup(func() { real.clean(t, prefix) })
	return p, New(pc, append([]Option{WithPrefix(prefix)}, opts...)...)
}

// TestReserveTimeoutLeavesNoHold: Redis is slow for a moment (it answers
// later than StateTimeout) but runs every command. The router reserves
// in-process instead, as documented, and every request completes; at
// each settlement it also asks Redis to end the hold its unanswered
// Reserve may have made there, and a hold that settlement did not reach
// ends at its deadline (Budget.HoldFor). Then the fleet's ledger holds
// nothing. (Such holds stayed until the window ended.)
func TestReserveTimeoutLeavesNoHold(t *testing.T) {
	clock := newFleetClock()
	p, st := slowState(t)
	base := newFleetBase(clock)
	r, err := relay.New(relay.Config{
		State: st, StateTimeout: 20 * time.Millisecond, Replicas: 1,
		Base: base, Clock: clock,
		Upstreams: []relay.Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
		Prices:    map[string]relay.Price{"m": {InputPerMTok: 1000, OutputPerMTok: 1000}},
		Budgets:   []relay.Budget{{Name: "b", Limit: 100, Window: relay.Window{Every: time.Hour}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	warm(t, r)                                  // a connection in the pool, and the budget known
	p.delay.Store(int64(60 * time.Millisecond)) // Redis answers late
	for i := range 3 {
		if _, err := send(r, fmt.Sprintf("slow %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	p.delay.Store(0)
	if _, err := send(r, "fast"); err != nil { // Redis answers again
		t.Fatal(err)
	}
	if r.StateFallbacks() == 0 {
		t.Fatal("Redis was never slow enough to fall back: the test tests nothing")
	}
	// A hold whose settlement the State did not send either (it fails
	// fast while Redis is slow) ends at its deadline.
	k := store.BudgetKey{Budget: "b", Window: clock.Now().Truncate(time.Hour).Add(time.Hour)}
	clock.advance(10*time.Minute + time.Second) // Budget.HoldFor's default
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, reserved, err := st.Usage(ctxT(t), k, clock.Now())
		if err == nil && reserved == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no request in flight, but the fleet's ledger holds %d reserved (%v)", reserved, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// warm sends requests through r until one is decided with no call to the
// State failing (the first calls of a fresh connection, on a loaded
// machine, can miss a short StateTimeout).
func warm(t *testing.T, r *relay.Router) {
	t.Helper()
	for i := 0; ; i++ {
		before := r.StateFallbacks()
		_, err := send(r, fmt.Sprintf("warm %d", i))
		if err == nil && r.StateFallbacks() == before {
			return
		}
		if i == 50 {
			t.Fatalf("50 requests and the State never answered in time: %v", err)
		}
	}
}

// refundSpy records the errors of a State's Refund calls.
type refundSpy struct {
	*State
	mu   sync.Mutex
	errs []error
}

func (s *refundSpy) Refund(ctx context.Context, u store.Limits, requests, tokens int, now time.Time) error {
	err := s.State.Refund(ctx, u, requests, tokens, now)
	s.mu.Lock()
	s.errs = append(s.errs, err)
	s.mu.Unlock()
	return err
}

// blockingBase answers at once, except a prompt "block", which says so on
// entered and waits for release.
type blockingBase struct {
	*fleetBase
	entered, release chan struct{}
}

func (b *blockingBase) RoundTrip(r *http.Request) (*http.Response, error) {
	body, _ := io.ReadAll(r.Body)
	if strings.Contains(string(body), `"block"`) {
		if b.entered != nil {
			b.entered <- struct{}{}
		}
		<-b.release
	}
	r.Body = io.NopCloser(strings.NewReader(string(body)))
	return b.fleetBase.RoundTrip(r)
}

// manualClock is a relay.Clock that moves only when the test moves it
// (advance); each AfterFunc is announced on armed with its duration.
type manualClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*manualTimer
	armed  chan time.Duration
}

type manualTimer struct {
	at   time.Time
	f    func()
	done bool
}

func newManualClock(start time.Time) *manualClock {
	return &manualClock{now: start, armed: make(chan time.Duration, 64)}
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) AfterFunc(d time.Duration, f func()) func() bool {
	c.mu.Lock()
	t := &manualTimer{at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	c.mu.Unlock()
	c.armed <- d
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		stopped := !t.done
		t.done = true
		return stopped
	}
}

// advance moves the clock by d and runs the timers then due.
func (c *manualClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []func()
	for _, t := range c.timers {
		if !t.done && !t.at.After(c.now) {
			t.done = true
			due = append(due, t.f)
		}
	}
	c.mu.Unlock()
	for _, f := range due {
		go f()
	}
}

// takenSpy is a refundSpy that says on taken when an Admit of tpm or more
// tokens was taken.
type takenSpy struct {
	*refundSpy
	tpm   int
	taken chan struct{}
}

func (s *takenSpy) Admit(ctx context.Context, u store.Limits, a store.Ask, now time.Time) (store.Verdict, error) {
	v, err := s.refundSpy.Admit(ctx, u, a, now)
	if err == nil && v.Taken && a.Tokens >= s.tpm {
		s.taken <- struct{}{}
	}
	return v, err
}

// TestCancelledWaiterGivesFleetTokensBack: a request waits for the fleet's
// TPM, takes its tokens on Redis, then waits for an in-flight slot and its
// caller cancels. Its tokens go back to the fleet's bucket. (The refund
// was made with the request's ended context: it never reached Redis, and a
// healthy Redis was counted as a State fallback.) The router's clock moves
// only when the test moves it.
func TestCancelledWaiterGivesFleetTokensBack(t *testing.T) {
	b := newReal(t)
	st := &refundSpy{State: b.state(t)}
	spy := &takenSpy{refundSpy: st, tpm: 50, taken: make(chan struct{}, 1)}
	clock := newManualClock(t0)
	base := &blockingBase{fleetBase: newFleetBase(newFleetClock()), entered: make(chan struct{}), release: make(chan struct{})}
	const tpm = 60000 // 1000 tokens a second
	r, err := relay.New(relay.Config{
		Clock: clock, State: spy, StateTimeout: time.Second, Base: base,
		Limits:    relay.Limits{MaxWait: time.Minute},
		Upstreams: []relay.Upstream{{Name: "a", BaseURL: "http://a.test/v1", TPM: tpm, MaxInFlight: 1}},
	})
	if err != nil {
		t.Fatal(err)
	}
	// A holds the only slot.
	aDone := make(chan struct{})
	go func() { defer close(aDone); send(r, "block") }()
	<-base.entered
	<-spy.taken // A's own admission
	defer func() { close(base.release); <-aDone }()
	// The fleet's bucket is drained (by other replicas).
	for _, bite := range []int{tpm / 10, 10} {
		for {
			v := must[store.Verdict](t)(st.Admit(ctxT(t), store.Limits{Name: "a", TPM: tpm}, store.Ask{Tokens: bite}, clock.Now()))
			if !v.Taken {
				break
			}
		}
	}
	// B waits for its tokens, takes them from the fleet's bucket, then
	// waits for the slot; its caller gives up.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body := `{"model":"m","max_tokens":92,"messages":[{"role":"user","content":"b"}]}`
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://relay.test/v1/chat/completions", strings.NewReader(body))
	bErr := make(chan error, 1)
	go func() {
		_, err := r.RoundTrip(req)
		bErr <- err
	}()
	for taken := false; !taken; {
		select {
		case d := <-clock.armed:
			if d < time.Minute { // the wait for tokens, not MaxWait's
				clock.advance(d)
			}
		case <-spy.taken:
			taken = true
		}
	}
	cancel()
	err = <-bErr
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("B: %v, want its caller's cancellation", err)
	}
	st.mu.Lock()
	errs := slices.Clone(st.errs)
	st.mu.Unlock()
	if len(errs) == 0 {
		t.Fatal("B's tokens were never given back: no Refund call")
	}
	for _, e := range errs {
		if e != nil {
			t.Errorf("Refund of a cancelled request's TPM charge failed on a healthy Redis: %v", e)
		}
	}
	if n := r.StateFallbacks(); n != 0 {
		t.Errorf("a healthy Redis counted %d State fallbacks", n)
	}
}

// flakyReserve is a State whose Reserve times out (Redis slow for that
// one call) after the first; everything else reaches Redis.
type flakyReserve struct {
	*refundSpy
	n atomic.Int64
}

func (f *flakyReserve) Reserve(ctx context.Context, k store.BudgetKey, limit int64, h store.Hold, now time.Time) (store.Reservation, error) {
	if f.n.Add(1) == 1 {
		return f.refundSpy.Reserve(ctx, k, limit, h, now)
	}
	return store.Reservation{}, fmt.Errorf("redisstate: reserve %s: %w", k.Budget, context.DeadlineExceeded)
}

// TestUnusedTPMGoesBackWhereTaken: the request's TPM charge was taken
// from the fleet's bucket on Redis (Admit answered), but an unrelated
// State call of the same request (the budget's Reserve) timed out. The
// unused part of the charge goes back to the fleet's bucket. (It went to
// the replica's in-process bucket, which never took it: the router
// judged by the request's fallback flag, not by where the charge was.)
func TestUnusedTPMGoesBackWhereTaken(t *testing.T) {
	b := newReal(t)
	st0 := &refundSpy{State: b.state(t)}
	var st interface {
		store.State
	} = &flakyReserve{refundSpy: st0}
	base := newFleetBase(newFleetClock()) // usage: 8 prompt + 42 completion
	r, err := relay.New(relay.Config{
		State: st, StateTimeout: time.Second, Base: base,
		Upstreams: []relay.Upstream{{Name: "a", BaseURL: "http://a.test/v1", TPM: 6000}},
		Prices:    map[string]relay.Price{"m": {InputPerMTok: 1, OutputPerMTok: 1}},
		Budgets:   []relay.Budget{{Name: "b", Limit: 100, Window: relay.Window{Every: time.Hour}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"x", "y"} { // each charges ~102 tokens, uses 50
		if _, err := send(r, p); err != nil {
			t.Fatal(err)
		}
	}
	st0.mu.Lock()
	errs := slices.Clone(st0.errs)
	st0.mu.Unlock()
	t.Logf("Refund calls to the fleet: %v", errs)
	if len(errs) < 2 {
		t.Error("the fleet's bucket never got back the unused part of the TPM charge it gave (it went to the in-process bucket)")
	}
}

// failFirstBase fails the first call of each request (with a 500) and,
// while it does, the fleet's clock passes into the next budget window.
type failFirstBase struct {
	*fleetBase
	mu    sync.Mutex
	seen  map[string]bool
	first []string
}

func (b *failFirstBase) RoundTrip(r *http.Request) (*http.Response, error) {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(strings.NewReader(string(body)))
	b.mu.Lock()
	first := !b.seen[string(body)]
	b.seen[string(body)] = true
	if first {
		b.first = append(b.first, strings.TrimSuffix(r.URL.Host, ".test"))
	}
	b.mu.Unlock()
	if first {
		b.clock.advance(time.Hour) // the window rolls during the attempt
		io.Copy(io.Discard, r.Body)
		return &http.Response{StatusCode: 500, Header: http.Header{"Content-Type": {"application/json"}},
			Body: io.NopCloser(strings.NewReader(`{"error":{"message":"down","type":"server_error"}}`)), Request: r}, nil
	}
	return b.fleetBase.RoundTrip(r)
}

// TestTopUpStaysInItsWindow: a request reserves in window W1 on a cheap
// upstream; its first attempt fails while the window rolls to W2; the
// retry goes to a dearer upstream, so the reservation is topped up: the
// hold moves to W2, released from W1. No reservation is left once no
// request is in flight. (The top-up went to W2's ledger while the
// settlement released everything from W1's: W2 kept a phantom hold until
// it ended, and W1 released other requests' holds.)
func TestTopUpStaysInItsWindow(t *testing.T) {
	b := newReal(t)
	clock := newFleetClock()
	st := b.state(t)
	base := &failFirstBase{fleetBase: newFleetBase(clock), seen: map[string]bool{}}
	r := topUpRouter(t, st, base, clock)
	for i := range 40 {
		if _, err := send(r, fmt.Sprintf("p%d", i)); err != nil {
			t.Fatal(err)
		}
		base.mu.Lock()
		first := base.first[len(base.first)-1]
		base.mu.Unlock()
		for _, s := range r.Spend() {
			t.Logf("request %d (first attempt on %s): window %s spent %.3f reserved %.3f", i, first, s.WindowEnd.Format("15:04"), s.Spent, s.Reserved)
			if s.Reserved != 0 {
				t.Errorf("no request in flight, but window %s holds %.3f reserved", s.WindowEnd.Format("15:04"), s.Reserved)
			}
		}
	}
}

// TestBudgetViewBoundedByStateTimeout: a Policy that asks Request.Budget how
// much is spent (as ClusterPolicy.CheapWhenSpent does) makes a Redis
// call on the request's path: StateTimeout bounds it, and with Redis slow
// (answering after 1 s) the request completes without waiting for it.
// (The call had no bound: the request waited the whole second.)
func TestBudgetViewBoundedByStateTimeout(t *testing.T) {
	p, st := slowState(t)
	base := newFleetBase(newFleetClock())
	r, err := relay.New(relay.Config{
		State: st, StateTimeout: 20 * time.Millisecond, Base: base,
		Upstreams: []relay.Upstream{{Name: "a", BaseURL: "http://a.test/v1"}},
		Prices:    map[string]relay.Price{"m": {InputPerMTok: 1, OutputPerMTok: 1}},
		Budgets:   []relay.Budget{{Name: "b", Limit: 100, Window: relay.Window{Every: time.Hour}}},
		Policy: relay.PolicyFunc(func(q relay.Request) relay.Route {
			_ = q.Budget.Most()
			return relay.Route{}
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	warm(t, r) // the budget's ledger answers once: a replica that never heard from it refuses while it is down
	p.delay.Store(int64(time.Second))
	start := time.Now()
	if _, err := send(r, "x"); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("request took %v with StateTimeout 20ms", took)
	if took > 500*time.Millisecond {
		t.Errorf("a slow Redis held the request %v: Request.Budget's Usage call is not bounded by StateTimeout", took)
	}
}

// flakyTopUp is a State whose second Reserve (a top-up) times out.
type flakyTopUp struct {
	*State
	n atomic.Int64
}

func (f *flakyTopUp) Reserve(ctx context.Context, k store.BudgetKey, limit int64, h store.Hold, now time.Time) (store.Reservation, error) {
	if f.n.Add(1)%2 == 0 {
		return store.Reservation{}, fmt.Errorf("redisstate: reserve %s: %w", k.Budget, context.DeadlineExceeded)
	}
	return f.State.Reserve(ctx, k, limit, h, now)
}

// failFirstNoRoll is failFirstBase without the window rolling.
type failFirstNoRoll struct{ *failFirstBase }

func (b failFirstNoRoll) RoundTrip(r *http.Request) (*http.Response, error) {
	b.clock.advance(-time.Hour)
	return b.failFirstBase.RoundTrip(r)
}

// TestTopUpFallbackSettlesEachPart: a request reserves on Redis; its
// retry's top-up times out and is made in the in-process ledger. Each
// part is settled where it was reserved, so another replica's hold on
// Redis stays. (The whole amount was settled on Redis, releasing more
// than this request held there.)
func TestTopUpFallbackSettlesEachPart(t *testing.T) {
	b := newReal(t)
	clock := newFleetClock()
	inner := b.state(t)
	st := &flakyTopUp{State: inner}
	base := failFirstNoRoll{&failFirstBase{fleetBase: newFleetBase(clock), seen: map[string]bool{}}}
	r := topUpRouter(t, st, base, clock)
	k := store.BudgetKey{Budget: "b", Window: clock.Now().Truncate(time.Hour).Add(time.Hour)}
	const other = 1_000_000_000 // another replica's request holds $1
	if !reserve(t, inner, k, 100e9, store.Hold{ID: "other", Amount: other, Expires: clock.Now().Add(time.Hour)}, clock.Now()) {
		t.Fatal("reserve")
	}
	for i := range 40 {
		st.n.Store(0)
		if _, err := send(r, fmt.Sprintf("p%d", i)); err != nil {
			t.Fatal(err)
		}
		base.mu.Lock()
		first := base.first[len(base.first)-1]
		base.mu.Unlock()
		_, reserved := must2(t)(inner.Usage(ctxT(t), k, clock.Now()))
		if first == "a" {
			t.Logf("request %d (first attempt on %s): Redis reserved %d", i, first, reserved)
		}
		if reserved != other {
			t.Fatalf("Redis holds %d reserved, want the other replica's %d", reserved, other)
		}
	}
}

// waitInFlight waits until r's first upstream has n requests in flight.
func waitInFlight(t *testing.T, r *relay.Router, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for r.Stats()[0].InFlight != n {
		if time.Now().After(deadline) {
			t.Fatalf("in flight: %d, want %d", r.Stats()[0].InFlight, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// topUpRouter is a router on st whose requests, if their first attempt on
// a fails, retry on b at three times the price: a top-up of the budget
// "b" ($100 an hour) reservation.
func topUpRouter(t *testing.T, st store.State, base http.RoundTripper, clock *fleetClock) *relay.Router {
	t.Helper()
	r, err := relay.New(relay.Config{
		State: st, StateTimeout: time.Second, Base: base, Clock: clock,
		Upstreams: []relay.Upstream{
			{Name: "a", BaseURL: "http://a.test/v1"},
			{Name: "b", BaseURL: "http://b.test/v1", PriceFactor: 3},
		},
		Breaker: relay.BreakerConfig{P99: -1},
		Jitter:  -1,
		Prices:  map[string]relay.Price{"m": {InputPerMTok: 1000, OutputPerMTok: 1000}},
		Budgets: []relay.Budget{{Name: "b", Limit: 100, Window: relay.Window{Every: time.Hour}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}
