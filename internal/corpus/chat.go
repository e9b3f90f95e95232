package corpus

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
)

// Chat is a 4 KB chat request of four messages (system, user, assistant,
// user) whose contents are lines of 80 bytes of Prompt, each starting with
// a nine-digit number, so that a request can be made new throughout by
// rewriting the numbers in place (Renew). It is the request of the
// router's overhead benchmarks.
type Chat struct {
	// B is the request body.
	B     []byte
	marks []int // offsets of the numbers in B
	// Texts are the four contents as the API reads them (decoded), with
	// tmarks the offsets of their numbers: RenewTexts rewrites them.
	Texts  [][]byte
	tmarks [][]int
}

// NewChat returns a new Chat, its numbers all zero.
func NewChat() *Chat {
	text := Prompt(8 << 10)
	msg := func(role string, from, n int) map[string]string {
		// Newlines make the contents carry JSON escapes, as real prompts do.
		s := text[from : from+n]
		var b []byte
		for len(s) >= 70 {
			b = append(b, "000000000 "...)
			b = append(b, s[:70]...)
			b = append(b, '\n')
			s = s[70:]
		}
		return map[string]string{"role": role, "content": string(b)}
	}
	body, err := json.Marshal(map[string]any{
		"model": "gpt-4.1",
		"messages": []map[string]string{
			msg("system", 0, 1400), msg("user", 2000, 840), msg("assistant", 4000, 700), msg("user", 6000, 420),
		},
		"max_tokens": 256,
	})
	if err != nil {
		panic(err)
	}
	ob := &Chat{B: body}
	var req struct{ Messages []struct{ Content string } }
	if err := json.Unmarshal(body, &req); err != nil {
		panic(err)
	}
	for _, m := range req.Messages {
		t := []byte(m.Content)
		var tm []int
		for at := 0; ; {
			j := bytes.Index(t[at:], []byte("000000000 "))
			if j < 0 {
				break
			}
			tm = append(tm, at+j)
			at += j + 10
		}
		ob.Texts, ob.tmarks = append(ob.Texts, t), append(ob.tmarks, tm)
	}
	for at := 0; ; {
		j := bytes.Index(body[at:], []byte("000000000 "))
		if j < 0 {
			break
		}
		ob.marks = append(ob.marks, at+j)
		at += j + 10
	}
	return ob
}

// Renew writes n into every line, so that no line of any message has been
// seen before (for n not used before).
func (ob *Chat) Renew(n uint64) {
	for _, m := range ob.marks {
		putNumber(ob.B, m, n)
	}
}

// RenewTexts is Renew for the decoded contents (Texts) alone.
func (ob *Chat) RenewTexts(n uint64) {
	for i, t := range ob.Texts {
		for _, m := range ob.tmarks[i] {
			putNumber(t, m, n)
		}
	}
}

// putNumber writes n as nine digits at b[m:].
func putNumber(b []byte, m int, n uint64) {
	for i := 8; i >= 0; i-- {
		b[m+i] = byte('0' + n%10)
		n /= 10
	}
}

// MemBase is an http.RoundTripper that reads the request body and answers
// from memory with a fixed chat completion: each benchmark row's cost is
// then the transport's own CPU cost, without sockets.
func MemBase(answer []byte) http.RoundTripper {
	return memBase(answer)
}

type memBase []byte

func (answer memBase) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		io.Copy(io.Discard, req.Body)
		req.Body.Close()
	}
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(bytes.NewReader(answer)), ContentLength: int64(len(answer)), Request: req}, nil
}
