// Command gateway is a small HTTP gateway built on httputil.ReverseProxy with
// the relay router as its transport:
//
//   - POST /v1/chat/completions: OpenAI-compatible, streams included (every
//     chunk is flushed as it comes); point any OpenAI SDK at
//     http://ADDR/v1.
//   - POST /v1/chat: {messages, temperature, max_tokens} in, routed by the
//     policy; {model, tokens, ms, cost, content} out.
//
// Malformed requests get the OpenAI error shape and 400. SIGINT or SIGTERM
// shuts it down cleanly: it stops accepting, lets requests in flight finish
// (streams included) for up to -grace, then closes what is left.
//
// With no -upstream it serves a simulated fleet (simfleet.Fleet, on
// loopback, no key needed) with the ready-made cluster-aware policy:
//
//	go run ./examples/gateway
//	curl -s localhost:8080/v1/chat -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":8}'
//
// Against real upstreams:
//
//	OPENAI_API_KEY=... go run ./examples/gateway -upstream openai=https://api.openai.com/v1 -model gpt-4.1 -fast gpt-4.1-mini
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/examples/simulate/simfleet"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stderr))
}

// upstreamFlag is the repeatable -upstream flag: NAME=URL values, checked
// after parsing (parseUpstreams) so that a bad one is not echoed whole: a
// URL may carry a key (Azure's ?api-key=).
type upstreamFlag []string

func (l *upstreamFlag) String() string { return "" }

func (l *upstreamFlag) Set(v string) error {
	*l = append(*l, v)
	return nil
}

// parseUpstreams reads NAME=URL values, each possibly comma-separated.
func parseUpstreams(values []string) ([]relay.Upstream, error) {
	var ups []relay.Upstream
	for _, v := range values {
		for _, part := range strings.Split(v, ",") {
			name, raw, ok := strings.Cut(strings.TrimSpace(part), "=")
			if !ok || name == "" {
				return nil, fmt.Errorf("want NAME=URL, got %q", shownURL(part))
			}
			u, err := url.Parse(raw)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return nil, fmt.Errorf("upstream %s: want an http or https URL, got %q", name, shownURL(raw))
			}
			ups = append(ups, relay.Upstream{Name: name, BaseURL: strings.TrimSuffix(raw, "/")})
		}
	}
	return ups, nil
}

// shownURL is a URL as an error may show it: without its user part and
// its query, which may hold a key.
func shownURL(raw string) string {
	if i := strings.IndexAny(raw, "?#"); i >= 0 {
		raw = raw[:i] + "?…"
	}
	if i := strings.Index(raw, "@"); i >= 0 {
		if j := strings.Index(raw, "://"); j >= 0 && j < i {
			raw = raw[:j+3] + "…@" + raw[i+1:]
		} else {
			raw = "…@" + raw[i+1:]
		}
	}
	return raw
}

// run is the command; it returns the exit code (2 for bad flags).
// simulated points cfg at a simulated fleet's upstreams, with its models
// as the defaults of the model flags left empty.
func simulated(cfg *config, fleet *simfleet.Fleet, fastM, cheapM *string) {
	for _, u := range fleet.Upstreams() {
		cfg.Upstreams = append(cfg.Upstreams, relay.Upstream{Name: u.Name, BaseURL: u.URL, Models: []string{u.Model}})
	}
	cfg.Model = "gpt-5.5-codex"
	*fastM, *cheapM = or(*fastM, "gemini-2.5-flash"), or(*cheapM, "deepseek-v3.2")
}

