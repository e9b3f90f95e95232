package relay

import (
	"io"
	"slices"
	"time"

	"github.com/tidwall/gjson"
)

// badReason is why a 2xx answer is bad (RetryConfig.BadAnswerFallbacks).
type badReason uint8

const (
	badNone   badReason = iota
	badFilter           // a content filter stopped it
	badEmpty            // it has no output
)

// Report.BadAnswer values.
const (
	BadAnswerContentFilter = "content_filter"
	BadAnswerEmpty         = "empty"
)

func (b badReason) String() string {
	switch b {
	case badFilter:
		return BadAnswerContentFilter
	case badEmpty:
		return BadAnswerEmpty
	}
	return ""
}

// The look into a plain 2xx answer for a bad one: its whole body, when it
// came within badAnswerWait (real time) and badAnswerMax bytes.
const (
	badAnswerMax  = 1 << 20
	badAnswerWait = time.Second
)

// fallBack answers a bad 2xx answer: when RetryConfig.BadAnswerFallbacks
// has a model to go to next and a's answer is bad, the candidates become
// that model's (the attempts that follow stay on it, and on the models
// after it, never going back to one whose answer was bad), to be tried at
// once from the first.
func (t *trip) fallBack(cands *[]candidate, a *attempt) bool {
	list := t.r.s.retry.badAnswer
	if len(list) == 0 || a.resp == nil || a.err != nil || a.resp.StatusCode >= 300 || t.ctx.Err() != nil {
		return false
	}
	switch t.c.req.Endpoint {
	case EndpointChat, EndpointCompletions, EndpointResponses:
	default:
		return false
	}
	// The models after the answering one in the list, or all of them.
	rest := list[slices.Index(list, a.cand.model)+1:]
	if !slices.ContainsFunc(rest, func(m string) bool { return m != a.cand.model }) {
		return false
	}
	reason := t.badAnswer(a)
	if reason == badNone {
		return false
	}
	now := t.r.s.clock.Now()
	for _, m := range rest {
		if next := t.r.appendCandidates(nil, m, now, t.key, true, t.require); m != a.cand.model && len(next) > 0 {
			*cands = next
			if t.bad == badNone {
				t.bad = reason
			}
			t.why = reason.String()
			return true
		}
	}
	return false
}

// badAnswer judges a's 2xx answer: a stream by what its hold read before
// its first content (see streamBody.badAnswer), a plain answer by its whole
// body, read ahead (its reader gets it whole) within badAnswerWait and
// badAnswerMax bytes; an answer not read whole by then is not judged.
func (t *trip) badAnswer(a *attempt) badReason {
	if a.stream != nil {
		return a.stream.badAnswer()
	}
	if isEventStream(a.resp.Header) {
		return badNone // a stream that was not held
	}
	decompress(a.resp)
	b := readAhead(a.resp.Body, badAnswerMax, nil)
	a.resp.Body = b
	reason := badNone
	b.await(t.ctx, badAnswerWait, func(body []byte) bool {
		if b.err == io.EOF {
			reason = badJSON(t.c.req.Endpoint, body)
		}
		return false
	})
	return reason
}

// badJSON judges a whole JSON answer of endpoint: stopped by a content
// filter (a choice's finish_reason; a Responses answer incomplete for
// "content_filter"), or with no output: no choice (no output item) with
// text, refusal or a tool call. A body that is not a JSON object is not
// judged.
func badJSON(endpoint string, body []byte) badReason {
	if !gjson.ValidBytes(body) {
		return badNone
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return badNone
	}
	if endpoint == EndpointResponses {
		if root.Get("incomplete_details.reason").Str == "content_filter" {
			return badFilter
		}
		output := false
		root.Get("output").ForEach(func(_, item gjson.Result) bool {
			switch item.Get("type").Str {
			case "message":
				item.Get("content").ForEach(func(_, part gjson.Result) bool {
					output = part.Get("text").Str != "" || part.Get("refusal").Str != ""
					return !output
				})
			case "reasoning":
			default: // a tool call of any kind
				output = true
			}
			return !output
		})
		if !output {
			return badEmpty
		}
		return badNone
	}
	filtered, output := false, false
	root.Get("choices").ForEach(func(_, c gjson.Result) bool {
		filtered = filtered || c.Get("finish_reason").Str == "content_filter"
		m := c.Get("message")
		output = output || c.Get("text").Str != "" || m.Get("content").Str != "" || m.Get("refusal").Str != "" ||
			len(m.Get("tool_calls").Array()) > 0 || m.Get("function_call").IsObject() || m.Get("audio").IsObject()
		return true
	})
	switch {
	case filtered:
		return badFilter
	case !output:
		return badEmpty
	}
	return badNone
}

// badAnswer judges a held stream that ended before its first content: a
// content filter stopped it, or it had no output. A stream that failed, or
// was handed over before its end, is not judged.
func (s *streamBody) badAnswer() badReason {
	switch {
	case s.st.gotFirst || s.failed != nil || !s.complete():
		return badNone
	case s.st.filtered:
		return badFilter
	}
	return badEmpty
}
