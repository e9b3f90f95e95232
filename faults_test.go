package relay

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tokenrelay/relay/relaytest"
)

// TestFaultMatrix sends one request through two upstreams whose calls fail
// as scripted, and checks the outcome, the attempts, exactly one report and
// byte-identical replays. goleak (TestMain) checks no goroutine is left.
func TestFaultMatrix(t *testing.T) {
	now := newFakeClock().Now() // the auto clock starts at the same instant
	h := func(kv ...string) http.Header {
		out := http.Header{}
		for i := 0; i+1 < len(kv); i += 2 {
			out.Set(kv[i], kv[i+1])
		}
		return out
	}
	f429 := func(hdr http.Header) relaytest.Fault { return relaytest.Fault{Status: 429, Header: hdr} }
	cases := []struct {
		name       string
		a, b       []relaytest.Fault
		defA, defB relaytest.Fault
		status     int // 0: an error is expected
		attempts   int
		upstream   string
	}{
		{"5xx burst on a", []relaytest.Fault{{Status: 500}, {Status: 502}}, nil, relaytest.Fault{}, relaytest.Fault{}, 200, 2, "b"},
		{"5xx burst on both", []relaytest.Fault{{Status: 500}, {Status: 503}}, []relaytest.Fault{{Status: 504}}, relaytest.Fault{}, relaytest.Fault{}, 503, 3, "a"},
		{"429 storm, ms hints", nil, nil, f429(h("retry-after-ms", "40")), f429(h("retry-after-ms", "40")), 429, 3, "a"},
		{"429 storm, seconds", nil, nil, f429(h("Retry-After", "1")), f429(h("Retry-After", "1")), 429, 3, "a"},
		{"429 storm, http date", nil, nil, f429(h("Retry-After", now.Add(3*time.Second).Format(http.TimeFormat))), f429(nil), 429, 3, "b"}, // a is held 3 s, b 1 s
		{"429 storm, absurd hint", nil, nil, f429(h("Retry-After", "86400")), f429(nil), 429, 3, "b"},                                      // a is held (a minute at most), b is tried
		{"429 storm, negative hint", nil, nil, f429(h("Retry-After", "-5")), f429(nil), 429, 3, "a"},
		{"429 storm, garbage hint", nil, nil, f429(h("Retry-After", "tomorrow-ish")), f429(nil), 429, 3, "a"},
		{"429 then recovery", []relaytest.Fault{f429(h("Retry-After", "1"))}, []relaytest.Fault{f429(h("Retry-After", "1"))}, relaytest.Fault{}, relaytest.Fault{}, 200, 3, "a"},
		{"reset before headers", []relaytest.Fault{{Drop: true}}, nil, relaytest.Fault{}, relaytest.Fault{}, 200, 2, "b"},
		{"every upstream dead", nil, nil, relaytest.Fault{Drop: true}, relaytest.Fault{Drop: true}, 0, 3, "a"},
		{"4xx is final", []relaytest.Fault{{Status: 422}}, nil, relaytest.Fault{}, relaytest.Fault{}, 422, 1, "a"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srvs := newServers(t, 2)
			srvs[0].SetDefault(c.defA)
			srvs[1].SetDefault(c.defB)
			srvs[0].Script(c.a...)
			srvs[1].Script(c.b...)
			clock := newAutoClock()
			r, reps := newTestRouter(t, Config{
				Clock:     clock,
				Upstreams: []Upstream{{Name: "a", BaseURL: srvs[0].URL}, {Name: "b", BaseURL: srvs[1].URL}},
				Breaker:   BreakerConfig{Failures: -1},
			})
			body := `{"model":"gpt-4.1","messages":[{"role":"user","content":"caf\u00e9 \ud83d\ude00 \"quoted\""}],"zeta":1,"alpha":[1,2]}`
			start := time.Now()
			resp, _, err := send(t, r, body)
			assert.Less(t, time.Since(start), 5*time.Second, "fast: waits are on the fake clock")
			if c.status == 0 {
				require.Error(t, err)
			} else {
				require.NoError(t, err)
				assert.Equal(t, c.status, resp.StatusCode)
			}
			list := reps.all()
			require.Len(t, list, 1, "exactly one report")
			assert.Equal(t, c.attempts, list[0].Attempts)
			assert.Equal(t, c.upstream, list[0].Upstream)
			assert.Equal(t, c.attempts, srvs[0].Calls()+srvs[1].Calls())
			for _, s := range srvs {
				for _, q := range s.Requests() {
					assert.Equal(t, body, string(q.Body), "byte-identical replay")
				}
			}
		})
	}
}
