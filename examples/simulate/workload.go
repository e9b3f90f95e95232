package main

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tokenrelay/relay/internal/bpe"
	"github.com/tokenrelay/relay/internal/prompt"
	"github.com/tokenrelay/relay/relaytest"
)

// request is one request of the workload.
type request struct {
	body     string
	endpoint string // "": chat/completions
	prompt   int    // approximate prompt tokens (the router counts exactly)
	output   int
	stream   bool
	kind     string
	at       time.Duration // send offset from the start (timed replays)
	priority string        // X-Relay-Priority header value; "": none
	system   int           // tokens of its system prompt in the canonical prompt (chat); 0: none counted
}

// endpointOf is the endpoint a request of the workload is sent to.
func endpointOf(q request) string {
	if q.endpoint == "" {
		return prompt.Chat
	}
	return q.endpoint
}

// workload is the request list, the same in every mode: seeded, or read
// from a replay file. Its requests are grouped in sessions: a conversation
// or an agent's loop is one session whose requests go one after another,
// each once the answer to the one before has come (it is part of the
// next one's history); a batch or replayed request is a session of its own.
type workload struct {
	name     string
	reqs     []request   // every request, session by session
	sessions [][]request // sub-slices of reqs
	// users is how many sessions are open at once: a worker that finishes
	// a request puts its session back at the end of the queue of open
	// sessions (or opens the next one when it is over) and takes the
	// session at the front, so the open sessions interleave, as many users
	// do. 0: every session is open from the start (sessions of one
	// request: they go in order).
	users int
	timed bool      // send each request at its offset
	bad   []badLine // malformed lines of a replay file
	desc  string    // a replay's description
}

// singles makes every request a session of its own.
func (w *workload) singles() {
	w.sessions = make([][]request, len(w.reqs))
	for i := range w.reqs {
		w.sessions[i] = w.reqs[i : i+1]
	}
}

// generator is a generated workload, named by -workload.
type generator struct {
	name, about string
	gen         func(seed uint64, n, concurrency int) *workload
}

var workloads = []generator{
	{"batch", "an indexing or batch job: one-shot requests, most in the clustered 80–260-token band, some behind 48 shared ~500-token contexts",
		func(seed uint64, n, _ int) *workload { return newWorkload(seed, n) }},
	{"chat", "conversations of 3–30 turns behind 5 long system prompts (1–4k tokens); each turn resends the history and a new user message (mean ≈ 70 tokens), its answer (mean ≈ 215) joins the history; 2 users per concurrent request",
		chatWorkload},
	{"agent", "tool-calling loops of 3–20 steps behind 4 agent prompts with tool definitions; each step resends the transcript with the tool calls and their outputs",
		agentWorkload},
}

func workloadNames() []string {
	out := make([]string, len(workloads))
	for i, w := range workloads {
		out[i] = w.name
	}
	return out
}

var vocab = strings.Fields(`index file function return value error type struct field method
package import module build test case check parse token count route model region shard cache
prefix request response stream chunk usage cost price latency queue worker batch job agent
summary symbol reference comment line block scope name path config option default limit retry
backoff header body json schema table column row key hash map list set string number bool`)

// sharedContexts is the number of repository contexts (shared system
// prompts of about 500 tokens) the mid and long requests start with.
const sharedContexts = 48

