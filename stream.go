package relay

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"

	"github.com/tokenrelay/relay/internal/jsonscan"
	"github.com/tokenrelay/relay/internal/sse"
)

// Stream parsing bounds.
const (
	streamLineMax  = 256 << 10 // longest SSE line kept by the line scanner
	streamEventMax = 256 << 10 // longest event data parsed; longer events pass through, read at their ends
	streamTailMax  = 64 << 10  // bytes kept of the end of a longer event (its usage)
	streamHeadMax  = 128       // bytes kept of the start of a longer event (its type)
	streamHoldMax  = 16 << 10  // longest event that can be the injected usage chunk
	streamBufSize  = 48 << 10  // buffer of a stream that holds bytes back
	streamAheadMax = 1 << 20   // read-ahead bound while waiting for the first token
	streamEstFlush = 64 << 10  // delta text kept before it is counted
	streamJunkMax  = 4 << 10   // non-SSE bytes kept to read an error body from
	streamMsgMax   = 200       // bytes of an upstream error message kept in Report.Err
)

// The end of a stream whose content is complete: streamGrace is the
// longest it waits for what may still belong to it (the blank line that
// ends its last event; the [DONE] after the usage chunk), by the router's
// clock; what follows its end is read, to let its connection be reused,
// for streamDrainWait (real time) and streamDrainMax bytes at most, on a
// goroutine of its own.
const (
	streamGrace     = 200 * time.Millisecond
	streamDrainWait = 100 * time.Millisecond
	streamDrainMax  = 4 << 10
)

// isEventStream reports whether a response is a server-sent-event stream.
func isEventStream(h http.Header) bool {
	var ct string
	if v := h["Content-Type"]; len(v) > 0 {
		ct = v[0]
	}
	mt, _, _ := strings.Cut(ct, ";") // the parameters do not matter
	return strings.EqualFold(strings.TrimSpace(mt), "text/event-stream")
}

// streamBody passes an SSE response body through unchanged and finishes the
// trip's report when the stream ends.
//
// It has two ways of reading. Straight through, the default, reads the
// upstream into the caller's buffer and looks at the bytes there. Buffered,
// used while the injected usage chunk may still come and while waiting for
// the first token, reads into buf: buf[r:dec] is decided and handed out,
// buf[dec:w] is held back (an event that might be the usage chunk, until it
// was read), buf[scan:w] is not yet split into lines.
//
// What it reads follows the SSE specification's events: the data lines of
// one event are joined with "\n" and parsed once, at the blank line that ends
// the event (or at the stream's end). An event whose first data line is a
// whole chunk (see wholeChunk) is read at that line's end instead: no later
// line could continue it, and an upstream that sends no blank line between
// its chunks then has each read, and handed out, as its line ends. The data
// of a one-line event is not copied: it is a sub-slice of the bytes being
// scanned, copied into evBuf only when the event outlives them (its end is in
// a later read).
type streamBody struct {
	closing atomic.Bool // Close has begun
	rc      io.ReadCloser
	t       *trip
	a       *attempt
	sc      sse.Scanner

	drop      bool // the injected usage chunk may still come: hold back events
	dropBlank bool // the usage chunk was removed at its data line: remove the blank line that ends it
	buf       []byte
	pooled    *[]byte // the pool's buffer buf is, if it is
	r, dec, w int
	scan      int  // first byte not yet scanned
	lineStart int  // start of the line being scanned
	evStart   int  // start of the current event
	evPassed  bool // part of the current event was handed out: it is not the usage chunk

	// the data of the current event (guarded by mu)
	evData  []byte              // data lines so far, joined: in the bytes being scanned, or evBuf
	evOwned bool                // evData is in evBuf
	evInSc  bool                // evData is in the scanner's buffer, valid until it keeps a new partial line
	evBuf   []byte              // evData's copy once it outlives the bytes it was in
	evLines int                 // data lines so far
	evSize  int                 // bytes of data so far (joined), counted also past streamEventMax
	evLong  bool                // the data is over streamEventMax, or a line of it was cut: not parsed
	evCut   bool                // a line of it was cut at streamLineMax
	evHead  [streamHeadMax]byte // of a long event: its first bytes
	evHeadN int
	evTail  []byte // of a long event: its last streamTailMax bytes (to 2×streamTailMax)

	// holding: the stream is held until its first content (see hold);
	// failed: it failed before its first content (see judgeHold).
	holding bool
	failed  *streamFailure

	rerr  error       // the upstream's read error (io.EOF included), once it came
	over  atomic.Bool // the stream was finished: Read returns final
	final error       // what Read returns once the stream is over (guarded by mu)

	// The end its content tells (see ending): fin is how far it came
	// (Read's goroutine alone moves it, under mu); settled is set once the
	// content is complete, when the idle timeout becomes streamGrace;
	// drainable, that the upstream sent no end of its own when the stream
	// was over, and draining, that drain took the upstream body over.
	fin       int
	settled   atomic.Bool
	drainable bool
	draining  atomic.Bool

	mu    sync.Mutex // guards st and ended against a Close during Read
	st    streamState
	ended bool

	// idle timer: one AfterFunc per idle period, re-armed from mark
	idle     time.Duration
	mark     atomic.Int64 // time since t.start of the last Read entry or return
	inRead   atomic.Bool
	stalled  atomic.Bool
	armed    bool
	tmu      sync.Mutex
	stopIdle func() bool
	timerOff bool
	checkFn  func()
}

