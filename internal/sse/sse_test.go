package sse

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

type gotLine struct {
	text string
	full int
	tail string // LastTail
}

// reference splits a whole stream at once: the lines Scan and Flush must
// return, however the stream is cut into chunks, for a Scanner of the given
// Max and Tail.
func reference(in []byte, max, tail int) []gotLine {
	var out []gotLine
	parts := bytes.Split(in, []byte("\n"))
	for i, l := range parts {
		last := i == len(parts)-1
		if last && len(l) == 0 {
			break
		}
		l = bytes.TrimSuffix(l, []byte("\r"))
		full := len(l)
		var t []byte
		if len(l) > max {
			if tail > 0 {
				t = l[len(l)-min(tail, max):]
			}
			l = l[:max]
		}
		out = append(out, gotLine{string(l), full, string(t)})
	}
	return out
}

// scanChunks feeds in to a Scanner cut at the given offsets.
func scanChunks(s *Scanner, in []byte, cuts []int) []gotLine {
	var out []gotLine
	prev := 0
	feed := func(p []byte) {
		for len(p) > 0 {
			line, full, n, ok := s.Scan(p)
			p = p[n:]
			if !ok {
				break
			}
			out = append(out, gotLine{string(line), full, string(s.LastTail())})
		}
	}
	for _, c := range cuts {
		if c < prev || c > len(in) {
			continue
		}
		feed(in[prev:c])
		prev = c
	}
	feed(in[prev:])
	if line, full, ok := s.Flush(); ok {
		out = append(out, gotLine{string(line), full, string(s.LastTail())})
	}
	return out
}

func equalLines(t *testing.T, want, got []gotLine) {
	t.Helper()
	if len(want) != len(got) {
		t.Fatalf("got %d lines %v, want %d %v", len(got), got, len(want), want)
	}
	for i := range want {
		if want[i] != got[i] {
			t.Fatalf("line %d: got %q (%d, tail %q), want %q (%d, tail %q)", i, got[i].text, got[i].full, got[i].tail, want[i].text, want[i].full, want[i].tail)
		}
	}
}

func TestScanEveryCut(t *testing.T) {
	inputs := []string{
		"data: {\"a\":1}\n\ndata: [DONE]\n\n",
		"event: message\r\ndata: {\"b\":2}\r\n\r\n: comment\r\ndata: [DONE]\r\n\r\n",
		"no line end at all",
		"\r\r\n\r\n\n\r",
		"a\rb\r\nc\r",
		"",
	}
	for _, in := range inputs {
		for max := 1; max <= 8; max += 7 {
			for _, tail := range []int{0, 1, 3, 8} {
				want := reference([]byte(in), max, tail)
				// Every single cut, and every pair of cuts.
				for i := 0; i <= len(in); i++ {
					for j := i; j <= len(in); j++ {
						s := &Scanner{Max: max, Tail: tail}
						equalLines(t, want, scanChunks(s, []byte(in), []int{i, j}))
					}
				}
			}
		}
	}
}

func TestScanByteAtATime(t *testing.T) {
	in := []byte("data: {\"x\":\"" + strings.Repeat("y", 100) + "\"}\r\n\r\ndata: [DONE]\n\n")
	var cuts []int
	for i := range in {
		cuts = append(cuts, i)
	}
	s := &Scanner{}
	equalLines(t, reference(in, DefaultMax, 0), scanChunks(s, in, cuts))
}

func TestScanLongLineBounded(t *testing.T) {
	long := "data: " + strings.Repeat("z", 1<<20) + `{"usage":{"input_tokens":3}}`
	in := []byte(long + "\n\ndata: [DONE]\n")
	s := &Scanner{Max: 1024, Tail: 512}
	var cuts []int
	for i := 0; i < len(in); i += 4093 {
		cuts = append(cuts, i)
	}
	got := scanChunks(s, in, cuts)
	equalLines(t, reference(in, 1024, 512), got)
	if got[0].full != len(long) || len(got[0].text) != 1024 || !strings.HasSuffix(got[0].tail, `{"usage":{"input_tokens":3}}`) || len(got[0].tail) != 512 {
		t.Fatalf("long line: full %d kept %d, tail %d bytes", got[0].full, len(got[0].text), len(got[0].tail))
	}
	if cap(s.buf) > 4096 || cap(s.tail) > 4*512 {
		t.Fatalf("scanner kept %d + %d bytes for a 1 MiB line", cap(s.buf), cap(s.tail))
	}
}

func TestField(t *testing.T) {
	for _, c := range []struct{ line, name, value string }{
		{"data: {}", "data", "{}"},
		{"data:{}", "data", "{}"},
		{"data:  x", "data", " x"},
		{"event: message", "event", "message"},
		{": comment", "", "comment"},
		{"data", "data", ""},
		{"", "", ""},
	} {
		n, v := Field([]byte(c.line))
		if string(n) != c.name || string(v) != c.value {
			t.Errorf("Field(%q) = %q, %q; want %q, %q", c.line, n, v, c.name, c.value)
		}
	}
}

func TestScanNoAllocs(t *testing.T) {
	in := []byte(strings.Repeat("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n", 50))
	s := &Scanner{}
	allocs := testing.AllocsPerRun(100, func() {
		for p := in; len(p) > 0; {
			_, _, n, _ := s.Scan(p[:min(len(p), 77)])
			p = p[n:]
		}
	})
	if allocs > 0 {
		t.Fatalf("%v allocations per stream", allocs)
	}
}

// FuzzScan feeds arbitrary bytes cut at arbitrary points: the lines are
// always those of the whole input split at once.
func FuzzScan(f *testing.F) {
	f.Add([]byte("data: {\"a\":1}\r\n\r\ndata: [DONE]\n\n"), uint16(3), uint16(17), uint8(8))
	f.Add([]byte("event: x\n:c\n\xff\xfe\r\r\n"), uint16(1), uint16(2), uint8(1))
	f.Fuzz(func(t *testing.T, in []byte, c1, c2 uint16, max uint8) {
		m := int(max) + 1
		tail := int(max) % 5 // 0 (no tail) to 4
		want := reference(in, m, tail)
		got := scanChunks(&Scanner{Max: m, Tail: tail}, in, []int{int(c1) % (len(in) + 1), int(c2) % (len(in) + 1)})
		if fmt.Sprint(want) != fmt.Sprint(got) {
			t.Fatalf("got %v, want %v", got, want)
		}
	})
}
