package relay

import (
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync/atomic"
)

// HeaderRequestID is the response header that carries the request's ID
// (Report.RequestID).
const HeaderRequestID = "X-Relay-Request-Id"

// maxRequestIDLen bounds a caller-supplied request ID.
const maxRequestIDLen = 128

// requestIDs makes the IDs of one Router's requests: a random 64-bit
// prefix drawn by New, in hex, then a dash and the request's number, from
// an atomic counter (e.g. "9f3c2a7d51e0b846-17"). IDs are unique within
// the Router and, with the random prefix, across the replicas of a fleet;
// making one takes an atomic add and one small allocation, no lock.
type requestIDs struct {
	prefix string // "9f3c2a7d51e0b846-"
	seq    atomic.Uint64
}

// init draws the prefix.
func (ids *requestIDs) init() {
	ids.prefix = strconv.FormatUint(rand.Uint64()|1<<63, 16) + "-" // (the top bit set: always 16 digits)
}

// of returns the ID of a request with header h: the caller's
// X-Relay-Request-Id or X-Request-Id when it has one that is usable (1 to
// 128 visible ASCII characters), else a new one.
func (ids *requestIDs) of(h http.Header) string {
	for _, k := range [...]string{HeaderRequestID, "X-Request-Id"} {
		if v := headerValue(h, k); usableRequestID(v) {
			return v
		}
	}
	var buf [40]byte
	b := append(buf[:0], ids.prefix...)
	return string(strconv.AppendUint(b, ids.seq.Add(1), 10))
}

// usableRequestID reports whether a caller's ID can be used as it is: it
// goes into a header and into logs, so it must be short and printable.
func usableRequestID(v string) bool {
	if v == "" || len(v) > maxRequestIDLen {
		return false
	}
	for i := 0; i < len(v); i++ {
		if v[i] <= ' ' || v[i] >= 0x7f {
			return false
		}
	}
	return true
}