// streamState is what the stream told so far.
type streamState struct {
	terminal  bool   // [DONE] or a terminal Responses event
	usageEnd  bool   // the usage chunk of a chat or completions stream came
	finished  uint64 // chat/completions choices (by index < 64) that sent a finish_reason
	sawData   bool
	ev        [40]byte // the current event's name (truncated)
	evLen     int
	usage     Usage
	haveUsage bool
	gotFirst  bool
	ttft      time.Duration
	est       []byte // escaped delta text not yet counted
	estTokens int
	errMsg    string // the stream's error event, if any
	haveErr   bool
	junk      []byte // lines that are not SSE fields, before any data line

	// What the hold before the first content looks at (see hold).
	errKind   errorKind // the kind of an error event that came before the first content (status 0: none)
	errRaw    []byte    // its error object, when it was read
	malformed bool      // an event whose data is not valid JSON came before the first content
	filtered  bool      // a choice finished with content_filter, or a Responses answer was cut by one
}

func newStreamBody(t *trip, a *attempt) *streamBody {
	s := &streamBody{rc: a.resp.Body, t: t, a: a, drop: a.injected, idle: a.cand.timeouts().Idle}
	s.sc.Max, s.sc.Tail = streamLineMax, streamTailMax
	return s
}

func (s *streamBody) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	s.enter()
	defer s.leave()
	for {
		if s.over.Load() {
			// Ended: by EOF or an error once everything was handed out, or
			// by Close.
			s.mu.Lock()
			err := s.final
			s.mu.Unlock()
			return 0, err
		}
		if s.r < s.dec {
			n := copy(p, s.buf[s.r:s.dec])
			s.r += n
			return n, nil
		}
		if s.rerr != nil {
			s.recycle()
			return 0, s.end(s.rerr, false)
		}
		if !s.drop && s.r == s.w {
			// Straight through.
			s.recycle()
			s.r, s.dec, s.w, s.scan, s.lineStart, s.evStart = 0, 0, 0, 0, 0, 0
			n, err := s.rc.Read(p)
			settle := false
			s.mu.Lock()
			if !s.ended {
				n = s.feed(p[:n])
				err, settle = s.fed(err)
			}
			s.mu.Unlock()
			if settle {
				s.settle()
			}
			if err != nil {
				s.rerr = err
				return n, s.end(err, false)
			}
			return n, nil
		}
		s.fill()
	}
}

// streamBufs recycles the buffers of streams that hold bytes back.
var streamBufs = sync.Pool{New: func() any { b := make([]byte, streamBufSize); return &b }}

// recycle returns the pool's buffer once everything in buf was handed out
// (a larger one, grown to hold an event, is let go); only Read calls it,
// so no other goroutine holds the buffer.
func (s *streamBody) recycle() {
	if s.pooled != nil {
		streamBufs.Put(s.pooled)
	}
	s.buf, s.pooled = nil, nil
}

// fill reads the upstream into buf and decides what of it may be handed out.
func (s *streamBody) fill() {
	if s.buf == nil {
		s.pooled = streamBufs.Get().(*[]byte)
		s.buf = *s.pooled
	}
	if s.r == s.dec && s.r > 0 {
		// Everything decided was handed out: move the held bytes to the front.
		d := s.r
		copy(s.buf, s.buf[d:s.w])
		s.r, s.dec, s.w, s.scan, s.lineStart = 0, s.dec-d, s.w-d, s.scan-d, s.lineStart-d
		s.evStart = max(s.evStart-d, 0)
	}
	if s.w == len(s.buf) {
		n := 2 * len(s.buf)
		if s.holding {
			// The hold keeps an event up to streamEventMax: room for one
			// at once, rather than by doubling.
			n = max(n, streamEventMax+streamBufSize)
		}
		nb := make([]byte, n)
		copy(nb, s.buf[:s.w])
		s.buf = nb
		if s.pooled != nil { // the pool's buffer is no longer used
			streamBufs.Put(s.pooled)
			s.pooled = nil
		}
	}
	n, err := s.rc.Read(s.buf[s.w:])
	s.w += n
	if n > 0 && s.inRead.Load() {
		// Bytes came: not idle, even while Read holds them back to
		// find an event's end (and so does not return).
		s.mark.Store(int64(s.t.r.s.clock.Now().Sub(s.t.start)))
	}
	settle := false
	s.mu.Lock()
	if !s.ended {
		s.process()
		err, settle = s.fed(err)
	}
	s.mu.Unlock()
	if settle {
		s.settle()
	}
	if err != nil {
		s.rerr = err
		s.dec = s.w
	}
}

// fed follows a read whose bytes were looked at, err its error: at the
// upstream's end the last line and event are read (flush); once the
// stream is over, the error is io.EOF, whatever the upstream does next.
// settle tells that the stream's content became complete without its
// being over (see settle). s.mu is held.
func (s *streamBody) fed(err error) (_ error, settle bool) {
	switch {
	case s.fin == finOver:
		s.drainable = err == nil
		return io.EOF, false
	case err != nil:
		s.flush()
	}
	return err, !s.settled.Load() && s.contentDone()
}

