package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay"
)

// replicaOptions are the flags of a replicas test: a short run.
func replicaOptions(t *testing.T, args ...string) options {
	t.Helper()
	o, err := parseFlags(append([]string{"-modes", "direct"}, args...), io.Discard)
	require.NoError(t, err)
	return o
}

// checkShared holds a shared-state row to the limits. Always: no upstream
// received more than its limits let through over the run (while a call to
// the State fails, a replica keeps to 1/N of the limits on its own, which
// may add up to one more limit's worth). With RELAY_SIM_TARGETS=1 (see
// simTargets): (nearly) no call was answered 429 and every request went
// through, which holds only while the State answers within StateTimeout
// (20–50 ms of wall-clock time), as a loaded host may not.
func checkShared(t *testing.T, r result) {
	t.Helper()
	x := r.Replicas
	require.NotNil(t, x)
	assert.Equal(t, "shared", x.State)
	require.Len(t, x.Upstreams, 12)
	bound := 1.0
	if x.StateFallbacks > 0 {
		bound = 2
	}
	for _, l := range x.Upstreams {
		assert.LessOrEqual(t, l.OfRPM, bound, "%s: calls within RPM", l.Name)
		assert.LessOrEqual(t, l.OfTPM, bound, "%s: tokens within TPM", l.Name)
	}
	t.Logf("%s: success %.2f%%, 429s %d, peak × limit %.2f, state fallbacks %d, p99 %.1f ms",
		x.Backend, r.SuccessPct, x.Rejected, x.PeakOfLimit, x.StateFallbacks, r.P99ms)
	if simTargets {
		assert.LessOrEqual(t, x.Rejected, 2, "the replicas kept to the limits together")
		assert.GreaterOrEqual(t, r.SuccessPct, 99.5)
	}
}

// TestReplicasEmbedded runs the comparison on the embedded server: three
// routers on their own send the upstreams more than their limits and meet
// 429s; sharing the limits, they keep to them. How far over the limits
// the routers on their own go depends on how fast the host runs the
// simulation: it is asserted with RELAY_SIM_TARGETS=1 only (see
// simTargets; by the 429s; the peak × limit, an average over the run, is
// logged).
func TestReplicasEmbedded(t *testing.T) {
	o := replicaOptions(t, "-replicas", "3", "-requests", "480", "-concurrency", "8", "-scenario", "none")
	w := newWorkload(o.seed, o.requests)
	rows, err := runReplicas(o, w, io.Discard)
	require.NoError(t, err)
	require.Len(t, rows, 2)
	own, shared := rows[0], rows[1]
	require.NotNil(t, own.Replicas)
	assert.Equal(t, "replicas/per-process", own.Mode)
	assert.Equal(t, "per-process", own.Replicas.State)
	assert.Equal(t, 3, own.Replicas.Replicas)
	assert.Zero(t, own.Replicas.StateFallbacks, "no shared state, no fallback")
	assert.Equal(t, "replicas/shared", shared.Mode)
	assert.Equal(t, "miniredis (embedded)", shared.Replicas.Backend)
	assert.Equal(t, ms(embeddedStateTimeout), shared.Replicas.StateTimeoutMs)
	rpm, tpm := replicaLimits(w, o.concurrency)
	assert.Contains(t, shared.About, "3 routers sharing Upstream.RPM "+strconv.Itoa(rpm)+" and TPM "+strconv.Itoa(tpm)+" on miniredis (embedded)")
	checkShared(t, shared)
	t.Logf("per-process: success %.2f%%, 429s %d, peak × limit %.2f, attempts/req %.3f (shared %.3f)",
		own.SuccessPct, own.Replicas.Rejected, own.Replicas.PeakOfLimit, own.AttemptsPerReq, shared.AttemptsPerReq)
	if !simTargets {
		return
	}
	assert.Greater(t, own.Replicas.Rejected, 10, "on their own, the replicas go over the limits, and the upstreams answer 429")
	assert.Less(t, shared.AttemptsPerReq, own.AttemptsPerReq, "fewer calls: none wasted on 429s")
	assert.GreaterOrEqual(t, shared.SuccessPct, own.SuccessPct)
}

