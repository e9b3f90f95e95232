// Package sse splits a server-sent-event stream into lines incrementally, as
// the bytes arrive, for a reader that passes the bytes on unchanged and only
// looks at them.
//
// A Scanner never owns the stream: it is fed the chunks a reader got and
// returns each complete line, without its line end. A line that lies inside
// one chunk is returned as a sub-slice of that chunk (no copy); only a line
// split across chunks is assembled in the Scanner's own buffer, and only up to
// its Max bytes, so memory stays bounded whatever the upstream sends.
//
// Line ends are "\n" and "\r\n" (the trailing "\r" is removed). A lone "\r"
// is not a line end: OpenAI's servers never send one and the common SDK
// readers (bufio.Reader.ReadBytes('\n')) do not treat it as one either.
package sse

import "bytes"

// DefaultMax is the longest line kept when Scanner.Max is 0.
const DefaultMax = 256 << 10

var crByte = []byte{'\r'}

// Scanner finds the lines of a byte stream fed to it in chunks. The zero
// value is ready to use. A Scanner is not safe for concurrent use.
type Scanner struct {
	// Max bounds the bytes kept of one line. Of a longer line only the first
	// Max bytes are returned, with its full length, so a caller can skip
	// parsing it. If 0, DefaultMax.
	Max int

	buf  []byte // the start of the current line, when it spans chunks (at most Max bytes)
	size int    // bytes of the current line seen so far (line end excluded)
	cr   bool   // the last byte of the line so far was '\r' (not kept in buf)
}

func (s *Scanner) max() int {
	if s.Max <= 0 {
		return DefaultMax
	}
	return s.Max
}

// Scan consumes p up to and including the first line end and returns that
// line: its first (at most Max) bytes without the line end, the line's full
// length, and n, the bytes of p consumed. When p holds no line end, Scan keeps
// what it needs of p as the start of the next line, returns n == len(p) and
// ok == false.
//
// line is valid until the next call; it is a sub-slice of p when the line
// started in p, else of the Scanner's buffer.
func (s *Scanner) Scan(p []byte) (line []byte, full int, n int, ok bool) {
	i := bytes.IndexByte(p, '\n')
	if i < 0 {
		s.keep(p)
		return nil, 0, len(p), false
	}
	if s.size == 0 && !s.cr {
		// The whole line is in p.
		line = p[:i]
		if len(line) > 0 && line[len(line)-1] == '\r' {
			line = line[:len(line)-1]
		}
		full = len(line)
		if m := s.max(); len(line) > m {
			line = line[:m]
		}
		return line, full, i + 1, true
	}
	s.keep(p[:i])
	// A pending '\r' right before this '\n' is the line end, not content:
	// keep never stored it.
	line, full = s.buf, s.size
	s.buf, s.size, s.cr = s.buf[:0], 0, false
	return line, full, i + 1, true
}

// keep appends part of a line (no '\n' in it). A '\r' at the end of p is held
// back as pending: it is content only if more bytes follow before the '\n'.
func (s *Scanner) keep(p []byte) {
	if len(p) == 0 {
		return
	}
	if s.cr {
		s.add(crByte)
		s.cr = false
	}
	if p[len(p)-1] == '\r' {
		s.cr = true
		p = p[:len(p)-1]
	}
	s.add(p)
}

func (s *Scanner) add(p []byte) {
	s.size += len(p)
	if room := s.max() - len(s.buf); room > 0 {
		if len(p) > room {
			p = p[:room]
		}
		s.buf = append(s.buf, p...)
	}
}

// Pending reports whether a line has been started and not ended.
func (s *Scanner) Pending() bool { return s.size > 0 || s.cr }

// Flush returns the started line at the end of the stream, as Scan would
// have had it ended there (a trailing '\r' is dropped), and resets the
// Scanner. ok is false when no line was started.
func (s *Scanner) Flush() (line []byte, full int, ok bool) {
	if !s.Pending() {
		return nil, 0, false
	}
	line, full = s.buf, s.size
	s.buf, s.size, s.cr = s.buf[:0], 0, false
	return line, full, true
}

// Field splits an SSE line into its field name and value, as the SSE
// specification does: the name is what precedes the first ':', the value
// what follows it, without one leading space. A line without ':' is a field
// with an empty value. A comment line (starting with ':') has an empty name.
func Field(line []byte) (name, value []byte) {
	i := bytes.IndexByte(line, ':')
	if i < 0 {
		return line, nil
	}
	name, value = line[:i], line[i+1:]
	if len(value) > 0 && value[0] == ' ' {
		value = value[1:]
	}
	return name, value
}
