package main

import (
	"bytes"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	"golang.org/x/time/rate"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/internal/prompt"
)

// gate stands for a provider's rate limits in front of the simulated
// fleet, which has none of its own: it holds each upstream to its RPM and
// TPM per simulated minute, with token buckets that hold a minute's quota
// and refill continuously (x/time/rate on the simulated clock, as the
// router's own limiter), charging a call its prompt tokens plus its max
// tokens (1024 when it sets none), as the router charges it. A call over
// either limit is answered 429 with retry-after-ms (when it would fit, in
// simulated time) and never reaches the fleet. The gate counts what each
// upstream received. It is safe for concurrent use.
type gate struct {
	next  http.RoundTripper
	clock relay.Clock
	ups   map[string]*gated // by the upstream's URL host
}

// gated is one upstream behind the gate.
type gated struct {
	name     string
	rpm, tpm int

	mu                      sync.Mutex
	rl, tl                  *rate.Limiter
	calls, tokens, rejected int
}

// newGate puts ups behind a gate, each held to rpm and tpm, in front of next.
func newGate(next http.RoundTripper, clock relay.Clock, ups []relay.Upstream, rpm, tpm int) *gate {
	g := &gate{next: next, clock: clock, ups: map[string]*gated{}}
	for _, u := range ups {
		p, err := url.Parse(u.BaseURL)
		if err != nil {
			panic(err) // the fleet's own URLs
		}
		g.ups[p.Host] = &gated{name: u.Name, rpm: rpm, tpm: tpm,
			rl: rate.NewLimiter(rate.Limit(float64(rpm)/60), rpm+gateSlack(rpm)),
			tl: rate.NewLimiter(rate.Limit(float64(tpm)/60), tpm+gateSlack(tpm))}
	}
	return g
}

// RoundTrip admits the call or answers it 429.
func (g *gate) RoundTrip(req *http.Request) (*http.Response, error) {
	u := g.ups[req.URL.Host]
	if u == nil || req.Body == nil {
		return g.next.RoundTrip(req)
	}
	body, err := io.ReadAll(req.Body)
	req.Body.Close()
	if err != nil {
		return nil, err
	}
	if wait := u.admit(g.clock.Now(), callCharge(req.URL.Path, body)); wait > 0 {
		ms := strconv.FormatFloat(float64(wait)/float64(time.Millisecond), 'f', 0, 64)
		return &http.Response{StatusCode: http.StatusTooManyRequests, Status: "429 Too Many Requests", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header:  http.Header{"Content-Type": {"application/json"}, "Retry-After-Ms": {ms}},
			Body:    io.NopCloser(strings.NewReader(`{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`)),
			Request: req}, nil
	}
	out := req.Clone(req.Context())
	out.Body, out.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return g.next.RoundTrip(out)
}

// CloseIdleConnections forwards to the transport behind the gate.
func (g *gate) CloseIdleConnections() {
	if c, ok := g.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// callCharge is a call's TPM charge: its prompt tokens plus its max tokens.
func callCharge(path string, body []byte) int {
	ep := prompt.Endpoint(path)
	out := 1024
	for _, k := range []string{"max_completion_tokens", "max_tokens", "max_output_tokens"} {
		if m := gjson.GetBytes(body, k).Int(); m > 0 {
			out = int(m)
			break
		}
	}
	return bodyTokens(ep, string(body)) + out
}

// admit counts a call charging tokens and takes it from the buckets,
// or returns how long until it would fit (nothing taken).
func (u *gated) admit(now time.Time, tokens int) time.Duration {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.calls++
	u.tokens += tokens
	tokens = min(tokens, u.tpm) // clamped to the bucket, as the router clamps it
	wait := max(bucketWait(u.rl, now, 1), bucketWait(u.tl, now, tokens))
	if wait > 0 {
		u.rejected++
		return wait
	}
	u.rl.AllowN(now, 1)
	u.tl.AllowN(now, tokens)
	return 0
}

// gateSlack is what the gate's buckets hold beyond a minute's quota of
// limit: two simulated seconds of it. A call reaches the gate a little
// after a router admitted it, and a few milliseconds of wall-clock time
// between the two (a goroutine's wake-up, a call to the shared State) are
// a tenth of a simulated second or more: calls admitted in order may
// arrive out of it, a hair before their tokens. A provider's limiter has
// such a tolerance too.
func gateSlack(limit int) int { return max(limit/30, 1) }

// bucketWait is how long until lim holds n tokens.
func bucketWait(lim *rate.Limiter, now time.Time, n int) time.Duration {
	have := lim.TokensAt(now)
	if have >= float64(n) {
		return 0
	}
	return time.Duration(math.Ceil((float64(n) - have) / float64(lim.Limit()) * float64(time.Second)))
}

// upstreamLoad is what one upstream received in a run, against its limits.
type upstreamLoad struct {
	Name         string  `json:"name"`
	RPM          int     `json:"rpm"`
	TPM          int     `json:"tpm"`
	Calls        int     `json:"calls"`         // received, 429s included
	Tokens       int     `json:"tokens"`        // their TPM charges
	Rejected     int     `json:"rate_429s"`     // answered 429 for the limits
	CallsPerMin  float64 `json:"calls_per_min"` // per simulated minute of the run
	TokensPerMin float64 `json:"tokens_per_min"`
	// OfRPM and OfTPM are what the upstream received over what its limit
	// lets through in a run of this length: a minute's quota to start
	// with (the bucket is full), then the limit per minute. At most 1 when
	// the callers keep to the limit.
	OfRPM float64 `json:"of_rpm"`
	OfTPM float64 `json:"of_tpm"`
}

// loads returns what each upstream received over a run of minutes
// (simulated), in the order of ups.
func (g *gate) loads(ups []relay.Upstream, minutes float64) []upstreamLoad {
	var out []upstreamLoad
	for _, up := range ups {
		p, _ := url.Parse(up.BaseURL)
		u := g.ups[p.Host]
		u.mu.Lock()
		l := upstreamLoad{Name: u.name, RPM: u.rpm, TPM: u.tpm, Calls: u.calls, Tokens: u.tokens, Rejected: u.rejected}
		u.mu.Unlock()
		l.CallsPerMin, l.TokensPerMin = round(float64(l.Calls)/minutes, 1), round(float64(l.Tokens)/minutes, 0)
		l.OfRPM = round(float64(l.Calls)/(float64(u.rpm)*(1+minutes)), 2)
		l.OfTPM = round(float64(l.Tokens)/(float64(u.tpm)*(1+minutes)), 2)
		out = append(out, l)
	}
	return out
}

// simHints translates the fleet's retry hints for a router on the
// simulated clock: the fleet gives retry-after-ms in wall-clock time (it
// scales its simulated hints, as it scales service times), and the router
// reads a hint on its own clock.
type simHints struct{ next http.RoundTripper }

func (h simHints) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := h.next.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	if v := resp.Header.Get("Retry-After-Ms"); v != "" {
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			resp.Header.Set("Retry-After-Ms", strconv.FormatFloat(f/timeScale, 'f', -1, 64))
		}
	}
	return resp, nil
}

// CloseIdleConnections forwards to the transport.
func (h simHints) CloseIdleConnections() {
	if c, ok := h.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}
