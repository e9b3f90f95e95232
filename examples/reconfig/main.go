// Command reconfig replaces a router's configuration under traffic with
// Router.Update, and prints what the router kept.
//
// Three fake upstreams run on loopback (relaytest): us-east fails every
// call, us-west and eu-west answer. Clients built once with go-openai send
// chat completions through one router while it is reconfigured many times:
// each change rotates us-west's API key, moves its RPM limit, and removes
// or adds eu-west again. us-east's breaker opened before the first change.
//
// The run is made twice: with Router.Update, and the way a service does
// without it, a new Router per change behind a transport that swaps them.
// The figures say whether us-east's breaker stayed open (no call reaches
// the failing upstream), whether a request failed, whether each call
// carried the key of the configuration its request started with, and
// whether eu-west got a request that started after it was removed.
//
//	go run ./examples/reconfig
//	go run ./examples/reconfig -updates 200 -clients 16 -requests 200
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relaytest"
)

func main() {
	var o options
	flag.IntVar(&o.updates, "updates", 50, "configuration changes under traffic")
	flag.IntVar(&o.clients, "clients", 8, "concurrent go-openai clients")
	flag.IntVar(&o.requests, "requests", 100, "requests per client")
	flag.Parse()
	if err := run(os.Stdout, o); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

type options struct{ updates, clients, requests int }

// figures are what one run measured.
type figures struct {
	mode         string
	openBefore   bool  // us-east's breaker was open before the first change
	openAfter    bool  // and after the last
	eastCalls    int   // calls us-east got during the changes
	requests     int   // sent during the changes
	failed       int   // of which failed
	reported     int   // requests reported exactly once
	crossed      int   // requests in flight while a change replaced their configuration
	westCalls    int   // calls to us-west
	westKeyed    int   // of which carried the key of their request's configuration
	euAfterDrops int   // calls to eu-west of requests that started after a change removed it
	changes      int64 // changes made
}

func run(w io.Writer, o options) error {
	f := newFleet()
	defer f.close()
	fmt.Fprintf(w, "reconfig: us-east (fails every call), us-west and eu-west on loopback; %d go-openai clients × %d requests; %d changes under traffic\n",
		o.clients, o.requests, o.updates)
	fmt.Fprintln(w, "each change rotates us-west's key, moves its RPM, and removes or adds eu-west")
	for _, mode := range []string{"Router.Update", "new Router per change"} {
		fig, err := f.measure(mode, o)
		if err != nil {
			return err
		}
		fig.print(w)
	}
	return nil
}

func (fig *figures) print(w io.Writer) {
	yes := map[bool]string{true: "yes", false: "no"}
	fmt.Fprintf(w, "\n%s:\n", fig.mode)
	fmt.Fprintf(w, "  breaker state kept across the changes: %s (us-east open before: %s, after: %s; calls it got meanwhile: %d)\n",
		yes[fig.openBefore && fig.openAfter && fig.eastCalls == 0], yes[fig.openBefore], yes[fig.openAfter], fig.eastCalls)
	fmt.Fprintf(w, "  requests failed during %d changes under traffic: %d of %d; reported once each: %d\n",
		fig.changes, fig.failed, fig.requests, fig.reported)
	fmt.Fprintf(w, "  requests in flight while a change replaced their configuration: %d\n", fig.crossed)
	fmt.Fprintf(w, "  calls to us-west with the key of their request's configuration: %d of %d\n", fig.westKeyed, fig.westCalls)
	fmt.Fprintf(w, "  calls to eu-west of requests that started after it was removed: %d\n", fig.euAfterDrops)
}

// fleet is the three upstreams, and what a run learns of its requests.
type fleet struct {
	east, west, eu *relaytest.Server

	mu      sync.Mutex
	reports map[string][]int // request ID -> the configuration of each report
	started map[string]int64 // request ID -> the last change made when it started
	ended   map[string]int64 // request ID -> the last change made when its answer came
}

func newFleet() *fleet {
	f := &fleet{
		east: relaytest.NewServer(relaytest.WithName("us-east")),
		west: relaytest.NewServer(relaytest.WithName("us-west"), relaytest.WithLatency(time.Millisecond)),
		eu:   relaytest.NewServer(relaytest.WithName("eu-west"), relaytest.WithLatency(time.Millisecond)),
	}
	f.east.SetDefault(relaytest.Fault{Status: 500})
	return f
}

func (f *fleet) close() {
	f.east.Close()
	f.west.Close()
	f.eu.Close()
}

// config is configuration g: every upstream sends X-Config: g, us-west's
// key and RPM follow g, and eu-west is in the even ones only. Its
// OnReport records each report under g.
func (f *fleet) config(g int) relay.Config {
	h := http.Header{"X-Config": {strconv.Itoa(g)}}
	ups := []relay.Upstream{
		{Name: "us-east", BaseURL: f.east.URL, Header: h},
		{Name: "us-west", BaseURL: f.west.URL, Header: h, APIKey: westKey(g), RPM: 100_000 + g},
	}
	if g%2 == 0 {
		ups = append(ups, relay.Upstream{Name: "eu-west", BaseURL: f.eu.URL, Header: h})
	}
	return relay.Config{
		Upstreams: ups,
		Jitter:    0.3,
		Breaker:   relay.BreakerConfig{Failures: 3, Cooldown: 10 * time.Minute},
		OnReport: func(r relay.Report) {
			f.mu.Lock()
			f.reports[r.RequestID] = append(f.reports[r.RequestID], g)
			f.mu.Unlock()
		},
	}
}

func westKey(g int) string { return fmt.Sprintf("sk-west-%04d", g) }

// transport is what the clients send through: the router (Update), or
// the latest of the routers made per change.
type transport struct {
	update bool
	cur    atomic.Pointer[relay.Router]
	made   []*relay.Router
}

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	return t.cur.Load().RoundTrip(req)
}

