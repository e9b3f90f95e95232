package relay

import (
	"net/http"
	"unsafe"

	"github.com/tidwall/gjson"

	"github.com/tokenrelay/relay/internal/jsonscan"
	"github.com/tokenrelay/relay/internal/prompt"
	"github.com/tokenrelay/relay/internal/tokens"
)

// classified is what the router learned from a request body.
type classified struct {
	req  Request
	enc  tokens.Encoding
	json bool   // the body is a JSON object the router may edit
	body string // the body, viewed as a string (no copy)
}

// topFields are the top-level fields of a request body the router reads.
type topFields struct {
	model, stream, maxTokens gjson.Result
	prompt.Fields
}

// classify reads what a policy needs from a request without decoding the
// whole body: the endpoint (POSTs only, by path suffix), model, stream flag,
// max tokens and the prompt's token count, and the bucket that follows from
// it. A body that is not a JSON object, or that has an unexpected shape,
// yields zero tokens and is never an error.
func (r *Router) classify(method string, path string, h http.Header, body []byte) classified {
	c := classified{req: Request{Header: h, Load: r, Budget: noBudgets{}, Priority: priorityOf(h)}}
	if method == http.MethodPost {
		c.req.Endpoint = prompt.Endpoint(path)
	}
	c.req.Bucket = r.s.buckets.Bucket(0)
	if c.req.Endpoint == "" || len(body) == 0 {
		return c
	}
	c.body = unsafe.String(unsafe.SliceData(body), len(body))
	if !jsonscan.Valid(c.body) {
		return c
	}
	root := gjson.Parse(c.body)
	if !root.IsObject() {
		return c
	}
	c.json = true
	f := readTop(root)
	if f.model.Type == gjson.String {
		c.req.Model = f.model.Str
	}
	c.req.Stream = f.stream.Type == gjson.True
	if f.maxTokens.Exists() {
		c.req.MaxTokens = int(min(f.maxTokens.Int(), 1<<31-1))
	}
	c.enc = tokens.ForModel(c.req.Model)
	c.req.MaxInputTokens, c.req.MaxOutputTokens = r.s.window(c.req.Model)
	c.req.PromptTokens = r.counter.prompt(c.enc, c.req.Endpoint, &f.Fields)
	c.req.Bucket = r.s.buckets.Bucket(c.req.PromptTokens)
	return c
}

// readTop picks every field the router reads in one pass over the top
// level, so the (possibly large) prompt is not scanned again to find it.
func readTop(root gjson.Result) topFields {
	var f topFields
	root.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "model":
			f.model = v
		case "stream":
			f.stream = v
		case "max_tokens", "max_completion_tokens", "max_output_tokens":
			if v.Type == gjson.Number && v.Int() > 0 {
				f.maxTokens = v
			}
		case "messages":
			f.Messages = v
		case "input":
			f.Input = v
		case "prompt":
			f.Prompt = v
		case "instructions":
			f.Instructions = v
		case "tools":
			f.Tools = v
		}
		return true
	})
	return f
}
