package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/tokenrelay/relay"
)

// roundRobin is the capacity-matched baseline: the same upstreams as the
// relay modes, taken in turn, each asked for the model it serves, and
// nothing of the router: no retries, no breaker, no limiter, no policy, no
// token counting. It is this example's own: a loop over the upstreams, a
// rewrite of the "model" field, one call. It reports each request to the
// same hook as the routers, with the usage read from the answer and the
// cost at the run's prices, so its row is measured like the others.
type roundRobin struct {
	ups      []relay.Upstream // each serving one model
	next     atomic.Uint64
	base     http.RoundTripper
	prices   map[string]relay.Price
	onReport func(relay.Report)
}

func baseline(e *env) (*sender, error) {
	rr := &roundRobin{ups: e.all, base: e.base, prices: e.prices, onReport: e.onReport}
	return &sender{do: rr.send, close: func() {}}, nil
}

// send makes one call to the next upstream and reads the answer to its end.
func (rr *roundRobin) send(ctx context.Context, q *request) error {
	start := time.Now()
	up := rr.ups[(rr.next.Add(1)-1)%uint64(len(rr.ups))]
	requested := gjson.Get(q.body, "model").Str
	rep := relay.Report{RequestedModel: requested, Model: requested, Upstream: up.Name, Attempts: 1,
		Stream: q.stream, PromptTokens: q.prompt, Context: ctx}
	defer func() {
		rep.Latency = time.Since(start)
		rr.onReport(rep)
	}()
	body := q.body
	if len(up.Models) > 0 { // an upstream of the fleet: ask for its model
		var err error
		if body, err = sjson.Set(body, "model", up.Models[0]); err != nil {
			rep.Err = err
			return err
		}
		rep.Model = up.Models[0]
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, up.BaseURL+"/"+endpointOf(*q), strings.NewReader(body))
	if err != nil {
		rep.Err = err
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if up.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+up.APIKey)
	}
	resp, err := rr.base.RoundTrip(req)
	if err != nil {
		rep.Err = err
		return err
	}
	defer resp.Body.Close()
	rep.StatusCode = resp.StatusCode
	rep.TTFT = time.Since(start)
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		rep.Err = err
		return err
	}
	if resp.StatusCode != http.StatusOK {
		rep.Err = fmt.Errorf("%s: status %d", up.Name, resp.StatusCode)
		return nil
	}
	rep.Usage = usageOf(b, strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream"))
	price, ok := rr.prices[rep.Model]
	if rr.prices == nil {
		price, ok = relay.DefaultPrices()[rep.Model]
	}
	rep.Priced = ok
	rep.CostUSD = price.Cost(rep.Usage)
	rep.ListCostUSD = rep.CostUSD
	return nil
}

// usageOf reads the usage of a chat or Responses answer: the JSON body's
// "usage", or a stream's event that carries one.
func usageOf(b []byte, stream bool) relay.Usage {
	u := gjson.GetBytes(b, "usage")
	if stream {
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(nil, len(b)+1)
		for sc.Scan() {
			data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
			if !ok || !gjson.ValidBytes(data) {
				continue
			}
			if v := gjson.GetBytes(data, "usage"); v.IsObject() {
				u = v
			} else if v := gjson.GetBytes(data, "response.usage"); v.IsObject() {
				u = v
			}
		}
	}
	in := u.Get("prompt_tokens")
	if !in.Exists() {
		in = u.Get("input_tokens")
	}
	out := u.Get("completion_tokens")
	if !out.Exists() {
		out = u.Get("output_tokens")
	}
	cached := u.Get("prompt_tokens_details.cached_tokens")
	if !cached.Exists() {
		cached = u.Get("input_tokens_details.cached_tokens")
	}
	return relay.Usage{PromptTokens: int(in.Int()), CompletionTokens: int(out.Int()), CachedTokens: int(cached.Int())}
}
