package relay

import (
	"net/http"
	"strings"
	"sync"
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
	json bool // the body is a JSON object the router may edit
	// choices is the completions the request asks for ("n" above 1), 0
	// for one: its output's worst case is that many times max tokens. (An
	// int32 beside the two bools, in their padding: a trip, which holds a
	// classified, stays in its size class.)
	choices int32
	body    string        // the body, viewed as a string (no copy)
	key     uint64        // the affinity key (see keyOf)
	blocks  *promptBlocks // the prompt's prefix blocks, once StrategyExpectedCost needs them
}

// maxChoices bounds the "n" a request's worst case is counted with (the
// OpenAI API allows up to 128).
const maxChoices = 128

// topFields are the top-level fields of a request body the router reads.
type topFields struct {
	model, stream, maxTokens, choices gjson.Result
	prompt.Fields
}

// classify reads what a policy needs from a request without decoding the
// whole body: the endpoint (POSTs only, by path suffix), model, stream flag,
// max tokens and the prompt's token count, and the bucket that follows from
// it; and, when something uses it, the affinity key (keyOf). A body that is
// not a JSON object, or that has an unexpected shape, yields zero tokens and
// is never an error.
//
// The body is read once, by a prompt.Reader: validation, the top-level
// fields and the prompt's strings in one pass. The affinity key is computed
// first, and the prompt strings it covers are counted from its shards'
// counts (see countReader), so no text is counted twice.
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
	sc := getScratch()
	defer sc.release()
	rd := &sc.rd
	if m := r.counter.memo; m != nil {
		sc.known = knownMemo{m: m, enc: tokens.Encoding(r.counter.lastEnc.Load())}
		rd.Known, rd.KnownMin = &sc.known, memoMin
	}
	rd.Read(c.req.Endpoint, c.body)
	if !rd.JSON {
		return c
	}
	c.json = true
	if rd.Fallback {
		r.classifyRef(&c)
		return c
	}
	if v := rd.Model; v.Kind == '"' {
		c.req.Model = rd.Body[v.Start+1 : v.End-1]
		if strings.IndexByte(c.req.Model, '\\') >= 0 {
			c.req.Model = string(jsonscan.AppendUnescaped(nil, c.req.Model, len(c.req.Model)))
		} else {
			// A copy: the model goes into reports, errors and whatever a
			// Policy keeps, and a view would keep the whole body alive.
			c.req.Model = strings.Clone(c.req.Model)
		}
	}
	c.req.Stream = rd.Stream.Kind == 't'
	if rd.HasMaxTokens {
		c.req.MaxTokens = int(min(rd.MaxTokens, 1<<31-1))
	}
	c.choices = int32(min(rd.Choices, maxChoices))
	c.enc = tokens.ForModel(c.req.Model)
	if rd.Known != nil && sc.known.enc != c.enc {
		r.counter.lastEnc.Store(uint32(c.enc))
	}
	c.req.MaxInputTokens, c.req.MaxOutputTokens = r.s.window(c.req.Model)
	if r.wantsKey() {
		c.key = r.prefixKey(c.enc, sc)
	}
	sc.cr = countReader{c: r.counter, enc: c.enc, sc: sc}
	c.req.PromptTokens = rd.Tokens(&sc.cr, r.counter.imageTokens)
	c.req.Bucket = r.s.buckets.Bucket(c.req.PromptTokens)
	return c
}

// classifyRef is the reference reader: what classify finds in a body that
// is a JSON object, read with gjson (the prompt-token count) and jsonscan
// (the canonical prompt of the key). classify falls back to it for the
// bodies a prompt.Reader leaves to it, and tests compare the two.
func (r *Router) classifyRef(c *classified) {
	f := readTop(gjson.Parse(c.body))
	if f.model.Type == gjson.String {
		c.req.Model = strings.Clone(f.model.Str) // (as classify: no view of the body)
	}
	c.req.Stream = f.stream.Type == gjson.True
	if f.maxTokens.Exists() {
		c.req.MaxTokens = int(min(f.maxTokens.Int(), 1<<31-1))
	}
	if f.choices.Exists() {
		c.choices = int32(min(f.choices.Int(), maxChoices))
	}
	c.enc = tokens.ForModel(c.req.Model)
	c.req.MaxInputTokens, c.req.MaxOutputTokens = r.s.window(c.req.Model)
	c.req.PromptTokens = r.counter.prompt(c.enc, c.req.Endpoint, &f.Fields)
	c.req.Bucket = r.s.buckets.Bucket(c.req.PromptTokens)
	if r.wantsKey() {
		c.key = r.keyRef(c)
	}
}

// readTop picks every field the reference reader reads in one pass over
// the top level: gjson's ForEach, the last of a repeated member winning.
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
		case "n":
			if v.Type == gjson.Number && v.Int() > 1 {
				f.choices = v
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

// scratch is the working memory of one classify: the body's reader, the
// canonical prompt, the shards' counts and a buffer to decode strings in.
// It is pooled; one that grew past scratchMax bytes is dropped, so the
// pool holds at most a few small ones per P.
type scratch struct {
	rd     prompt.Reader
	canon  prompt.Canon
	anchor prompt.Canon // a conversation anchor's text (its At unused)
	known  knownMemo
	raw    rawKeyer
	shards []known // the affinity key's pre-token boundaries (see countReader.reuse)
	dec    []byte
	cr     countReader // passed by pointer: no allocation for the interface
}

const scratchMax = 256 << 10

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

func getScratch() *scratch { return scratchPool.Get().(*scratch) }

func (sc *scratch) release() {
	if sc.rd.Cap()+cap(sc.canon.Buf)+cap(sc.anchor.Buf)+4*cap(sc.canon.At)+4*cap(sc.canon.End)+16*cap(sc.shards)+cap(sc.dec) > scratchMax {
		return
	}
	sc.rd.Forget()
	sc.canon.Buf, sc.canon.At, sc.canon.End, sc.shards = sc.canon.Buf[:0], sc.canon.At[:0], sc.canon.End[:0], sc.shards[:0]
	sc.known = knownMemo{}
	sc.anchor.Buf = sc.anchor.Buf[:0]
	sc.cr = countReader{}
	scratchPool.Put(sc)
}
