// Package relay is a drop-in http.RoundTripper for OpenAI-compatible APIs
// that makes every LLM call cheaper, faster in the tail, and accounted for.
//
// Wrap any HTTP client with a Router (go-openai's ClientConfig.HTTPClient,
// openai-go's option.WithHTTPClient, plain net/http) and every call goes
// through one pipeline: the body is read once, classified and token-counted
// exactly; a Policy picks the model; the upstreams serving it are ordered
// (prompt-prefix affinity, bounded load, least latency); circuit breakers
// and RPM/TPM limits admit the attempt; the outgoing copy is rewritten and
// sent; failures are retried elsewhere, the tail hedged; the answer streams
// through while its usage is picked out; and one Report, with tokens and
// cost, goes to Config.OnReport when the body is done.
//
// A Router needs no server and runs no background goroutine: time-based
// transitions (breaker cooldowns, limiter refills) are computed from
// timestamps. Only a hedged request races its two attempts on goroutines that
// end with it. Its routing decision can be tested in-process, without a
// network, with Router.Decide.
//
// The files follow the pipeline, top to bottom: router.go, config.go,
// classify.go, count.go, policy.go, shard.go, region.go, admit.go (with
// breaker.go and limit.go), rewrite.go, transport.go (with retry.go and
// hedge.go), stream.go, cost.go, report.go; errors.go holds every error.
package relay

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
)

// Router is an http.RoundTripper that classifies, routes, rewrites, sends and
// reports OpenAI-compatible requests. Create it with New; the zero Router is
// not usable. It is safe for simultaneous use by multiple goroutines and runs
// no background goroutine.
//
// Its configuration can be replaced while it serves (Update). Each
// configuration is a Router of its own, which shares with the others what
// the router learned (the store, the upstreams' circuits, latencies and
// queues, the hedge budget, the memo of token counts); the Router New
// returned serves every request with the latest one, and a request keeps
// the one it started with to its end.
type Router struct {
	s       settings
	ups     []*upstream
	byName  map[string]*upstream
	counter *counter
	hedges  *hedgeBudget
	*stores // the store admissions are decided on (state.go)
	ids     *requestIDs

	// live is the configuration that new requests use once Update has
	// replaced the one New made (nil: r's own); mu keeps Updates in turn.
	live atomic.Pointer[Router]
	mu   sync.Mutex
}

var _ http.RoundTripper = (*Router)(nil)

// New checks cfg and returns a Router. It reports every invalid field and
// upstream at once (errors.Join), naming each bad value; no error contains
// an API key.
func New(cfg Config) (*Router, error) {
	s, err := resolve(cfg)
	if err != nil {
		return nil, err
	}
	r := &Router{s: s, stores: new(stores), ids: new(requestIDs), hedges: new(hedgeBudget)}
	r.initStores()
	r.counter = newCounter(s.memoEntries, s.imageTokens)
	r.ids.init()
	r.hedges.deposit.Store(s.hedge.deposit)
	r.hedges.bal.Store(hedgeReserve) // the reserve is there from the start: it orders hedges, it does not delay the first
	r.initUpstreams(nil)
	return r, nil
}

// initUpstreams makes r's upstreams, each with what the router learned of
// it in the configuration was (nil: none; see Update).
func (r *Router) initUpstreams(was *Router) {
	r.byName = make(map[string]*upstream, len(r.s.upstreams))
	for _, us := range r.s.upstreams {
		var old *upstream
		if was != nil {
			old = was.byName[us.cfg.Name]
		}
		u := newUpstream(us, &r.s, old)
		r.byName[u.cfg.Name] = u
		r.ups = append(r.ups, u)
	}
}

// current returns the configuration new requests use.
func (r *Router) current() *Router {
	if g := r.live.Load(); g != nil {
		return g
	}
	return r
}

// Format prints the Router without its secrets, for every verb.
func (r *Router) Format(f fmt.State, verb rune) {
	r = r.current()
	names := make([]string, len(r.ups))
	for i, u := range r.ups {
		names[i] = u.cfg.Name
	}
	fmt.Fprintf(f, "relay.Router{Upstreams: %q}", names)
}

// CloseIdleConnections calls CloseIdleConnections on Config.Base (the
// latest configuration's, after Update) when it has that method.
func (r *Router) CloseIdleConnections() {
	type closeIdler interface{ CloseIdleConnections() }
	if c, ok := r.current().s.base.(closeIdler); ok {
		c.CloseIdleConnections()
	}
}