// change applies configuration g.
func (t *transport) change(cfg relay.Config) error {
	if t.update {
		return t.cur.Load().Update(cfg)
	}
	r, err := relay.New(cfg)
	if err != nil {
		return err
	}
	t.made = append(t.made, r)
	t.cur.Store(r)
	return nil
}

func (t *transport) close() {
	for _, r := range t.made {
		r.CloseIdleConnections()
	}
}

// eastOpen reports whether us-east's breaker is open in the router's view.
func (t *transport) eastOpen() bool {
	for _, s := range t.cur.Load().Stats() {
		if s.Name == "us-east" {
			return s.Breaker == relay.StateOpen
		}
	}
	return false
}

// tagged gives each request an ID, and notes the last change made when
// it started.
type tagged struct {
	next    http.RoundTripper
	f       *fleet
	changes *atomic.Int64
	seq     atomic.Int64
}

func (t *tagged) RoundTrip(req *http.Request) (*http.Response, error) {
	id := "req-" + strconv.FormatInt(t.seq.Add(1), 10)
	started := t.changes.Load()
	t.f.mu.Lock()
	t.f.started[id] = started
	t.f.mu.Unlock()
	req = req.Clone(req.Context())
	req.Header.Set(relay.HeaderRequestID, id)
	resp, err := t.next.RoundTrip(req)
	ended := t.changes.Load()
	t.f.mu.Lock()
	t.f.ended[id] = ended
	t.f.mu.Unlock()
	return resp, err
}

func (f *fleet) measure(mode string, o options) (*figures, error) {
	for _, s := range []*relaytest.Server{f.east, f.west, f.eu} {
		s.Reset()
	}
	f.east.SetDefault(relaytest.Fault{Status: 500})
	f.reset()
	fig := &figures{mode: mode}
	tr := &transport{update: mode == "Router.Update"}
	r, err := relay.New(f.config(0))
	if err != nil {
		return nil, err
	}
	tr.made = append(tr.made, r)
	tr.cur.Store(r)
	defer tr.close()
	var changes atomic.Int64
	cfg := openai.DefaultConfig("sk-caller")
	cfg.BaseURL = "http://relay.invalid/v1" // never dialled: the router sends to the upstreams
	cfg.HTTPClient = &http.Client{Transport: &tagged{next: tr, f: f, changes: &changes}}
	client := openai.NewClientWithConfig(cfg)
	ctx := context.Background()
	ask := func(n int) error {
		_, err := client.CreateChatCompletion(ctx, openai.ChatCompletionRequest{Model: "gpt-4.1",
			Messages: []openai.ChatCompletionMessage{{Role: "user", Content: fmt.Sprintf("Question %d: say hello.", n)}}})
		return err
	}

	// us-east's breaker opens: its failures are retried on the others.
	for n := 0; n < 200 && !tr.eastOpen(); n++ {
		if err := ask(n); err != nil {
			return nil, err
		}
	}
	fig.openBefore = tr.eastOpen()
	warmup := len(f.east.Requests())
	f.west.Reset()
	f.eu.Reset()
	f.reset()

	done := make(chan struct{}, o.clients*o.requests)
	var failed atomic.Int64
	var wg sync.WaitGroup
	for c := range o.clients {
		wg.Go(func() {
			for i := range o.requests {
				if ask(c*o.requests+i) != nil {
					failed.Add(1)
				}
				done <- struct{}{}
			}
		})
	}
	// A change after every few answers, so the changes spread over the
	// traffic.
	every := max(o.clients*o.requests/(2*max(o.updates, 1)), 1)
	for g := 1; g <= o.updates; g++ {
		for range every {
			<-done
		}
		if err := tr.change(f.config(g)); err != nil {
			return nil, err
		}
		changes.Store(int64(g))
	}
	wg.Wait()
	fig.openAfter = tr.eastOpen()
	fig.changes = changes.Load()
	fig.eastCalls = len(f.east.Requests()) - warmup
	fig.requests, fig.failed = o.clients*o.requests, int(failed.Load())
	f.tally(fig)
	return fig, nil
}

// reset forgets the requests seen.
func (f *fleet) reset() {
	f.mu.Lock()
	f.reports, f.started, f.ended = map[string][]int{}, map[string]int64{}, map[string]int64{}
	f.mu.Unlock()
}

// tally checks every request's reports and every call against the
// configuration the request was reported under.
func (f *fleet) tally(fig *figures) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for id := range f.started {
		if reps := f.reports[id]; len(reps) == 1 {
			fig.reported++
			if int64(reps[0]) < f.ended[id] {
				fig.crossed++
			}
		}
	}
	for _, rec := range f.west.Requests() {
		fig.westCalls++
		if g, ok := f.configOf(rec); ok && rec.Header.Get("Authorization") == "Bearer "+westKey(g) {
			fig.westKeyed++
		}
	}
	for _, rec := range f.eu.Requests() {
		// (a call made under configuration g, by a request that started
		// after a later change, or that was not reported under g)
		if g, ok := f.configOf(rec); !ok || f.started[rec.Header.Get(relay.HeaderRequestID)] > int64(g) {
			fig.euAfterDrops++
		}
	}
}

// configOf returns the configuration a call's request was reported
// under, when it is the one the call names (X-Config).
func (f *fleet) configOf(rec relaytest.Recorded) (int, bool) {
	reps := f.reports[rec.Header.Get(relay.HeaderRequestID)]
	g, err := strconv.Atoi(rec.Header.Get("X-Config"))
	return g, err == nil && len(reps) == 1 && reps[0] == g
}
