package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/relaytest"
)

var update = flag.Bool("update", false, "rewrite testdata/sample.jsonl from genSample")

const sampleFile = "testdata/sample.jsonl"

// genSample generates testdata/sample.jsonl: 200 requests of the seeded
// workload (seed 42), shaped like a recording. About two thirds are wrapped
// with t_ms (arrivals about 200 ms apart on average, exponential gaps, so
// the file spans about 40 s of real time); the rest are bare chat bodies,
// sent with the line before. One in six wrapped lines is a Responses call
// (instructions + input + max_output_tokens) instead of a chat one.
//
//	go test ./examples/simulate -run TestSampleFile -update
func genSample() []byte {
	w := newWorkload(42, 200)
	rng := rand.New(rand.NewPCG(42, 0x7e91a7))
	var b bytes.Buffer
	t := 0.0
	for _, q := range w.reqs {
		t += rng.ExpFloat64() * 200
		var body map[string]any
		if err := json.Unmarshal([]byte(q.body), &body); err != nil {
			panic(err)
		}
		var line any = body
		switch x := rng.IntN(6); {
		case x < 2:
			// bare chat body, no timestamp
		case x == 2:
			msgs := body["messages"].([]any)
			rb := map[string]any{"model": body["model"], "max_output_tokens": body["max_tokens"]}
			if len(msgs) == 2 {
				rb["instructions"] = msgs[0].(map[string]any)["content"]
			}
			rb["input"] = msgs[len(msgs)-1].(map[string]any)["content"]
			if q.stream {
				rb["stream"] = true
			}
			line = map[string]any{"t_ms": int(t), "endpoint": "responses", "body": rb}
		default:
			line = map[string]any{"t_ms": int(t), "endpoint": "chat/completions", "body": body}
		}
		out, err := json.Marshal(line)
		if err != nil {
			panic(err)
		}
		b.Write(out)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

func TestSampleFile(t *testing.T) {
	want := genSample()
	if *update {
		require.NoError(t, os.WriteFile(sampleFile, want, 0o644))
	}
	got, err := os.ReadFile(sampleFile)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(want, got), "testdata/sample.jsonl differs from genSample's output; regenerate it: go test ./examples/simulate -run TestSampleFile -update")

	rf, err := loadReplay(bytes.NewReader(got), []string{flagship, fast, cheap}, 1)
	require.NoError(t, err)
	assert.Empty(t, rf.bad)
	assert.Equal(t, 200, rf.lines)
	assert.Len(t, rf.reqs, 200)
	assert.True(t, rf.timed)
	assert.Zero(t, rf.rewritten)
	eps := map[string]int{}
	var prev time.Duration
	for _, q := range rf.reqs {
		eps[q.endpoint]++
		assert.GreaterOrEqual(t, q.at, prev, "send offsets never go back")
		prev = q.at
	}
	assert.Greater(t, eps[relay.EndpointResponses], 15)
	assert.Greater(t, eps[relay.EndpointChat], 150)
	assert.Greater(t, rf.span, 20*time.Second)
}

// TestLoadReplayBad reads testdata/bad.jsonl: malformed lines are skipped
// and counted with their line numbers, blank lines ignored, and the good
// lines kept in order.
func TestLoadReplayBad(t *testing.T) {
	f, err := os.Open("testdata/bad.jsonl")
	require.NoError(t, err)
	defer f.Close()
	rf, err := loadReplay(f, []string{flagship, fast, cheap}, 0.5)
	require.NoError(t, err)

	var lines []int
	reasons := map[int]string{}
	for _, b := range rf.bad {
		lines = append(lines, b.Line)
		reasons[b.Line] = b.Reason
	}
	assert.Equal(t, []int{2, 3, 5, 6, 8, 9, 10, 11, 13, 14, 15, 16, 18, 19}, lines)
	assert.Equal(t, "not valid JSON", reasons[2])
	assert.Equal(t, "not a JSON object", reasons[3])
	assert.Equal(t, `"body" is not an object`, reasons[5])
	assert.Equal(t, `unknown endpoint "embeddings"`, reasons[6])
	assert.Equal(t, `no "messages" or "input": neither a chat nor a responses body`, reasons[8])
	assert.Equal(t, `"messages" is not a non-empty array`, reasons[9])
	assert.Equal(t, `"t_ms" is not a non-negative number`, reasons[10])
	assert.Equal(t, `"model" is not a string`, reasons[11])
	assert.Equal(t, "not valid JSON", reasons[13], "truncated")
	assert.Equal(t, `"input" is neither a string nor an array`, reasons[19])
	assert.Equal(t, 21, rf.lines)

	require.Len(t, rf.reqs, 6) // lines 1, 4, 7, 12, 17, 20 (21 is blank)
	assert.Equal(t, relay.EndpointChat, rf.reqs[0].endpoint)
	assert.Equal(t, relay.EndpointResponses, rf.reqs[1].endpoint)
	assert.True(t, rf.timed)
	assert.Equal(t, 500*time.Millisecond, rf.reqs[1].at, "t_ms 1000 at scale 0.5")
	assert.Equal(t, 500*time.Millisecond, rf.reqs[2].at, "no t_ms: with the line before")
	assert.Equal(t, 1, rf.rewritten, "gpt-4.1 is not a fleet model")
	assert.Contains(t, rf.reqs[3].body, `"model":"`+flagship+`"`)
	assert.True(t, rf.reqs[4].stream)
	assert.Equal(t, relay.EndpointResponses, rf.reqs[5].endpoint, "inferred from input")

	assert.Equal(t, "14 malformed lines skipped (lines 2, 3, 5, 6, 8, 9, 10, 11, 13, 14, and 4 more)", badSummary(rf.bad))
}

func TestLoadReplayLongLine(t *testing.T) {
	defer func(n int) { maxLineBytes = n }(maxLineBytes)
	maxLineBytes = 200 << 10 // more than the reader's 64 KiB buffer
	long := `{"messages":[{"role":"user","content":"` + strings.Repeat("a", maxLineBytes) + `"}]}`
	in := `{"messages":[{"role":"user","content":"hi"}]}` + "\n" + long + "\n" + `{"input":"hello"}`
	rf, err := loadReplay(strings.NewReader(in), nil, 1)
	require.NoError(t, err)
	assert.Equal(t, []badLine{{2, fmt.Sprintf("line longer than %d bytes", maxLineBytes)}}, rf.bad)
	require.Len(t, rf.reqs, 2)
	assert.Equal(t, relay.EndpointResponses, rf.reqs[1].endpoint, "an unterminated last line counts")
	assert.False(t, rf.timed)
}

// TestReplaySample replays the first 80 requests of the sample file against
// the simulated fleet in every mode, at 4× speed.
func TestReplaySample(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"-replay", sampleFile, "-requests", "80", "-concurrency", "8", "-floor-sample", "10", "-speed", "4", "-json"}, &out, &errb)
	require.Equal(t, 0, code, errb.String())
	var rows []result
	require.NoError(t, json.Unmarshal(out.Bytes(), &rows), out.String())
	require.Len(t, rows, len(modes))
	success := map[string]float64{}
	for _, r := range rows {
		success[r.Mode] = r.SuccessPct
		if r.Mode == "floor" {
			assert.Equal(t, 10, r.Requests)
			continue
		}
		assert.Equal(t, 80, r.Requests, r.Mode)
		assert.Zero(t, r.UsageMissing, r.Mode)
		assert.Greater(t, r.CostUSD, 0.0, r.Mode)
		t.Logf("%-14s p50 %6.1f ms  p99 %6.1f ms  %6.0f req/s  success %.2f%%  cache-hit %.1f%%",
			r.Mode, r.P50ms, r.P99ms, r.ThroughputRPS, r.SuccessPct, r.CacheHitPct)
	}
	checkAssured(t, func(mode string) float64 { return success[mode] })
	assert.NotContains(t, errb.String(), "malformed")
}