// process splits buf[scan:w] into lines, looks at each, and, while the
// injected usage chunk may come, removes it and decides what is handed out.
func (s *streamBody) process() {
	for s.scan < s.w {
		if s.fin != finNo {
			s.scan += s.lastBlank(s.buf[s.scan:s.w])
			if s.fin == finOver {
				s.w = s.scan // what follows the end is not the stream's
			}
			break
		}
		start := s.lineStart
		s.keepBeforeScan(s.buf[s.scan:s.w])
		inSc := s.sc.Pending() // the line is in the scanner's buffer, not in buf
		line, full, n, ok := s.sc.Scan(s.buf[s.scan:s.w])
		s.scan += n
		if !ok {
			break
		}
		s.lineStart = s.scan
		kind, usageChunk := s.line(line, full, inSc)
		s.decide(kind, usageChunk, start, s.scan)
		if s.ending(kind); s.fin == finOver {
			s.w = s.scan
			break
		}
	}
	s.keepInput() // buf may move before the next call
	switch {
	case !s.drop:
		s.dec = s.w
	case s.dropBlank:
		// The line after the removed chunk has begun: hold it only while it
		// can still be the blank line that ends the chunk.
		if s.w > s.lineStart && (s.w-s.lineStart > 1 || s.buf[s.lineStart] != '\r') {
			s.dropBlank, s.drop = false, false
			s.dec = s.w
		}
	case s.evPassed || s.w-s.evStart > streamHoldMax:
		s.evPassed, s.dec = true, s.w
	}
}

// decide follows one line, buf[start:end], of kind, while the injected usage
// chunk may come: an event is held back until it was read (at its blank
// line, or at its data line when that is a whole chunk), then removed when
// it is the usage chunk, else handed out; or until it is known not to be the
// usage chunk (it has a line other than event: and data:, or is over
// streamHoldMax).
func (s *streamBody) decide(kind int, usageChunk bool, start, end int) {
	if !s.drop {
		return
	}
	if s.dropBlank {
		s.dropBlank, s.drop = false, false
		if kind == lineBlank {
			s.remove(start, end)
		}
		return
	}
	if kind == lineChunkAfter {
		// The event before ended where this line starts (it was not a
		// usage chunk: one is whole, and read at its own line).
		s.dec, s.evStart, s.evPassed = start, start, false
		kind = lineChunk
	}
	switch kind {
	case lineBlank, lineChunk:
		if usageChunk && !s.evPassed && end-s.evStart <= streamHoldMax {
			// The whole event, from its first line to this line.
			s.remove(s.evStart, end)
			s.dropBlank = kind == lineChunk // its blank line may follow
			s.drop = s.dropBlank
			return
		}
		s.dec, s.evStart, s.evPassed = end, end, false
	case lineEvent, lineData:
		if s.evPassed || end-s.evStart > streamHoldMax {
			s.evPassed, s.dec = true, end
		}
	default:
		s.evPassed, s.dec = true, end
	}
	if s.st.terminal {
		s.drop = false // nothing can come after [DONE] to remove
	}
}

// remove cuts buf[from:to] out of the bytes not yet handed out: the event
// that starts at from, scanned up to to; what follows it starts an event.
func (s *streamBody) remove(from, to int) {
	copy(s.buf[from:], s.buf[to:s.w])
	d := to - from
	s.w -= d
	s.scan -= d
	s.lineStart = s.scan
	s.evStart = from
	s.evPassed = false
}

// feed looks at bytes read straight through, and returns how many of them
// are the stream's: all, but for those after its end.
func (s *streamBody) feed(p []byte) int {
	for off := 0; off < len(p); {
		if s.fin != finNo {
			return off + s.lastBlank(p[off:])
		}
		s.keepBeforeScan(p[off:])
		inSc := s.sc.Pending() // the line is in the scanner's buffer, not in p
		line, full, n, ok := s.sc.Scan(p[off:])
		off += n
		if !ok {
			break
		}
		kind, _ := s.line(line, full, inSc)
		if s.ending(kind); s.fin == finOver {
			return off
		}
	}
	s.keepInput() // p is the caller's
	return len(p)
}

// How far a stream came to its end (streamBody.fin).
const (
	finNo    = iota // its content goes on
	finBlank        // its last event was read at its data line: the blank line that ends it may follow
	finCR           // and the "\r" of that blank line came
	finOver         // it is over: nothing that follows is the stream's
)

// ending follows the stream to its end after a line of kind: a terminal
// event ([DONE], response.completed...) read at its blank line ends it
// there; one read at its data line ends it after the blank line that
// follows, or before any other line (see lastBlank).
func (s *streamBody) ending(kind int) {
	if !s.st.terminal || s.fin != finNo {
		return
	}
	switch kind {
	case lineBlank:
		s.fin = finOver
	case lineChunk, lineChunkAfter:
		s.fin = finBlank
	}
}

// lastBlank looks at p, which follows the stream's last event (read at its
// data line), and returns how many of its bytes are the stream's: the
// blank line that ends the event ("\n" or "\r\n"), after which the stream
// is over; nothing when another line starts, before which it is over.
// When p ends inside that blank line, the rest of it may come.
func (s *streamBody) lastBlank(p []byte) int {
	n := 0
	if s.fin == finBlank && len(p) > 0 && p[0] == '\r' {
		n, s.fin = 1, finCR
	}
	switch {
	case n == len(p):
		return n
	case p[n] == '\n':
		n++
	}
	s.fin = finOver
	return n
}

// settle, once the stream's content is complete (see contentDone), cuts the
// idle timeout to streamGrace: what may still belong to the stream (the
// end of its last event, the [DONE] after the usage chunk) comes at once
// from an upstream that is not holding the connection open.
func (s *streamBody) settle() {
	if s.settled.Swap(true) {
		return
	}
	if s.idle > 0 && s.idle <= streamGrace {
		return // the idle timer is as short already
	}
	s.tmu.Lock()
	defer s.tmu.Unlock()
	if s.timerOff {
		return
	}
	if s.stopIdle != nil {
		s.stopIdle()
	}
	s.armed = true
	s.checkFn = s.checkIdle
	s.stopIdle = s.t.r.s.clock.AfterFunc(streamGrace, s.checkFn)
}