// newWorkload builds n requests shaped like an agent or batch-indexing job:
// 5% short (30–80 prompt tokens), 70% in the 80–260 band IDE completions and
// indexing fill, 20% mid (520–900), 5% long (900–2400). Mid and long
// requests start with one of 48 shared repository contexts (a system prompt
// of about 500 tokens), so prefix caches matter and requests sharing a
// context share an affinity key (the router keys on the first 256 tokens);
// band requests carry a one-line instruction, shorter than a cache block,
// and code of their own. Output tokens: 12–48 (short, band), 24–96 (mid),
// 48–160 (long), sent as max_tokens, which the fleet answers exactly. 30%
// stream (with stream_options.include_usage).
func newWorkload(seed uint64, n int) *workload {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	enc := bpe.O200K()
	contexts := make([]string, sharedContexts)
	for i := range contexts {
		contexts[i] = fmt.Sprintf("You are indexing agent %d for repository project-%d. Repository map: ", i, i*11+5) + words(rng, 480) + "."
	}
	w := &workload{name: "batch"}
	for range n {
		q := request{stream: rng.Float64() < 0.3}
		sys := ""
		switch x := rng.Float64(); {
		case x < 0.05:
			q.kind, q.prompt, q.output = "short", 30+rng.IntN(50), 12+rng.IntN(37)
		case x < 0.75:
			q.kind, q.prompt, q.output = "band", 80+rng.IntN(181), 12+rng.IntN(37)
		case x < 0.95:
			q.kind, q.prompt, q.output = "mid", 520+rng.IntN(380), 24+rng.IntN(73)
		default:
			q.kind, q.prompt, q.output = "long", 900+rng.IntN(1501), 48+rng.IntN(113)
		}
		switch q.kind {
		case "band":
			sys = fmt.Sprintf("Complete code in project-%d.", rng.IntN(8))
		case "mid", "long":
			sys = contexts[rng.IntN(len(contexts))]
		}
		// chat formula: 3 per message + role + content, 3 for the reply.
		need := q.prompt - 3 - 1 - 3
		msgs := []map[string]string{}
		if sys != "" {
			msgs = append(msgs, map[string]string{"role": "system", "content": sys})
			need -= 3 + 1 + enc.Count(sys)
		}
		user := fmt.Sprintf("File src/%s/%s_%d.go:", vocab[rng.IntN(len(vocab))], vocab[rng.IntN(len(vocab))], rng.IntN(1000))
		// Space-separated words are pre-tokens of their own, so the count of
		// the text is the sum of the counts of " word".
		have := enc.Count(user)
		var ub strings.Builder
		ub.WriteString(user)
		for have < need {
			word := vocab[rng.IntN(len(vocab))]
			ub.WriteString(" " + word)
			have += wordTokens[word]
		}
		user = ub.String()
		msgs = append(msgs, map[string]string{"role": "user", "content": user})
		body := map[string]any{"model": flagship, "messages": msgs, "max_tokens": q.output}
		if q.stream {
			body["stream"] = true
			body["stream_options"] = map[string]any{"include_usage": true}
		}
		b, _ := json.Marshal(body)
		q.body = string(b)
		w.reqs = append(w.reqs, q)
	}
	w.singles()
	return w
}

// The lengths of a chat turn's new user message and of its answer, after
// public logs of chat traffic: LMSYS-Chat-1M (Zheng et al., ICLR 2024, one
// million conversations with 25 models; arXiv:2309.11998, Table 1) averages
// 69.5 tokens per user prompt and 214.5 per response, and ServeGen
// (Alibaba's production traces, arXiv 2025) finds output lengths
// exponential and input lengths heavy-tailed (log-normal and Pareto). A
// user message (a question, now and then with a pasted snippet or log) is
// log-normal, median 40 tokens and σ 1.05 (mean ≈ 70), cut to 8–2000; an
// answer is 16 tokens plus an exponential of mean 200 (mean ≈ 215), cut at
// 1024, the max_tokens a chat client would set.
const (
	chatUserMedian, chatUserSigma = 40, 1.05
	chatUserMin, chatUserMax      = 8, 2000
	chatOutMin, chatOutMean       = 16, 200 // the mean past the minimum
	chatOutMax                    = 1024
)

// chatUserTokens draws the tokens of a chat turn's new user message.
func chatUserTokens(rng *rand.Rand) int {
	n := int(math.Round(chatUserMedian * math.Exp(chatUserSigma*rng.NormFloat64())))
	return min(max(n, chatUserMin), chatUserMax)
}

// chatOutTokens draws the tokens of a chat turn's answer (its max_tokens).
func chatOutTokens(rng *rand.Rand) int {
	return min(chatOutMin+int(rng.ExpFloat64()*chatOutMean), chatOutMax)
}