// TestReplayBadFile: a run over a file with bad lines goes on, lists the
// first 10 bad line numbers in the table's header and every reason (up to
// 10) on stderr.
func TestReplayBadFile(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"-replay", "testdata/bad.jsonl", "-modes", "direct,striped", "-concurrency", "2"}, &out, &errb)
	require.Equal(t, 0, code, errb.String())
	summary := "14 malformed lines skipped (lines 2, 3, 5, 6, 8, 9, 10, 11, 13, 14, and 4 more)"
	assert.Contains(t, out.String(), "replay of testdata/bad.jsonl: 6 requests")
	assert.Contains(t, out.String(), summary)
	assert.Contains(t, errb.String(), summary)
	assert.Contains(t, errb.String(), "testdata/bad.jsonl:2: not valid JSON")
	assert.Contains(t, errb.String(), "testdata/bad.jsonl:14: ")
	assert.NotContains(t, errb.String(), "testdata/bad.jsonl:15: ", "the first 10 only")
	assert.Contains(t, out.String(), "SIMULATED FLEET")
}

// TestReplayBaseURL replays against a "real" endpoint (a relaytest Server):
// every valid line is sent with the key, the fleet's faults stay out.
func TestReplayBaseURL(t *testing.T) {
	srv := relaytest.NewServer()
	defer srv.Close()
	t.Setenv("OPENAI_API_KEY", "sk-from-env")
	var out, errb bytes.Buffer
	code := run([]string{"-replay", "testdata/bad.jsonl", "-base-url", srv.URL, "-speed", "100"}, &out, &errb)
	require.Equal(t, 0, code, errb.String())
	recs := srv.Requests()
	require.Len(t, recs, 12, "direct and striped, 6 requests each")
	for _, r := range recs {
		assert.Equal(t, "Bearer sk-from-env", r.Header.Get("Authorization"))
	}
	models := map[string]int{}
	for _, r := range recs {
		models[r.Model]++
	}
	// One of the six valid lines asks for gpt-4.1, and each mode sends it as
	// asked (arrival order varies with concurrency).
	assert.Equal(t, map[string]int{"gpt-5.5-codex": 10, "gpt-4.1": 2}, models, "no model rewrite against a real endpoint")
	s := out.String()
	assert.Contains(t, s, "REAL ENDPOINT "+srv.URL)
	assert.NotContains(t, s, "SIMULATED")
	assert.NotContains(t, s, "sk-from-env")
	assert.NotContains(t, errb.String(), "sk-from-env")
	assert.Regexp(t, `(?m)^ +direct +codex 83% · gpt-4.1 17% `, s)
	assert.Regexp(t, `(?m)^ +striped +codex 83% · gpt-4.1 17% `, s)
	assert.Contains(t, s, "a Router with the one endpoint, retries")
	assert.NotContains(t, s, "hottest shard")

	srv.Reset()
	out.Reset()
	code = run([]string{"-replay", "testdata/bad.jsonl", "-base-url", srv.URL + "/", "-api-key", "sk-flag", "-modes", "cluster-aware",
		"-fast", "gpt-4o-mini", "-cheap", "gpt-4o-mini", "-json"}, &out, &errb)
	require.Equal(t, 0, code, errb.String())
	require.Len(t, srv.Requests(), 6)
	assert.Equal(t, "Bearer sk-flag", srv.Requests()[0].Header.Get("Authorization"))
}

func TestReplayFlagsRejected(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
		code int
	}{
		{[]string{"-replay", sampleFile, "-speed", "0"}, "-speed must be a positive number", 2},
		{[]string{"-replay", sampleFile, "-speed", "-1"}, "-speed must be a positive number", 2},
		{[]string{"-base-url", "http://x.invalid/v1"}, "-base-url needs -replay", 2},
		{[]string{"-replay", sampleFile, "-base-url", "ftp://x"}, "-base-url must be an http or https URL", 2},
		{[]string{"-replay", sampleFile, "-fast", "gpt-4o"}, "-fast and -cheap apply to -base-url only", 2},
		{[]string{"-replay", "testdata/missing.jsonl"}, "missing.jsonl", 1},
		{[]string{"-replay", "testdata/empty.jsonl"}, "no request to replay", 1},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			assert.Equal(t, tc.code, run(tc.args, &out, &errb))
			assert.Contains(t, errb.String(), tc.want)
			assert.Empty(t, out.String())
		})
	}
}