// idleLimit is the idle timeout now: the attempt's (0: none), or
// streamGrace once the stream settled.
func (s *streamBody) idleLimit() time.Duration {
	if s.settled.Load() && (s.idle <= 0 || s.idle > streamGrace) {
		return streamGrace
	}
	return s.idle
}

// flush looks at the end of a stream: its last line, when it did not end
// with a line end, and the event that the stream's end cut before its blank
// line, which is read as if it had ended there (as a stream that ends with
// "data: [DONE]\n" has). It removes that event when it is the injected usage
// chunk, as process would have.
func (s *streamBody) flush() {
	if line, full, ok := s.sc.Flush(); ok {
		kind, usageChunk := s.line(line, full, true) // no Scan follows
		s.decide(kind, usageChunk, s.lineStart, s.w)
	}
	if s.evLines > 0 {
		s.decide(lineBlank, s.dispatch(), s.w, s.w)
	}
}

const (
	lineBlank = iota
	lineEvent
	lineData
	lineChunk      // a data line that is an event's first and a whole chunk: read at once
	lineChunkAfter // a whole chunk after data it cannot continue: that data was an event of its own
	lineOther
)

// line looks at one SSE line: line holds its first bytes, full its length;
// inSc tells that line is in the scanner's buffer (else in the bytes the
// current feed or process call scans). It returns the line's kind and, for
// a line the event was read at (its blank line, or a lineChunk), whether the
// event was a usage chunk (usage and no choices).
func (s *streamBody) line(line []byte, full int, inSc bool) (kind int, usageChunk bool) {
	st := &s.st
	if full == 0 {
		usageChunk = s.dispatch()
		st.evLen = 0
		return lineBlank, usageChunk
	}
	name, val := sse.Field(line)
	switch string(name) {
	case "data":
		st.sawData = true
		full -= len(line) - len(val)
		if full == len(val) && wholeChunk(val) {
			switch {
			case s.evLines == 0:
				// No later line could continue it: read it now, where it lies.
				return lineChunk, s.data(val)
			case !s.continuable():
				// An upstream that sends no blank line between its chunks,
				// after a data line no JSON continues ("data: ping", a
				// line over the limit): that line was an event of its
				// own, and this one is a whole chunk.
				s.dispatch()
				return lineChunkAfter, s.data(val)
			}
		}
		s.dataLine(val, full, inSc)
		return lineData, false
	case "event":
		st.evLen = copy(st.ev[:], val)
		return lineEvent, false
	case "", "id", "retry":
		return lineOther, false
	}
	if !st.sawData && len(st.junk)+len(line) < streamJunkMax && full == len(line) {
		st.junk = append(append(st.junk, line...), '\n')
	}
	return lineOther, false
}

// dataLine adds the value of a data line to the current event's data: val
// holds its first bytes, full its length.
func (s *streamBody) dataLine(val []byte, full int, inSc bool) {
	size := s.evSize + full
	if s.evLines > 0 {
		size++ // the "\n" that joins it to the line before
	}
	s.evLines++
	s.evSize = size
	if s.evLong {
		s.longData(val, full)
		return
	}
	s.evCut = s.evCut || full > len(val)
	if full > len(val) || size > streamEventMax {
		// Too long to parse (a large tool-call argument, a Responses
		// event that repeats a long output): its first and last bytes
		// are kept, and dispatch reads them.
		s.evLong = true
		head := val
		if s.evLines > 1 {
			head = s.evData
		}
		s.evHeadN = copy(s.evHead[:], head)
		if typ := s.longType(); string(typ) == "response.failed" {
			// Its error comes before the output it repeats.
			if e := gjson.GetBytes(head, "response.error"); e.IsObject() {
				s.streamError(e)
			}
		}
		s.evTail = s.evTail[:0]
		if s.evLines > 1 {
			s.addTail(s.evData[len(s.evData)-min(len(s.evData), streamTailMax):])
		}
		s.longData(val, full)
		s.evData, s.evOwned, s.evInSc = nil, false, false
		return
	}
	if s.evLines == 1 {
		s.evData, s.evOwned, s.evInSc = val, false, inSc // the one-line case: no copy
		return
	}
	s.keepEvent()
	s.evBuf = append(append(s.evBuf, '\n'), val...)
	s.evData = s.evBuf
}

// longData adds the end of a data line of a long event to its tail: val
// holds the line's first bytes, full its length; the scanner has the last
// bytes of a line it cut.
func (s *streamBody) longData(val []byte, full int) {
	if s.evLines > 1 {
		s.addTail([]byte{'\n'})
	}
	if full > len(val) {
		val = s.sc.LastTail()
	}
	s.addTail(val)
}

// addTail appends b to the long event's tail, keeping its last
// streamTailMax bytes.
func (s *streamBody) addTail(b []byte) {
	if len(b) >= streamTailMax {
		s.evTail = append(s.evTail[:0], b[len(b)-streamTailMax:]...)
		return
	}
	s.evTail = append(s.evTail, b...)
	if len(s.evTail) > 2*streamTailMax {
		s.evTail = s.evTail[:copy(s.evTail, s.evTail[len(s.evTail)-streamTailMax:])]
	}
}

// continuable reports whether a later data line may continue the current
// event's data into JSON: data that opens an object or an array. An event
// of one line cut at streamLineMax is taken as a chunk of its own (an
// upstream without blank lines that sent a huge tool-call delta); one over
// streamEventMax by the sum of its lines is not.
func (s *streamBody) continuable() bool {
	if s.evLong {
		return !(s.evLines == 1 && s.evCut)
	}
	i := jsonscan.SkipSpace(s.evData, 0)
	return i < len(s.evData) && (s.evData[i] == '{' || s.evData[i] == '[')
}

