// Command failover sends streaming chat completions through the router
// with the go-openai client to a fleet of three fake upstreams (relaytest,
// on loopback: no key, no network), one of which fails a share of its
// streams before their first content: an error event (a server error, a
// bad gateway, an overload), a connection cut after the first event, or a
// malformed chunk. It runs the same traffic twice: with the router's hold
// until the first content (the default, Stream.FailoverWindow), which
// retries those streams on another upstream, and with the hold off, where
// they reach the caller. It prints, for each, how many streams failed
// before their content, how many of those were recovered, how many the
// caller saw fail, and the time to the first content.
//
//	go run ./examples/failover [-n 300] [-c 16] [-fail 0.3] [-seed 1]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relaytest"
)

func main() {
	var o options
	flag.IntVar(&o.n, "n", 300, "streams to send")
	flag.IntVar(&o.conc, "c", 16, "streams in flight at once")
	flag.Float64Var(&o.fail, "fail", 0.3, "share of the flaky upstream's streams that fail before their first content")
	flag.Uint64Var(&o.seed, "seed", 1, "seed of the faults' order")
	flag.Parse()
	for _, held := range []bool{true, false} {
		o.held = held
		res, err := run(o)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		res.print(os.Stdout, o)
	}
}

// options are the run's settings.
type options struct {
	n, conc int
	fail    float64
	seed    uint64
	held    bool // the router holds streams until their first content
}

// result is what one run saw.
type result struct {
	failedEarly  int // streams whose first attempt failed before its first content
	recovered    int // of those, streams the caller read whole
	callerFailed int // streams the caller saw fail
	ttfc         []time.Duration
	byUpstream   map[string]int // the upstream that answered
}

// earlyFaults are the failures before the first content the flaky upstream
// picks from, at random. (A rate-limit event would also hold us-east for
// its retry hint, moving the traffic away from it: see the tests of the
// router for those.)
var earlyFaults = []relaytest.Fault{
	{EarlyError: 500}, {EarlyError: 502}, {EarlyError: 503}, {CutAfter: 1}, {Malformed: true},
}

// streamReasons are AttemptInfo.Retry's values after a stream that failed
// before its first content.
var streamReasons = []string{"stream-error", "stream-cut", "stream-malformed", "stalled"}

// answer is the text every relaytest stream carries, whole.
var answer = strings.Join(relaytest.Pieces(relaytest.DefaultReply, relaytest.DefaultCompletionTokens), "")

// marked is the context key of a request's record of stream failures.
type marked struct{}

