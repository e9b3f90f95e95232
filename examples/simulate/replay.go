package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/internal/bpe"
)

// The replayer reads a JSONL file of recorded requests, one per line, in
// either of two forms:
//
//	{"model": "gpt-4.1", "messages": [...], ...}                        a bare body
//	{"t_ms": 1234, "endpoint": "responses", "body": {"input": ...}}    a wrapped body
//
// A bare body is a chat-completions body when it has "messages", a
// Responses body when it has "input" (or "instructions"). A wrapper names
// its endpoint ("chat/completions", "chat", "responses"; absent: inferred
// from the body as for a bare one) and may carry t_ms, the request's time
// in milliseconds relative to the recording's start. When any line has
// t_ms, each request is sent at its time divided by -speed (a line without
// t_ms goes with the line before it); otherwise requests go as fast as the
// concurrency allows. Against the simulated fleet t_ms is real-world time
// and is scaled to the fleet's clock (×timeScale) like every service time.
//
// Blank lines are ignored. Any other line that is not one of these forms
// (not JSON, not an object, an unknown endpoint, a body without messages or
// input, a line over maxLineBytes) is skipped and counted with its line
// number; the run goes on.

// maxLineBytes bounds one line of a replay file (the router's default body
// cap). A variable so tests can lower it.
var maxLineBytes = 32 << 20

// badLine is one skipped line of a replay file.
type badLine struct {
	Line   int    `json:"line"`
	Reason string `json:"reason"`
}

// replayFile is what loadReplay read.
type replayFile struct {
	reqs  []request
	bad   []badLine // every skipped line, in file order
	lines int       // lines read, blank ones included
	timed bool      // some line had t_ms
	span  time.Duration
	// rewritten counts requests whose model the simulated fleet does not
	// serve, sent as the flagship instead.
	rewritten int
}