// wholeChunk reports whether v is one whole JSON object, or [DONE], with
// white space around it allowed: data that no further line can continue
// into JSON. An upstream that sends no blank line between its chunks (one
// event, to the SSE spec, which openai-go cannot read) is so read line by
// line, as go-openai reads it.
func wholeChunk(v []byte) bool {
	i := jsonscan.SkipSpace(v, 0)
	if i == len(v) || v[i] != '{' {
		return string(bytes.TrimSpace(v)) == "[DONE]"
	}
	e, ok := objectEnd(v, i)
	return ok && jsonscan.SkipSpace(v, e) == len(v)
}

// keepEvent copies the current event's data into evBuf, where it stays
// valid, unless it is there already.
func (s *streamBody) keepEvent() {
	if s.evLines > 0 && !s.evOwned && !s.evLong {
		s.evBuf = append(s.evBuf[:0], s.evData...)
		s.evData, s.evOwned, s.evInSc = s.evBuf, true, false
	}
}

// keepInput keeps the current event's data when it is in the bytes the
// current feed or process call scans, before the call returns.
func (s *streamBody) keepInput() {
	if !s.evInSc {
		s.keepEvent()
	}
}

// keepBeforeScan keeps the current event's data before the scanner's next
// Scan of p when it is in the scanner's buffer and that Scan will overwrite
// it (p holds no line end, so the scanner keeps it as a new partial line).
// A data line that came in two reads is then read without a copy of its own
// when its event ends in the second.
func (s *streamBody) keepBeforeScan(p []byte) {
	if s.evInSc && bytes.IndexByte(p, '\n') < 0 {
		s.keepEvent()
	}
}

// dispatch parses the data of the event that just ended, if it had any, and
// reports whether it was a usage chunk.
func (s *streamBody) dispatch() (usageChunk bool) {
	if s.evLines == 0 {
		return false
	}
	v, long, size := s.evData, s.evLong, s.evSize
	s.evData, s.evOwned, s.evInSc, s.evLines, s.evSize, s.evLong, s.evCut = nil, false, false, 0, 0, false, false
	if long {
		s.longEvent(size)
		return false
	}
	return s.data(v)
}

// longEvent reads an event over streamEventMax from the bytes kept of it:
// its type from its first bytes (or its event: line), and a usage object
// from its last (a Responses event's response.usage follows the output it
// repeats; a chat chunk's usage is its last member). A terminal Responses
// event ends the stream, a failed one with its error when the kept first
// bytes hold it; any other event carries content (a long tool-call
// argument or delta), counted roughly at 4 bytes a token.
func (s *streamBody) longEvent(size int) {
	st := &s.st
	switch string(s.longType()) {
	case "response.completed", "response.incomplete":
		st.terminal = true
	case "response.failed":
		st.terminal = true
		s.streamErrorText("", "response.failed (an event over 256 KiB, its error not read)")
	default:
		s.content()
		st.estTokens += size / 4
	}
	if u, ok := tailUsage(s.evTail); ok {
		st.usage, st.haveUsage = u, true
	}
	s.evTail = s.evTail[:0]
}

// longType returns the type of a long event: its "type" member when that
// comes first, else its event: line when that names a Responses event.
func (s *streamBody) longType() []byte {
	if typ := firstType(s.evHead[:s.evHeadN]); typ != nil {
		return typ
	}
	if ev := s.st.ev[:s.st.evLen]; bytes.HasPrefix(ev, []byte("response.")) {
		return ev
	}
	return nil
}

// objectEnd returns the end of the JSON object or array that opens at v[i]
// (the index after its closing bracket), and false when it does not close
// within v.
func objectEnd(v []byte, i int) (int, bool) {
	depth := 0
	for ; i < len(v); i++ {
		switch v[i] {
		case '"':
			i = jsonscan.StringEnd(v, i)
		case '{', '[':
			depth++
		case '}', ']':
			if depth--; depth == 0 {
				return i + 1, true
			}
		}
	}
	return 0, false
}

// content records the first content chunk.
func (s *streamBody) content() {
	if !s.st.gotFirst {
		s.st.gotFirst = true
		s.st.ttft = s.t.r.s.clock.Now().Sub(s.t.start)
	}
}

// data looks at the data of one event.
func (s *streamBody) data(v []byte) (usageChunk bool) {
	st := &s.st
	// "data:  {...}", or a first data line left empty: JSON allows the
	// white space, and the SDKs read it.
	v = v[jsonscan.SkipSpace(v, 0):]
	if len(v) == 0 {
		return false
	}
	if v[0] != '{' {
		if string(bytes.TrimSpace(v)) == "[DONE]" {
			st.terminal = true
		}
		return false
	}
	if s.holding && !st.gotFirst && !gjson.ValidBytes(v) {
		st.malformed = true // (looked for only while the stream is held)
	}
	typ := firstType(v)
	if typ == nil && st.evLen > 0 {
		if ev := st.ev[:st.evLen]; bytes.HasPrefix(ev, []byte("response.")) || string(ev) == "error" {
			typ = ev
		}
	}
	if typ != nil {
		s.responsesEvent(typ, v)
		return false
	}
	return s.chatChunk(v)
}

// firstType returns the value of "type" when it is the object's first key,
// as in every Responses stream event.
func firstType(v []byte) []byte {
	i := jsonscan.SkipSpace(v, 1)
	if !bytes.HasPrefix(v[i:], []byte(`"type"`)) {
		return nil
	}
	i = jsonscan.SkipSpace(v, i+len(`"type"`))
	if i >= len(v) || v[i] != ':' {
		return nil
	}
	i = jsonscan.SkipSpace(v, i+1)
	if i >= len(v) || v[i] != '"' {
		return nil
	}
	end := jsonscan.StringEnd(v, i)
	if end >= len(v) {
		return nil
	}
	return v[i+1 : end]
}