// chatSystems is the number of long system prompts the conversations of
// the chat workload are held behind.
const chatSystems = 5

// chatWorkload builds conversations until they hold n requests (the last
// one cut short): each behind one of 5 system prompts of 1000–4000 tokens
// (chosen uniformly), 3–30 turns. A turn sends the system prompt, the
// history and a new user message (chatUserTokens: 8–2000 tokens, mean
// ≈ 70), asks for an answer (chatOutTokens: 16–1024 tokens, mean ≈ 215)
// and, once answered, adds its user message and the answer to the history:
// the answer is the text the fleet answers with that many tokens
// (relaytest.Pieces of its default reply), so the history is what the
// fleet said. 60% of turns stream. 2 conversations per concurrent request
// are open at once (48 at the default concurrency of 24).
func chatWorkload(seed uint64, n, concurrency int) *workload {
	rng := rand.New(rand.NewPCG(seed, 0xc4a7))
	systems := make([]string, chatSystems)
	for i := range systems {
		head := fmt.Sprintf("You are the support assistant of product-%d. Answer from these product notes and policies:", 100+i)
		systems[i] = head + text(rng, 1000+rng.IntN(3001)-bpe.O200K().Count(head))
	}
	sysTokens := make([]int, len(systems))
	for i, sys := range systems {
		sysTokens[i] = systemTokens(sys)
	}
	w := &workload{name: "chat", users: 2 * concurrency}
	for conv := 0; len(w.reqs) < n; conv++ {
		si := rng.IntN(len(systems))
		sys := systems[si]
		turns := min(3+rng.IntN(28), n-len(w.reqs))
		msgs := []map[string]string{{"role": "system", "content": sys}}
		start := len(w.reqs)
		for t := range turns {
			head := fmt.Sprintf("Conversation %d, question %d:", conv, t+1)
			msgs = append(msgs, map[string]string{"role": "user", "content": head + text(rng, chatUserTokens(rng))})
			q := request{kind: "turn", output: chatOutTokens(rng), stream: rng.Float64() < 0.6, system: sysTokens[si]}
			body := map[string]any{"model": flagship, "messages": msgs, "max_tokens": q.output}
			if q.stream {
				body["stream"] = true
				body["stream_options"] = map[string]any{"include_usage": true}
			}
			b, _ := json.Marshal(body)
			q.body = string(b)
			q.prompt = promptTokens(q.body)
			w.reqs = append(w.reqs, q)
			msgs = append(msgs, map[string]string{"role": "assistant", "content": strings.Join(relaytest.Pieces(relaytest.DefaultReply, q.output), "")})
		}
		w.sessions = append(w.sessions, w.reqs[start:len(w.reqs):len(w.reqs)])
	}
	return w
}

// agentTypes is the number of agent configurations (a system prompt and a
// tool set) of the agent workload.
const agentTypes = 4

// agentTools are the tools an agent may call, with the arguments it sends.
var agentTools = []struct{ name, about, arg string }{
	{"read_file", "Read a file of the repository.", "path"},
	{"search_code", "Search the repository for a symbol or text.", "query"},
	{"list_dir", "List a directory of the repository.", "path"},
	{"run_tests", "Run the tests of a package and return their output.", "package"},
	{"edit_file", "Replace a span of a file with new text.", "patch"},
	{"git_log", "Show the history of a path.", "path"},
	{"open_issue", "Read a ticket of the tracker.", "id"},
	{"run_command", "Run a shell command in the sandbox.", "command"},
}