// redisAddr is the real Redis the tests use: RELAY_TEST_REDIS, or
// 127.0.0.1:6379.
func redisAddr() string {
	if a := os.Getenv("RELAY_TEST_REDIS"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

// TestReplicasRedis runs the shared half of the comparison on a real
// Redis, and checks that the run left no key behind. It skips when no
// server answers.
func TestReplicasRedis(t *testing.T) {
	addr := redisAddr()
	c := redis.NewClient(&redis.Options{Addr: addr, DialerRetries: 1, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Skipf("no Redis answers at %s (set RELAY_TEST_REDIS): %v", addr, err)
	}
	o := replicaOptions(t, "-replicas", "3", "-redis", addr, "-requests", "160", "-concurrency", "6", "-scenario", "none")
	res, _, err := runMode(o, mode{name: "replicas/shared", newSender: replicated(o, true)}, newWorkload(o.seed, o.requests), io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "redis at "+addr, res.Replicas.Backend)
	assert.Equal(t, ms(redisStateTimeout), res.Replicas.StateTimeoutMs)
	checkShared(t, res)
	keys, err := c.Keys(context.Background(), "{relay:simulate-"+strconv.Itoa(os.Getpid())+"-*").Result()
	require.NoError(t, err)
	assert.Empty(t, keys, "the run's keys are deleted")
}

// TestReplicasNoRedis: a Redis that does not answer fails the run, saying
// where it looked.
func TestReplicasNoRedis(t *testing.T) {
	clock := newSimClock()
	_, err := openState("127.0.0.1:1", clock)
	require.ErrorContains(t, err, "no Redis answers at 127.0.0.1:1")
	var out, errb bytes.Buffer
	assert.Equal(t, 1, run([]string{"-requests", "20", "-modes", "direct", "-replicas", "2", "-redis", "127.0.0.1:1"}, &out, &errb))
	assert.Contains(t, errb.String(), "simulate: replicas: replicas/shared: no Redis answers at 127.0.0.1:1")
}

// fakeClock is a relay.Clock that moves only when told.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func (c *fakeClock) AfterFunc(time.Duration, func()) func() bool { panic("not used") }

// okBase answers every call 200 and counts them.
type okBase struct {
	mu    sync.Mutex
	calls int
}

func (b *okBase) RoundTrip(req *http.Request) (*http.Response, error) {
	body, _ := io.ReadAll(req.Body)
	req.Body.Close()
	b.mu.Lock()
	b.calls++
	b.mu.Unlock()
	h := http.Header{}
	if strings.Contains(string(body), "hint") {
		h.Set("Retry-After-Ms", "4")
	}
	return &http.Response{StatusCode: 200, Header: h, Body: http.NoBody, Request: req}, nil
}

// TestGate holds one upstream to RPM 60 and TPM 6000 on a fake clock: a
// minute's quota and the slack at once, then a call a second; a call over
// TPM waits for its tokens; the counts and the loads add up.
func TestGate(t *testing.T) {
	clock := &fakeClock{now: simEpoch}
	base := &okBase{}
	up := relay.Upstream{Name: "r/m", BaseURL: "http://up.test/v1"}
	g := newGate(base, clock, []relay.Upstream{up}, 60, 6000)
	call := func(maxTokens int) *http.Response {
		body := `{"model":"m","max_tokens":` + strconv.Itoa(maxTokens) + `,"messages":[{"role":"user","content":"hi"}]}`
		req, err := http.NewRequest(http.MethodPost, up.BaseURL+"/chat/completions", strings.NewReader(body))
		require.NoError(t, err)
		resp, err := g.RoundTrip(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp
	}
	prompt := callCharge("/v1/chat/completions", []byte(`{"max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`)) - 1
	require.Equal(t, 8, prompt, "3 a message + role + content + 3 for the reply")
	for i := range 60 + gateSlack(60) {
		require.Equal(t, 200, call(1).StatusCode, "call %d", i)
	}
	resp := call(1)
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "1000", resp.Header.Get("Retry-After-Ms"), "a second to the next request's token (simulated)")
	clock.advance(time.Second)
	assert.Equal(t, 200, call(1).StatusCode)
	assert.Equal(t, http.StatusTooManyRequests, call(1).StatusCode)

	clock.advance(time.Minute) // both buckets full again: 6200 tokens
	assert.Equal(t, 200, call(6000-prompt).StatusCode)
	resp = call(400 - prompt) // 200 left: 200 more tokens take 2 s
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "2000", resp.Header.Get("Retry-After-Ms"))
	assert.Equal(t, 64, base.calls, "a 429 never reaches the fleet")

	l := g.loads([]relay.Upstream{up}, 2)
	require.Len(t, l, 1)
	assert.Equal(t, upstreamLoad{Name: "r/m", RPM: 60, TPM: 6000, Calls: 67, Rejected: 3, Tokens: 65*(prompt+1) + 6000 + 400,
		CallsPerMin: 33.5, TokensPerMin: round(float64(65*(prompt+1)+6400)/2, 0), OfRPM: round(67.0/180, 2), OfTPM: round(float64(65*(prompt+1)+6400)/18000, 2)}, l[0])
	assert.InDelta(t, 90, allowedPerMin(60, 2), 1e-9, "a minute's quota plus two minutes' refill, over two minutes")
}

// TestSimHints: a router on the simulated clock reads the fleet's
// wall-clock hints as simulated time.
func TestSimHints(t *testing.T) {
	req, _ := http.NewRequest(http.MethodPost, "http://up.test/v1/chat/completions", strings.NewReader(`"hint"`))
	resp, err := simHints{&okBase{}}.RoundTrip(req)
	require.NoError(t, err)
	assert.Equal(t, "200", resp.Header.Get("Retry-After-Ms"), "4 ms of wall-clock time are 200 ms simulated")
	req, _ = http.NewRequest(http.MethodPost, "http://up.test/v1/chat/completions", strings.NewReader(`{}`))
	resp, err = simHints{&okBase{}}.RoundTrip(req)
	require.NoError(t, err)
	assert.Empty(t, resp.Header.Get("Retry-After-Ms"))
}

func TestSimClock(t *testing.T) {
	c := newSimClock()
	a := c.Now()
	assert.False(t, a.Before(simEpoch))
	time.Sleep(2 * time.Millisecond)
	assert.GreaterOrEqual(t, c.Now().Sub(a), unscaled(2*time.Millisecond), "simulated time runs 50 times faster")
	fired := make(chan time.Time, 1)
	start := time.Now()
	c.AfterFunc(time.Second, func() { fired <- time.Now() })
	assert.GreaterOrEqual(t, (<-fired).Sub(start), scaled(time.Second), "a simulated second is 20 ms of wall-clock time")
	stop := c.AfterFunc(time.Hour, func() { t.Error("stopped timer fired") })
	assert.True(t, stop())
}

func TestReplicaLimits(t *testing.T) {
	w := &workload{reqs: make([]request, 400)}
	for i := range w.reqs {
		w.reqs[i] = request{prompt: 300, output: 100}
	}
	rpm, tpm := replicaLimits(w, 8)
	assert.Equal(t, 20, rpm)
	assert.Equal(t, 20*400, tpm)
	rpm, tpm = replicaLimits(w, 24)
	assert.Equal(t, 48, rpm, "at least twice the concurrency")
	assert.Equal(t, 48*400, tpm)
}

// TestReplicasTable prints the comparison from rows.
func TestReplicasTable(t *testing.T) {
	up := func(name string, of float64) upstreamLoad {
		return upstreamLoad{Name: name, RPM: 60, TPM: 24000, CallsPerMin: 150, OfRPM: of, TokensPerMin: 30000, OfTPM: of / 2, Rejected: 7}
	}
	rows := []result{
		{Mode: "direct"},
		{Mode: "replicas/per-process", P50ms: 20, P99ms: 150, SuccessPct: 97.5, AttemptsPerReq: 1.4,
			Replicas: &replicasResult{Replicas: 4, State: "per-process", Minutes: 1.5, Rejected: 420, PeakOfLimit: 1.8,
				Upstreams: []upstreamLoad{up("us-east/m", 1.8)}}},
		{Mode: "replicas/shared", P50ms: 21, P99ms: 160, SuccessPct: 100, AttemptsPerReq: 1.03,
			Replicas: &replicasResult{Replicas: 4, State: "shared", Backend: "miniredis (embedded)", StateFallbacks: 3, Minutes: 2,
				PeakOfLimit: 0.95, Upstreams: []upstreamLoad{up("us-east/m", 0.95)}}},
	}
	var out bytes.Buffer
	printReplicas(&out, rows)
	containsAll(t, out.String(),
		"Replicas: 4 routers, one per simulated replica, over one fleet whose upstreams enforce RPM 60 and TPM 24000\n",
		"per-process (State nil)         20.0    150.0   97.50      1.400         420            1.80          0                1.50\n",
		"shared on miniredis (embedded)  21.0    160.0   100.00     1.030         0              0.95          3                2.00\n",
		"What each upstream received, per-process (State nil): 1.50 simulated minutes, in which the limits let through\n100.0 calls/min and 40000 tokens/min:\n",
		"us-east/m  150.0      1.80   30000       0.90   7\n",
		"  state fallbacks  calls to the shared State that failed or timed out")
	out.Reset()
	printReplicas(&out, rows[:1])
	assert.Empty(t, out.String())
}