// responsesEvent looks at one Responses API stream event.
func (s *streamBody) responsesEvent(typ, v []byte) {
	st := &s.st
	switch string(typ) {
	case "response.output_text.delta", "response.refusal.delta", "response.function_call_arguments.delta":
		if raw, ok := jsonscan.FindString(v, "delta"); ok && len(raw) > 0 {
			s.content()
			s.estimate(raw)
		}
	case "response.reasoning_text.delta", "response.reasoning_summary_text.delta":
		if raw, ok := jsonscan.FindString(v, "delta"); ok {
			s.estimate(raw)
		}
	case "response.completed", "response.incomplete", "response.failed":
		st.terminal = true
		if u, ok := parseUsage(v); ok {
			st.usage, st.haveUsage = u, true
		}
		switch string(typ) {
		case "response.failed":
			s.streamError(gjson.GetBytes(v, "response.error"))
		case "response.incomplete":
			if gjson.GetBytes(v, "response.incomplete_details.reason").Str == "content_filter" {
				st.filtered = true
			}
		}
	case "error":
		root := gjson.ParseBytes(v)
		if e := root.Get("error"); e.IsObject() {
			root = e
		}
		s.streamError(root)
	}
}

// chunkFacts is what one pass over a chat or completions chunk found.
type chunkFacts struct {
	hasUsage, emptyChoices, noChoices, finish bool
}

// chatChunk looks at one chat or completions chunk in a single pass over its
// keys: content and tool-call deltas, usage, an error.
func (s *streamBody) chatChunk(v []byte) (usageChunk bool) {
	st := &s.st
	f := chunkFacts{noChoices: true}
	n := len(v)
	// One pass over the bytes: a plain loop beats a search call per string
	// on chunks this small.
	for i := 0; i < n; i++ {
		if v[i] != '"' {
			continue
		}
		ks := i
		ke := jsonscan.StringEnd(v, ks)
		if ke >= n {
			break
		}
		i = ke
		j := jsonscan.SkipSpace(v, ke+1)
		if j >= n || v[j] != ':' {
			continue // a string value
		}
		j = jsonscan.SkipSpace(v, j+1)
		if j >= n {
			break
		}
		key := v[ks+1 : ke]
		if v[j] != '"' {
			i = j - 1
			s.chunkMember(key, v, j, &f)
			continue
		}
		ve := jsonscan.StringEnd(v, j)
		if ve >= n {
			break
		}
		i = ve
		raw := v[j+1 : ve]
		switch string(key) {
		case "content", "refusal", "text", "arguments":
			if len(raw) > 0 {
				s.content()
				s.estimate(raw)
			}
		case "name", "reasoning_content", "reasoning":
			s.estimate(raw)
		case "finish_reason":
			f.finish = f.finish || len(raw) > 0
		}
	}
	if f.finish {
		s.finishChoices(v)
	}
	if f.hasUsage {
		if u, ok := parseUsage(v); ok {
			st.usage, st.haveUsage = u, true
			if f.emptyChoices || f.noChoices {
				st.usageEnd = true
				return true
			}
		}
	}
	return false
}

// chunkMember looks at a member of a chunk whose value, at v[j], is not a
// string.
func (s *streamBody) chunkMember(key, v []byte, j int, f *chunkFacts) {
	n := len(v)
	switch string(key) {
	case "tool_calls":
		if v[j] == '[' {
			if k := jsonscan.SkipSpace(v, j+1); k < n && v[k] == '{' {
				s.content()
			}
		}
	case "usage":
		f.hasUsage = f.hasUsage || v[j] == '{'
	case "choices":
		f.noChoices = false
		if v[j] == '[' {
			if k := jsonscan.SkipSpace(v, j+1); k < n && v[k] == ']' {
				f.emptyChoices = true
			}
		}
	case "error":
		if v[j] == '{' {
			s.streamError(gjson.GetBytes(v, "error"))
		}
	}
}

// finishChoices records which choices of a chunk carry a finish_reason.
func (s *streamBody) finishChoices(v []byte) {
	gjson.GetBytes(v, "choices").ForEach(func(_, c gjson.Result) bool {
		if fr := c.Get("finish_reason"); fr.Type == gjson.String && fr.Str != "" {
			if i := c.Get("index").Int(); i >= 0 && i < 64 {
				s.st.finished |= 1 << i
			}
			if fr.Str == "content_filter" {
				s.st.filtered = true
			}
		}
		return true
	})
}

// complete reports whether the stream ended cleanly, judged from its
// content: [DONE] or a terminal Responses event came, or the usage chunk
// came, or every choice of a chat or completions stream (the request's n, 1
// by default) sent its finish_reason. SDKs read such a stream as finished
// (go-openai returns io.EOF), so the router does too; a stream cut before is
// cut.
func (s *streamBody) complete() bool {
	st := &s.st
	if st.terminal || st.usageEnd {
		return true
	}
	if st.haveErr || !wantsStreamUsage(s.t.c.req.Endpoint) {
		return false
	}
	return s.allFinished()
}

// contentDone reports whether the stream's content is all there: [DONE] or
// a terminal Responses event came, or the usage chunk after every choice's
// finish_reason.
func (s *streamBody) contentDone() bool {
	st := &s.st
	return st.terminal || (st.usageEnd && s.allFinished())
}

