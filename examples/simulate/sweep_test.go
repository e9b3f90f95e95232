package main

import (
	"bytes"
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/gjson"

	"github.com/tokenrelay/relay"
)

// TestInterleaved: the open sessions take turns, each request after the one
// before it in its session, a finished session's place taken by the next.
func TestInterleaved(t *testing.T) {
	r := func(s, i int) request { return request{kind: string(rune('a'+s)) + string(rune('0'+i))} }
	w := &workload{sessions: [][]request{{r(0, 0), r(0, 1)}, {r(1, 0)}, {r(2, 0), r(2, 1), r(2, 2)}}}
	kinds := func(users int) string {
		var out []string
		for _, q := range w.interleaved(users) {
			out = append(out, q.kind)
		}
		return strings.Join(out, " ")
	}
	assert.Equal(t, "a0 b0 a1 c0 c1 c2", kinds(2))
	assert.Equal(t, "a0 a1 b0 c0 c1 c2", kinds(1))
	assert.Equal(t, "a0 b0 c0 a1 c1 c2", kinds(0), "every session open at once")

	chat := chatWorkload(2, 150, 8)
	order := chat.interleaved(chat.users)
	require.Len(t, order, len(chat.reqs))
	seen := map[*request]bool{}
	for _, q := range order {
		assert.False(t, seen[q], "each request once")
		seen[q] = true
	}
	for _, s := range chat.sessions {
		last := -1
		for i := range s {
			k := indexOf(order, &s[i])
			assert.Greater(t, k, last, "a session's requests in order")
			last = k
		}
	}
}

// TestInterleavedIsDrivesOrder: with one worker, so that every answer
// comes before the next request is taken, drive sends a workload's
// requests in interleaved's order, the order the sweep replays.
func TestInterleavedIsDrivesOrder(t *testing.T) {
	for _, w := range []*workload{chatWorkload(1, 300, 4), agentWorkload(2, 200, 3), newWorkload(1, 50)} {
		var sent []*request
		snd := &sender{do: func(_ context.Context, q *request) error { sent = append(sent, q); return nil }}
		tr := traffic{sessions: w.sessions, conc: 1, users: w.users}
		if tr.users <= 0 {
			tr.users = len(tr.sessions)
		}
		var done atomic.Int64
		drive(tr, snd, nil, &done)
		order := w.interleaved(w.users)
		require.Len(t, sent, len(order), w.name)
		for k := range order {
			require.Same(t, order[k], sent[k], "%s: request %d", w.name, k)
		}
	}
}

func indexOf(order []*request, q *request) int {
	for k, p := range order {
		if p == q {
			return k
		}
	}
	return -1
}

// TestFirstTurn: a conversation's later turn cut to its first turn has the
// key of the first turn; a first turn and a batch request are left as sent.
func TestFirstTurn(t *testing.T) {
	r, err := relay.New(relay.Config{Upstreams: []relay.Upstream{
		{Name: "a", BaseURL: "http://a.invalid/v1"}, {Name: "b", BaseURL: "http://b.invalid/v1"},
		{Name: "c", BaseURL: "http://c.invalid/v1"}, {Name: "d", BaseURL: "http://d.invalid/v1"}}, Jitter: -1})
	require.NoError(t, err)
	w := chatWorkload(1, 200, 8)
	s := w.sessions[0]
	require.GreaterOrEqual(t, len(s), 3)
	assert.Equal(t, s[0].body, firstTurn(s[0].body))
	cut := firstTurn(s[2].body)
	assert.Len(t, gjson.Get(cut, "messages").Array(), 2)
	assert.Equal(t, gjson.Get(s[0].body, "messages").Raw, gjson.Get(cut, "messages").Raw)
	assert.Equal(t, decide(t, r, s[0].body).Upstreams, decide(t, r, cut).Upstreams)
	batch := newWorkload(1, 5).reqs[0].body
	assert.Equal(t, batch, firstTurn(batch))
}

// TestSweepHits: an LRU holds at every moment what a smaller one holds, so
// hits never fall as the cache grows; on conversations a home region per
// conversation hits more than striping.
func TestSweepHits(t *testing.T) {
	w := chatWorkload(1, 80, 4)
	order := w.interleaved(w.users)
	regions := []string{"r1", "r2", "r3", "r4"}
	routes, err := sweepRoutes(order, regions, 1)
	require.NoError(t, err)
	hits := map[int][]float64{}
	for _, j := range []int{0, 3} { // striped, no jitter
		prev := -1.0
		for _, size := range []int{128, 512, 2048} {
			h := sweepHits(order, routes[j], len(regions), size, 64)
			assert.GreaterOrEqual(t, h, prev, "%s at %d blocks", sweepRules[j], size)
			prev = h
			hits[size] = append(hits[size], h)
		}
	}
	t.Logf("striped, no jitter: %v", hits)
	assert.Greater(t, hits[512][1], hits[512][0]+10, "a home per conversation hits more than striping")
	// Past its first turn a conversation keeps one home.
	for _, sess := range w.sessions {
		for i := 2; i < len(sess); i++ {
			assert.Equal(t, routes[3][indexOf(order, &sess[1])], routes[3][indexOf(order, &sess[i])])
		}
	}
	mean, peak := openShare(w, order, routes[3], len(regions), 64, 10)
	assert.Positive(t, mean)
	assert.GreaterOrEqual(t, float64(peak), mean)

	var out, errb bytes.Buffer
	require.Equal(t, 0, run([]string{"-sweep", "256, 1024", "-workload", "chat", "-requests", "40", "-concurrency", "2"}, &out, &errb), errb.String())
	s := out.String()
	assert.Contains(t, s, "Cache hits by prefix-cache size, chat: 40 turns")
	assert.Contains(t, s, "One region's share of the open sessions")
	assert.Regexp(t, `(?m)^blocks +striped +key: first 256 tokens +key: \+ first turn +no jitter$`, s)
	assert.Regexp(t, `(?m)^256 +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+$`, s)
	assert.Regexp(t, `(?m)^1024 +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+$`, s)
	assert.NotContains(t, s, "p99", "no mode runs")
}