// agentWorkload builds agent runs until they hold n requests (the last one
// cut short). Each run belongs to one of 4 agent configurations: a system
// prompt of 600–1500 tokens and 5–8 tool definitions (chosen uniformly);
// it starts from a task of 30–300 tokens and takes 3–20 steps. Every step
// sends the transcript so far; after each step but the last the transcript
// gains the assistant's tool call (arguments of about the step's output
// tokens, 20–60) and the tool's output (80–1200 tokens of file text or
// test output); the last step asks for the final answer (60–200 tokens).
// The tool calls are the workload's own: the fleet answers text of the
// asked length. 10% of steps stream. 2 runs per concurrent request are open
// at once.
func agentWorkload(seed uint64, n, concurrency int) *workload {
	rng := rand.New(rand.NewPCG(seed, 0xa9e7))
	type config struct {
		system string
		tools  []any
		names  []string
	}
	configs := make([]config, agentTypes)
	for i := range configs {
		head := fmt.Sprintf("You are coding agent %d of team-%d. Work in small steps, call one tool at a time, and follow these rules:", i, 7+i)
		c := config{system: head + text(rng, 600+rng.IntN(901)-bpe.O200K().Count(head))}
		k := 5 + rng.IntN(4)
		for _, j := range rng.Perm(len(agentTools))[:k] {
			t := agentTools[j]
			c.names = append(c.names, t.name)
			c.tools = append(c.tools, map[string]any{"type": "function", "function": map[string]any{
				"name": t.name, "description": t.about + text(rng, 10+rng.IntN(30)),
				"parameters": map[string]any{"type": "object", "required": []string{t.arg},
					"properties": map[string]any{t.arg: map[string]any{"type": "string", "description": "The " + t.arg + "."}}},
			}})
		}
		configs[i] = c
	}
	argOf := map[string]string{}
	for _, t := range agentTools {
		argOf[t.name] = t.arg
	}
	w := &workload{name: "agent", users: 2 * concurrency}
	for run := 0; len(w.reqs) < n; run++ {
		c := configs[rng.IntN(len(configs))]
		steps := min(3+rng.IntN(18), n-len(w.reqs))
		msgs := []any{
			map[string]any{"role": "system", "content": c.system},
			map[string]any{"role": "user", "content": fmt.Sprintf("Task %d:", run) + text(rng, 30+rng.IntN(271))},
		}
		start := len(w.reqs)
		for s := range steps {
			q := request{kind: "step", stream: rng.Float64() < 0.1}
			last := s == steps-1
			if last {
				q.output = 60 + rng.IntN(141)
			} else {
				q.output = 20 + rng.IntN(41)
			}
			body := map[string]any{"model": flagship, "messages": msgs, "tools": c.tools, "max_tokens": q.output}
			if q.stream {
				body["stream"] = true
				body["stream_options"] = map[string]any{"include_usage": true}
			}
			b, _ := json.Marshal(body)
			q.body = string(b)
			q.prompt = promptTokens(q.body)
			w.reqs = append(w.reqs, q)
			if last {
				break
			}
			name := c.names[rng.IntN(len(c.names))]
			args, _ := json.Marshal(map[string]string{argOf[name]: strings.TrimSpace(text(rng, max(q.output-8, 4)))})
			id := fmt.Sprintf("call_%d_%d", run, s)
			msgs = append(msgs,
				map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{
					"id": id, "type": "function", "function": map[string]any{"name": name, "arguments": string(args)}}}},
				map[string]any{"role": "tool", "tool_call_id": id, "content": fmt.Sprintf("%s output:", name) + text(rng, 80+rng.IntN(1121))})
		}
		w.sessions = append(w.sessions, w.reqs[start:len(w.reqs):len(w.reqs)])
	}
	return w
}

// promptTokens counts a chat body's prompt as the router does (OpenAI's
// chat formula in o200k_base, tool definitions by the cookbook's estimate).
func promptTokens(body string) int { return bodyTokens(prompt.Chat, body) }

// bodyTokens counts the prompt of a body sent to endpoint as the router
// does, with its default estimate of 85 tokens per image part.
func bodyTokens(endpoint, body string) int {
	root := gjson.Parse(body)
	f := prompt.Fields{Messages: root.Get("messages"), Input: root.Get("input"), Prompt: root.Get("prompt"),
		Instructions: root.Get("instructions"), Tools: root.Get("tools")}
	return prompt.Tokens(o200k{}, 85, endpoint, &f)
}

// o200k counts in o200k_base.
type o200k struct{}

func (o200k) Text(s string) int { return bpe.O200K().Count(s) }