// allFinished reports whether every choice of a chat or completions stream
// (the request's n, 1 by default) sent its finish_reason.
func (s *streamBody) allFinished() bool {
	if s.st.finished == 0 {
		return false
	}
	n := int64(1)
	if v := gjson.Get(s.t.c.body, "n"); v.Type == gjson.Number && v.Int() > 1 {
		n = v.Int()
	}
	return int64(bits.OnesCount64(s.st.finished)) >= n
}

// estimate keeps escaped delta text to count if no usage comes, counting it
// in pieces so that memory stays bounded.
func (s *streamBody) estimate(raw []byte) {
	st := &s.st
	if len(raw) == 0 {
		return
	}
	if st.est == nil {
		st.est = make([]byte, 0, 4<<10)
	}
	st.est = append(st.est, raw...)
	if len(st.est) >= streamEstFlush {
		st.estTokens += s.countEst()
	}
}

// countEst counts the kept delta text and empties it.
func (s *streamBody) countEst() int {
	st := &s.st
	if len(st.est) == 0 {
		return 0
	}
	var text string
	if bytes.IndexByte(st.est, '\\') < 0 {
		text = string(st.est)
	} else {
		q := make([]byte, 0, len(st.est)+2)
		q = append(append(append(q, '"'), st.est...), '"')
		text = gjson.ParseBytes(q).Str
	}
	st.est = st.est[:0]
	return s.t.c.enc.Count(text)
}

// streamError records the first error event of the stream, e its error
// object, and what kind of error it is.
func (s *streamBody) streamError(e gjson.Result) {
	if st := &s.st; !st.haveErr && !st.gotFirst {
		st.errKind = errorKindOf(e)
		if len(e.Raw) <= streamJunkMax {
			st.errRaw = []byte(s.t.r.s.secrets.redact(e.Raw, sentSecrets(s.a.out)...))
		}
	}
	s.streamErrorText(e.Get("code").String(), e.Get("message").String())
}

// streamErrorText records the first error event of the stream, from its
// code and message.
func (s *streamBody) streamErrorText(code, msg string) {
	st := &s.st
	if st.haveErr {
		return
	}
	st.haveErr = true
	if !st.gotFirst && st.errKind.status == 0 {
		st.errKind.status = http.StatusInternalServerError // (an error not read: see longEvent)
	}
	// Upstreams echo the key they got ("Incorrect API key provided: ..."),
	// a caller's own one too when the router forwarded it.
	msg = s.t.r.s.secrets.redact(msg, sentSecrets(s.a.out)...)
	if len(msg) > streamMsgMax {
		msg = msg[:streamMsgMax] + "..."
	}
	switch {
	case code != "" && msg != "":
		st.errMsg = code + ": " + msg
	case code != "":
		st.errMsg = code
	default:
		st.errMsg = msg
	}
}

// end finishes the stream once: it makes the report and returns what the
// reader gets from now on. cause is the upstream's read error (io.EOF at a
// normal end), or nil when the caller closed the body.
func (s *streamBody) end(cause error, closed bool) error {
	if !closed && s.closing.Load() {
		// The caller's Close made the pending Read fail: that is a close,
		// not a broken stream.
		cause, closed = nil, true
	}
	s.stopTimer()
	s.mu.Lock()
	if s.ended {
		err := s.final
		s.mu.Unlock()
		return err
	}
	s.ended = true
	t := s.t
	st := &s.st
	switch {
	case closed:
	case s.drainable:
		s.drain()
	default:
		s.rc.Close()
	}
	// An event the caller closed the body in (its data lines came, its blank
	// line not yet) is read as it is; at the stream's end flush did it.
	s.dispatch()
	var readErr, cancelled error
	switch {
	case closed:
		if err := t.ctx.Err(); err != nil && (!s.complete() || s.r < s.dec) {
			// Cancelled and closed before the stream's end (openai-go
			// closes it so when its context ends), or before reading all
			// that was read ahead of it: not a success.
			cancelled = err
		}
	case s.stalled.Load():
		if !s.complete() {
			readErr = ErrStreamStalled
		}
	case cause == io.EOF:
		if !s.complete() {
			readErr = io.ErrUnexpectedEOF
		}
	case cause != nil:
		if !s.complete() { // a cut after the stream's end loses nothing
			readErr = cause
		}
	}
	end := bodyEnd{ttft: st.ttft, usage: st.usage, haveUsage: st.haveUsage}
	s.final = io.EOF
	if closed {
		s.final = errBodyClosed
	}
	if readErr != nil {
		s.final = t.errorf("stream", readErr)
		end.err = s.final
	}
	if cancelled != nil {
		e := t.errorf("stream", cancelled)
		e.StatusCode = t.att.resp.StatusCode
		end.err = e
	}
	s.junkError()
	if st.haveErr {
		end.err = t.errorf("stream", fmt.Errorf("%w: %s", ErrStreamError, st.errMsg))
	}
	if !end.haveUsage {
		end.usage, end.haveUsage = t.estimated(st.estTokens + s.countEst())
	}
	final := s.final
	s.over.Store(true)
	s.mu.Unlock()
	t.finish(end) // without s.mu: OnReport runs with no lock held
	return final
}

// junkError reads the error of a body that is not SSE, such as a JSON error
// sent with the event-stream Content-Type, from the lines kept of it.
func (s *streamBody) junkError() {
	st := &s.st
	if !st.haveErr && !st.sawData && len(st.junk) > 0 {
		if e := gjson.GetBytes(st.junk, "error"); e.IsObject() {
			s.streamError(e)
		}
	}
}

// errBodyClosed is what Read returns after Close, as net/http's bodies do.
var errBodyClosed = errors.New("http: read on closed response body")

