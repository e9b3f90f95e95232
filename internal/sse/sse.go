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
	// Tail, when positive, also keeps the last Tail bytes (at most Max) of
	// a line longer than Max: LastTail returns them, so that a caller can
	// read what ends a long line (a usage object after a long output).
	Tail int

	buf  []byte // the start of the current line, when it spans chunks (at most Max bytes)
	size int    // bytes of the current line seen so far (line end excluded)
	cr   bool   // the last byte of the line so far was '\r' (not kept in buf)
	tail []byte // the last bytes of the current line once it is over Max (Tail to 2×Tail)
	last []byte // the tail of the line Scan or Flush returned last
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
	s.last = nil
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
			if s.Tail > 0 {
				s.last = line[len(line)-min(s.Tail, m):]
			}
			line = line[:m]
		}
		return line, full, i + 1, true
	}
	s.keep(p[:i])
	// A pending '\r' right before this '\n' is the line end, not content:
	// keep never stored it.
	line, full = s.end()
	return line, full, i + 1, true
}

// end returns the current line and its length, sets last, and starts a new
// line.
func (s *Scanner) end() (line []byte, full int) {
	line, full = s.buf, s.size
	if full > s.max() && s.Tail > 0 {
		s.last = s.tail[len(s.tail)-min(s.Tail, s.max(), len(s.tail)):]
	}
	s.buf, s.size, s.cr, s.tail = s.buf[:0], 0, false, s.tail[:0]
	return line, full
}

// LastTail returns the last Tail bytes of the line Scan or Flush returned
// last when that line was longer than Max (and Tail is positive), else
// nil. Like the line, it is valid until the next call.
func (s *Scanner) LastTail() []byte { return s.last }

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
	m := s.max()
	before := s.size
	s.size += len(p)
	if room := m - len(s.buf); room > 0 {
		q := p
		if len(q) > room {
			q = q[:room]
		}
		s.buf = append(s.buf, q...)
	}
	if s.Tail <= 0 || s.size <= m {
		return
	}
	if before <= m {
		// The line just went over Max: its tail so far ends buf.
		s.tail = append(s.tail[:0], s.buf[len(s.buf)-min(s.Tail, len(s.buf)):]...)
		p = p[m-before:]
	}
	if len(p) >= s.Tail {
		s.tail = append(s.tail[:0], p[len(p)-s.Tail:]...)
		return
	}
	s.tail = append(s.tail, p...)
	if len(s.tail) > 2*s.Tail {
		s.tail = s.tail[:copy(s.tail, s.tail[len(s.tail)-s.Tail:])]
	}
}

// Pending reports whether a line has been started and not ended.
func (s *Scanner) Pending() bool { return s.size > 0 || s.cr }

// PendingSize returns the length so far of the line being assembled (its
// bytes fed without a line end yet).
func (s *Scanner) PendingSize() int { return s.size }

// Flush returns the started line at the end of the stream, as Scan would
// have had it ended there (a trailing '\r' is dropped), and resets the
// Scanner. ok is false when no line was started.
func (s *Scanner) Flush() (line []byte, full int, ok bool) {
	s.last = nil
	if !s.Pending() {
		return nil, 0, false
	}
	line, full = s.end()
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