func (o200k) Tools(tools gjson.Result) int { return prompt.ToolsTokens(bpe.O200K().Count, tools) }

// wordTokens are the o200k_base tokens of " word" for each vocab word.
var wordTokens = func() map[string]int {
	m := make(map[string]int, len(vocab))
	for _, w := range vocab {
		m[w] = bpe.O200K().Count(" " + w)
	}
	return m
}()

// text returns about n tokens of words, each with a space before it
// (space-separated words are pre-tokens of their own, so the count of the
// text is the sum of the counts of " word").
func text(rng *rand.Rand, n int) string {
	var b strings.Builder
	for have := 0; have < n; {
		word := vocab[rng.IntN(len(vocab))]
		b.WriteString(" " + word)
		have += wordTokens[word]
	}
	return b.String()
}

func words(rng *rand.Rand, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocab[rng.IntN(len(vocab))])
	}
	return b.String()
}

// systemShare is the share of the workload's prompt tokens that are its
// requests' leading system messages, as the chat formula counts them (3 per
// message, 1 for the role, and the content).
func (w *workload) systemShare() float64 {
	counts := map[string]int{}
	sys, all := 0, 0
	for _, q := range w.reqs {
		m := gjson.Get(q.body, "messages.0")
		all += q.prompt
		if m.Get("role").Str != "system" {
			continue
		}
		text := m.Get("content").Str
		n, ok := counts[text]
		if !ok {
			n = 3 + 1 + bpe.O200K().Count(text)
			counts[text] = n
		}
		sys += n
	}
	return float64(sys) / float64(max(all, 1))
}

// sample returns about k requests of the workload, whole sessions evenly
// spaced over it (k evenly spaced requests when every session is one
// request; all when k is at least its size), as sessions.
func (w *workload) sample(k int) [][]request {
	if k >= len(w.reqs) {
		return w.sessions
	}
	// The fewest evenly spaced sessions holding k requests, the last one cut.
	for m := 1; m <= len(w.sessions); m++ {
		var out [][]request
		have := 0
		for i := 0; i < m && have < k; i++ {
			s := w.sessions[i*len(w.sessions)/m]
			if have+len(s) > k {
				s = s[:k-have]
			}
			out = append(out, s)
			have += len(s)
		}
		if have >= k {
			return out
		}
	}
	return w.sessions
}

func (w *workload) describe() string {
	if w.desc != "" {
		return w.desc
	}
	n := float64(len(w.reqs))
	streams, prompt := 0, 0
	count := map[string]int{}
	for _, q := range w.reqs {
		count[q.kind]++
		prompt += q.prompt
		if q.stream {
			streams++
		}
	}
	switch w.name {
	case "chat":
		out := 0
		for _, q := range w.reqs {
			out += q.output
		}
		return fmt.Sprintf("chat: %d turns of %d conversations (3–30 turns) behind %d system prompts of 1–4k tokens (%.0f%% of the prompt tokens), %d open at once; answers of %.0f tokens on average; %.0f%% streamed",
			len(w.reqs), len(w.sessions), chatSystems, 100*w.systemShare(), w.users, float64(out)/n, 100*float64(streams)/n)
	case "agent":
		return fmt.Sprintf("agent: %d steps of %d tool-calling runs (3–20 steps) behind %d agent prompts with tools (the system prompts %.0f%% of the prompt tokens), %d open at once; %.0f%% streamed",
			len(w.reqs), len(w.sessions), agentTypes, 100*w.systemShare(), w.users, 100*float64(streams)/n)
	}
	return fmt.Sprintf("batch: %d requests to %s: %.0f%% 30–80 tokens, %.0f%% 80–260, %.0f%% 520–900, %.0f%% 900–2400; mid and long behind %d shared ~500-token contexts; %.0f%% streamed",
		len(w.reqs), flagship, 100*float64(count["short"])/n, 100*float64(count["band"])/n,
		100*float64(count["mid"])/n, 100*float64(count["long"])/n, sharedContexts, 100*float64(streams)/n)
}