// loadReplay reads a replay file from r. models, when not nil, are the
// models the target serves: a request for another model is rewritten to
// models[0] (the simulated fleet serves only its model paths). scale turns a
// recorded t_ms into the request's send offset (timeScale/speed against the
// simulated fleet, 1/speed against a real endpoint). It fails only when r
// fails.
func loadReplay(r io.Reader, models []string, scale float64) (*replayFile, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	rf := &replayFile{}
	enc := bpe.O200K()
	last := time.Duration(0)
	for {
		line, tooLong, err := readLine(br)
		if len(line) > 0 || tooLong || err == nil {
			rf.lines++
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		switch {
		case tooLong:
			rf.bad = append(rf.bad, badLine{rf.lines, fmt.Sprintf("line longer than %d bytes", maxLineBytes)})
		case len(bytes.TrimSpace(line)) == 0:
			// blank: ignored
		default:
			q, tms, rewritten, reason := parseReplayLine(line, models, enc.Count)
			if reason != "" {
				rf.bad = append(rf.bad, badLine{rf.lines, reason})
				break
			}
			if rewritten {
				rf.rewritten++
			}
			if tms >= 0 {
				rf.timed = true
				at := time.Duration(float64(tms) * float64(time.Millisecond) * scale)
				last = max(last, at) // never back in time
				rf.span = max(rf.span, time.Duration(tms)*time.Millisecond)
			}
			q.at = last
			q.kind = bucket(q.prompt)
			rf.reqs = append(rf.reqs, q)
		}
		if err != nil {
			return rf, nil
		}
	}
}

// readLine reads one line without its line ending. A line over maxLineBytes
// is consumed and reported as tooLong. err is io.EOF at the end of input
// (line then holds a last unterminated line, if any).
func readLine(br *bufio.Reader) (line []byte, tooLong bool, err error) {
	for {
		chunk, err := br.ReadSlice('\n')
		if !tooLong {
			if len(line)+len(chunk) > maxLineBytes+2 {
				tooLong, line = true, nil
			} else {
				line = append(line, chunk...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		line = bytes.TrimSuffix(line, []byte("\n"))
		line = bytes.TrimSuffix(line, []byte("\r"))
		return line, tooLong, err
	}
}

// parseReplayLine reads one non-blank line. tms is -1 when the line has no
// timestamp; rewritten reports a model replaced by models[0]; reason is
// non-empty when the line is malformed.
func parseReplayLine(line []byte, models []string, count func(string) int) (q request, tms int64, rewritten bool, reason string) {
	tms = -1
	if !gjson.ValidBytes(line) {
		return q, tms, false, "not valid JSON"
	}
	root := gjson.ParseBytes(line)
	if !root.IsObject() {
		return q, tms, false, "not a JSON object"
	}
	body, endpoint, tms, reason := replayWrapper(root)
	if reason != "" {
		return q, tms, false, reason
	}
	prompt, endpoint, reason := replayPrompt(body, endpoint, count)
	if reason != "" {
		return q, tms, false, reason
	}
	raw := []byte(body.Raw)
	model := body.Get("model")
	if model.Exists() && model.Type != gjson.String {
		return q, tms, false, `"model" is not a string`
	}
	if models != nil && !contains(models, model.Str) {
		var err error
		if raw, err = sjson.SetBytes(raw, "model", models[0]); err != nil {
			return q, tms, false, "cannot set the model: " + err.Error()
		}
		rewritten = true
	}
	q.body = string(raw)
	q.endpoint = endpoint
	q.prompt = prompt
	q.stream = body.Get("stream").Bool()
	for _, k := range []string{"max_completion_tokens", "max_tokens", "max_output_tokens"} {
		if n := body.Get(k).Int(); n > 0 {
			q.output = int(n)
			break
		}
	}
	return q, tms, rewritten, ""
}

// replayWrapper reads a line's wrapper, {"t_ms", "endpoint", "body"}, or
// takes the line as the body when it has no "body": the body, the endpoint
// the wrapper names ("" when none), the time (-1 when none) and, when the
// wrapper is malformed, why.
func replayWrapper(root gjson.Result) (body gjson.Result, endpoint string, tms int64, reason string) {
	tms = -1
	b := root.Get("body")
	if !b.Exists() {
		return root, "", tms, ""
	}
	if !b.IsObject() {
		return b, "", tms, `"body" is not an object`
	}
	if ep := root.Get("endpoint"); ep.Exists() {
		if ep.Type != gjson.String {
			return b, "", tms, `"endpoint" is not a string`
		}
		switch strings.Trim(ep.Str, "/") {
		case "chat/completions", "chat", "v1/chat/completions":
			endpoint = relay.EndpointChat
		case "responses", "v1/responses":
			endpoint = relay.EndpointResponses
		default:
			return b, "", tms, fmt.Sprintf("unknown endpoint %q", ep.Str)
		}
	}
	if t := root.Get("t_ms"); t.Exists() {
		if t.Type != gjson.Number || t.Num < 0 || t.Num > 1e12 {
			return b, "", tms, `"t_ms" is not a non-negative number`
		}
		tms = int64(t.Num)
	}
	return b, endpoint, tms, ""
}

// replayPrompt infers the endpoint of a body when its wrapper named none,
// checks the body's shape for it, and estimates its prompt tokens with
// count (3 per message and reply, as the chat formula counts).
func replayPrompt(body gjson.Result, endpoint string, count func(string) int) (prompt int, _ string, reason string) {
	if endpoint == "" {
		switch {
		case body.Get("messages").Exists():
			endpoint = relay.EndpointChat
		case body.Get("input").Exists() || body.Get("instructions").Exists():
			endpoint = relay.EndpointResponses
		default:
			return 0, "", `no "messages" or "input": neither a chat nor a responses body`
		}
	}
	messages := func(list gjson.Result) {
		list.ForEach(func(_, m gjson.Result) bool {
			prompt += 3 + count(m.Get("role").Str) + count(textOf(m.Get("content")))
			return true
		})
	}
	switch endpoint {
	case relay.EndpointChat:
		msgs := body.Get("messages")
		if !msgs.IsArray() || len(msgs.Array()) == 0 {
			return 0, "", `"messages" is not a non-empty array`
		}
		prompt = 3
		messages(msgs)
	case relay.EndpointResponses:
		in := body.Get("input")
		if !in.Exists() && !body.Get("instructions").Exists() {
			return 0, "", `no "input" in a responses body`
		}
		if in.Exists() && in.Type != gjson.String && !in.IsArray() {
			return 0, "", `"input" is neither a string nor an array`
		}
		prompt = 3 + count(body.Get("instructions").Str)
		if in.Type == gjson.String {
			prompt += 3 + count(in.Str)
		} else {
			messages(in)
		}
	}
	return prompt, endpoint, ""
}

// textOf returns the text of a message content: a string, or the text
// parts of an array.
func textOf(c gjson.Result) string {
	if c.Type == gjson.String {
		return c.Str
	}
	var b strings.Builder
	c.ForEach(func(_, p gjson.Result) bool {
		b.WriteString(p.Get("text").Str)
		return true
	})
	return b.String()
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// bucket labels an approximate prompt size like the generated workload.
func bucket(prompt int) string {
	switch {
	case prompt < 80:
		return "short"
	case prompt <= 260:
		return "band"
	case prompt < 900:
		return "mid"
	}
	return "long"
}

// replayWorkload loads the replay file named by o into a workload.
func replayWorkload(o options, models []string, stderr io.Writer) (*workload, error) {
	f, err := os.Open(o.replay)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	scale := 1 / o.speed
	if o.baseURL == "" {
		scale *= timeScale
	}
	rf, err := loadReplay(f, models, scale)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", o.replay, err)
	}
	if o.requestsSet && o.requests < len(rf.reqs) {
		rf.reqs = rf.reqs[:o.requests]
	}
	if len(rf.bad) > 0 {
		fmt.Fprintf(stderr, "simulate: %s: %s\n", o.replay, badSummary(rf.bad))
		for _, b := range rf.bad[:min(len(rf.bad), 10)] {
			fmt.Fprintf(stderr, "simulate: %s:%d: %s\n", o.replay, b.Line, b.Reason)
		}
	}
	if len(rf.reqs) == 0 {
		return nil, fmt.Errorf("%s: no request to replay (%d lines, %d malformed)", o.replay, rf.lines, len(rf.bad))
	}
	w := &workload{name: "replay", reqs: rf.reqs, timed: rf.timed, bad: rf.bad}
	w.singles()
	var streams, responses int
	for _, q := range rf.reqs {
		if q.stream {
			streams++
		}
		if q.endpoint == relay.EndpointResponses {
			responses++
		}
	}
	n := float64(len(rf.reqs))
	var b strings.Builder
	fmt.Fprintf(&b, "replay of %s: %d requests (%.0f%% chat, %.0f%% responses, %.0f%% streamed)",
		o.replay, len(rf.reqs), 100*(n-float64(responses))/n, 100*float64(responses)/n, 100*float64(streams)/n)
	if rf.timed {
		fmt.Fprintf(&b, ", timestamps over %v at speed ×%g", rf.span.Round(time.Millisecond), o.speed)
		if o.baseURL == "" {
			fmt.Fprintf(&b, " (on the fleet's clock ×%g)", timeScale)
		}
	} else {
		b.WriteString(", no timestamps (as fast as the concurrency allows)")
	}
	if rf.rewritten > 0 {
		fmt.Fprintf(&b, "; %d requests for models the fleet does not serve sent as %s", rf.rewritten, flagship)
	}
	if len(rf.bad) > 0 {
		fmt.Fprintf(&b, "; %s", badSummary(rf.bad))
	}
	w.desc = b.String()
	return w, nil
}

// badSummary says how many lines were skipped and lists the first 10.
func badSummary(bad []badLine) string {
	nums := make([]string, 0, 10)
	for _, b := range bad[:min(len(bad), 10)] {
		nums = append(nums, strconv.Itoa(b.Line))
	}
	more := ""
	if len(bad) > 10 {
		more = fmt.Sprintf(", and %d more", len(bad)-10)
	}
	return fmt.Sprintf("%d malformed lines skipped (lines %s%s)", len(bad), strings.Join(nums, ", "), more)
}