func (s *streamBody) Close() error {
	s.closing.Store(true)
	if s.draining.Load() {
		return nil // the stream was over: drain lets go of the upstream
	}
	err := s.rc.Close()
	s.end(nil, true)
	return err
}

// drain lets go of the upstream of a stream that is over although the
// upstream did not end its body: what follows (the end of a chunked body,
// usually on its way already) is read and dropped on a goroutine of its
// own, within streamDrainMax bytes and streamDrainWait, so that an upstream
// that ends its body at once leaves its connection to be reused; then the
// body is closed and the attempt's context ended. s.mu is held.
func (s *streamBody) drain() {
	s.draining.Store(true)
	cancel := s.t.att.cancel
	s.t.att.cancel = nil // ended here, not when the trip finishes
	rc := s.rc
	go func() {
		timer := time.AfterFunc(streamDrainWait, func() { rc.Close() })
		io.Copy(io.Discard, io.LimitReader(rc, streamDrainMax))
		timer.Stop()
		rc.Close()
		if cancel != nil {
			cancel()
		}
	}()
}

// hold reads ahead, keeping what it read for the caller, until the
// stream's first content chunk, or until what it read says that none will
// come: an error event, data that is not JSON, the stream's end (clean or
// cut), a stall (the idle timeout counts while the hold waits, as while
// the caller waits in Read). It returns ErrFirstTokenTimeout when d is set
// and no content came within d of the call. It stops too past
// streamAheadMax bytes read, at an event too long to parse, and, with d
// zero, once window has passed, looked at as bytes arrive: the stream is
// then the caller's as it is.
func (s *streamBody) hold(d, window time.Duration) error {
	clock := s.t.r.s.clock
	start := clock.Now()
	var fired func() bool
	if d > 0 {
		fired = s.firstTokenTimer(d)
	}
	s.holding = true
	// Silence before the first content is bounded by the first-token
	// timeout when there is one (a slow model's own, which may be longer
	// than IdleTimeout), else by IdleTimeout.
	if d <= 0 {
		s.enter()
	}
	for !s.holdOver() {
		s.fill()
		if d <= 0 && clock.Now().Sub(start) >= window {
			break
		}
	}
	if d <= 0 {
		s.leave()
	}
	s.holding = false
	if fired != nil && fired() {
		return ErrFirstTokenTimeout
	}
	return nil
}

// firstTokenTimer arms the first-token timer, which closes the upstream
// when it fires; fired stops it and reports whether it fired first.
func (s *streamBody) firstTokenTimer(d time.Duration) (fired func() bool) {
	// state settles the race between the timer and the first token: 0
	// while waiting, 1 once the stream is kept, 2 once the timer fired.
	var state atomic.Int32
	stop := s.t.r.s.clock.AfterFunc(d, func() {
		if state.CompareAndSwap(0, 2) {
			s.rc.Close()
			if s.a.cancel != nil {
				s.a.cancel()
			}
		}
	})
	return func() bool {
		stop()
		return !state.CompareAndSwap(0, 1)
	}
}

// holdOver reports whether the hold has what it waits for: the first
// content, or a reason to stop waiting for it. An event over
// streamEventMax ends it too (a long tool-call argument, a long terminal
// Responses event): its bytes are not kept to be parsed, nor held.
func (s *streamBody) holdOver() bool {
	st := &s.st
	return st.gotFirst || st.haveErr || st.malformed || s.rerr != nil || s.evLong || s.evSize+s.sc.PendingSize() > streamEventMax ||
		s.contentDone() || s.w-s.r >= streamAheadMax
}

// abandon releases a stream that is not handed to the caller: the upstream
// body is closed, its timers stopped, and no report is made.
func (s *streamBody) abandon() {
	s.stopTimer()
	s.rc.Close()
	if s.a.cancel != nil {
		s.a.cancel()
	}
}

// enter and leave mark the time of each Read, for the idle timer; enter
// arms it on the first Read.
func (s *streamBody) enter() {
	s.mark.Store(int64(s.t.r.s.clock.Now().Sub(s.t.start)))
	s.inRead.Store(true)
	if !s.armed && s.idle > 0 {
		s.armed = true
		s.checkFn = s.checkIdle
		s.tmu.Lock()
		if !s.timerOff {
			s.stopIdle = s.t.r.s.clock.AfterFunc(s.idle, s.checkFn)
		}
		s.tmu.Unlock()
	}
}

func (s *streamBody) leave() {
	s.mark.Store(int64(s.t.r.s.clock.Now().Sub(s.t.start)))
	s.inRead.Store(false)
}

// checkIdle runs once per idle period: it closes the upstream when the
// caller has been waiting in Read for the whole idle timeout, and re-arms
// the timer for the rest of the period otherwise.
func (s *streamBody) checkIdle() {
	s.tmu.Lock()
	defer s.tmu.Unlock()
	if s.timerOff {
		return
	}
	limit := s.idleLimit()
	wait := limit
	if s.inRead.Load() {
		idle := s.t.r.s.clock.Now().Sub(s.t.start) - time.Duration(s.mark.Load())
		if idle >= limit {
			s.timerOff = true
			s.stalled.Store(true)
			s.rc.Close()
			if s.a.cancel != nil {
				s.a.cancel()
			}
			return
		}
		wait = limit - idle
	}
	s.stopIdle = s.t.r.s.clock.AfterFunc(wait, s.checkFn)
}

func (s *streamBody) stopTimer() {
	s.tmu.Lock()
	s.timerOff = true
	if s.stopIdle != nil {
		s.stopIdle()
	}
	s.tmu.Unlock()
}