func run(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var upsFlag upstreamFlag
	addr := fs.String("addr", envOr("GATEWAY_ADDR", "127.0.0.1:8080"), "listen address (env GATEWAY_ADDR)")
	fs.Var(&upsFlag, "upstream", "upstream NAME=URL (API root, e.g. https://api.openai.com/v1); repeatable or comma-separated (env RELAY_UPSTREAMS); none: a simulated fleet")
	apiKey := fs.String("api-key", "", "API key for the -upstream endpoints (default $OPENAI_API_KEY)")
	model := fs.String("model", "", "requested model of /v1/chat calls and of chat completions that name none (default gpt-5.5-codex on the simulated fleet, else gpt-4.1)")
	fastM := fs.String("fast", "", "ClusterPolicy.Fast: model for 80-260 token prompts (simulated fleet: gemini-2.5-flash)")
	cheapM := fs.String("cheap", "", "ClusterPolicy.Cheap: model for other mid-size prompts (simulated fleet: deepseek-v3.2)")
	maxBody := fs.Int64("max-body", 1<<20, "request body limit in bytes")
	grace := fs.Duration("grace", 10*time.Second, "shutdown grace period for requests in flight")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	src := "-upstream"
	if len(upsFlag) == 0 {
		if v := os.Getenv("RELAY_UPSTREAMS"); v != "" {
			upsFlag, src = upstreamFlag{v}, "RELAY_UPSTREAMS"
		}
	}
	ups, err := parseUpstreams(upsFlag)
	if err != nil {
		fmt.Fprintf(stderr, "gateway: %s: %v\n", src, err)
		return 2
	}
	if fs.NArg() > 0 || *maxBody <= 0 || *grace <= 0 {
		fmt.Fprintf(stderr, "gateway: bad arguments\n")
		fs.Usage()
		return 2
	}
	logger := log.New(stderr, "gateway: ", log.LstdFlags)
	cfg := config{
		MaxBodyBytes: *maxBody,
		ErrorLog:     log.New(stderr, "gateway: proxy: ", log.LstdFlags),
		OnReport: func(r relay.Report) {
			logger.Printf("%s → %s via %s: %d+%d tokens $%.6f %v attempts=%d status=%d err=%v",
				r.RequestedModel, r.Model, r.Upstream, r.Usage.PromptTokens, r.Usage.CompletionTokens,
				r.CostUSD, r.Latency.Round(time.Millisecond), r.Attempts, r.StatusCode, r.Err)
		},
	}
	if len(ups) == 0 {
		fleet := simfleet.New(simfleet.Config{})
		defer fleet.Close()
		simulated(&cfg, fleet, fastM, cheapM)
		logger.Printf("no -upstream: serving a SIMULATED fleet (simfleet.Fleet, %d upstreams on loopback)", len(cfg.Upstreams))
	} else {
		key := or(*apiKey, os.Getenv("OPENAI_API_KEY"))
		for _, u := range ups {
			u.APIKey = key
			cfg.Upstreams = append(cfg.Upstreams, u)
		}
		cfg.Model = "gpt-4.1"
	}
	cfg.Model = or(*model, cfg.Model)
	if *fastM != "" || *cheapM != "" {
		cfg.Policy = relay.ClusterPolicy{Fast: *fastM, Cheap: *cheapM}
	}
	g, err := newGateway(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "gateway: %v\n", err)
		return 1
	}
	defer g.Close()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintf(stderr, "gateway: %v\n", err)
		return 1
	}
	logger.Printf("listening on http://%s/v1 (POST /v1/chat/completions, POST /v1/chat)", ln.Addr())
	if err := serve(ctx, ln, g, *grace, nil); err != nil {
		logger.Printf("shutdown: %v", err)
		return 1
	}
	logger.Printf("stopped")
	return 0
}

// serve serves h on ln until ctx ends, then shuts the server down: the
// listener closes at once, requests in flight (streams included) get up to
// grace to finish, and connections left after that are closed. onShutdown,
// when set, is called (on its own goroutine) once shutdown has begun and
// the listener is closed. serve returns nil after a clean shutdown.
func serve(ctx context.Context, ln net.Listener, h http.Handler, grace time.Duration, onShutdown func()) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	if onShutdown != nil {
		srv.RegisterOnShutdown(onShutdown)
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err // the listener failed
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	err := srv.Shutdown(sctx)
	if err != nil {
		_ = srv.Close() // grace ran out: close what is left
	}
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func or(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