func run(o options) (result, error) {
	fleet := relaytest.NewFleet([]string{"us-east", "eu-west", "ap-south"})
	defer fleet.Close()
	rng := rand.New(rand.NewPCG(o.seed, 0))
	faults := make([]relaytest.Fault, o.n)
	for i := range faults {
		if rng.Float64() < o.fail {
			faults[i] = earlyFaults[rng.IntN(len(earlyFaults))]
		}
	}
	fleet.Get("us-east").Script(faults...)

	window := time.Duration(0) // the default: 10 s
	if !o.held {
		window = -1
	}
	res := result{byUpstream: map[string]int{}}
	var mu sync.Mutex
	router, err := relay.New(relay.Config{
		Upstreams: []relay.Upstream{
			{Name: "us-east", BaseURL: fleet.Get("us-east").URL},
			{Name: "eu-west", BaseURL: fleet.Get("eu-west").URL},
			{Name: "ap-south", BaseURL: fleet.Get("ap-south").URL},
		},
		Strategy: relay.StrategyPriority, // us-east first: every stream meets the flaky upstream when it can
		Stream:   relay.StreamConfig{FailoverWindow: window},
		Breaker:  relay.BreakerConfig{Failures: -1}, // keep us-east in the traffic, to count every failure
		Hooks: relay.Hooks{OnAttempt: func(ctx context.Context, a relay.AttemptInfo, _ *http.Request) func(relay.AttemptDone) {
			if slices.Contains(streamReasons, a.Retry) {
				ctx.Value(marked{}).(*atomic.Bool).Store(true)
			}
			return nil
		}},
		OnReport: func(r relay.Report) {
			mu.Lock()
			res.byUpstream[r.Upstream]++
			mu.Unlock()
		},
	})
	if err != nil {
		return res, err
	}
	defer router.CloseIdleConnections()
	cfg := openai.DefaultConfig("")
	cfg.BaseURL = fleet.Get("us-east").URL // the router sends each call to its upstream
	cfg.HTTPClient = &http.Client{Transport: router}
	client := openai.NewClientWithConfig(cfg)

	var wg sync.WaitGroup
	next := atomic.Int64{}
	for range o.conc {
		wg.Go(func() {
			for int(next.Add(1)) <= o.n {
				var failed atomic.Bool
				ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), marked{}, &failed), time.Minute)
				ttfc, err := stream(ctx, client)
				cancel()
				mu.Lock()
				switch {
				case err != nil:
					res.callerFailed++
				default:
					res.ttfc = append(res.ttfc, ttfc)
				}
				if failed.Load() {
					res.failedEarly++
					if err == nil {
						res.recovered++
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if !o.held {
		// Without the hold no attempt is retried for its stream: count the
		// flaky upstream's failures the caller met.
		res.failedEarly = res.callerFailed
	}
	return res, nil
}

// stream sends one streaming chat completion and reads it whole: the time
// to its first content, or the error that ended it (one that is not the
// whole answer included).
func stream(ctx context.Context, client *openai.Client) (time.Duration, error) {
	start := time.Now()
	s, err := client.CreateChatCompletionStream(ctx, openai.ChatCompletionRequest{
		Model: "gpt-4o-mini", Stream: true,
		Messages: []openai.ChatCompletionMessage{{Role: openai.ChatMessageRoleUser, Content: "Say hello."}},
	})
	if err != nil {
		return 0, err
	}
	defer s.Close()
	var ttfc time.Duration
	var text strings.Builder
	for {
		chunk, err := s.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, err
		}
		for _, c := range chunk.Choices {
			if c.Delta.Content != "" && ttfc == 0 {
				ttfc = time.Since(start)
			}
			text.WriteString(c.Delta.Content)
		}
	}
	if text.String() != answer {
		return 0, fmt.Errorf("the stream's text is %q, not the whole answer", text.String())
	}
	return ttfc, nil
}

// print writes the run's figures.
func (r result) print(w io.Writer, o options) {
	if o.held {
		fmt.Fprintf(w, "%d streams (go-openai, %d at once) to us-east, eu-west, ap-south; us-east fails %.0f%% of its streams before their first content (error events 500, 502, 503; cuts; malformed chunks)\n",
			o.n, o.conc, 100*o.fail)
		fmt.Fprintln(w, "held until the first content (the default):")
		fmt.Fprintf(w, "  failed-before-content streams recovered: %d of %d\n", r.recovered, r.failedEarly)
	} else {
		fmt.Fprintln(w, "not held (Stream.FailoverWindow: -1):")
		fmt.Fprintf(w, "  failed-before-content streams recovered: 0 of %d\n", r.failedEarly)
	}
	fmt.Fprintf(w, "  streams the caller saw fail: %d of %d\n", r.callerFailed, o.n)
	slices.Sort(r.ttfc)
	if len(r.ttfc) > 0 {
		q := func(p float64) time.Duration { return r.ttfc[int(p*float64(len(r.ttfc)-1))] }
		fmt.Fprintf(w, "  time to first content of the streams read whole: p50 %s, p99 %s\n", q(0.5).Round(10*time.Microsecond), q(0.99).Round(10*time.Microsecond))
	}
	fmt.Fprintf(w, "  answered by: us-east %d, eu-west %d, ap-south %d\n", r.byUpstream["us-east"], r.byUpstream["eu-west"], r.byUpstream["ap-south"])
}
