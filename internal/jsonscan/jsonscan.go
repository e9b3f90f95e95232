// Package jsonscan is the router's one JSON scanner: a few small functions
// that step over JSON text without decoding it, for string and []byte alike.
//
// The functions assume the text is valid JSON (check it with Valid first)
// and never panic on text that is not: they stop at the end of the input.
// Member names are compared as written, so a name spelled with JSON escapes
// does not match its plain spelling.
package jsonscan

import (
	"encoding/binary"
	"math/bits"
	"strconv"
	"strings"
	"unicode/utf8"
	"unsafe"
)

// Text is JSON text: a string or a byte slice.
type Text interface{ ~string | ~[]byte }

// str views s as a string without copying. A slice header begins with the
// same two words as a string header.
func str[T Text](s T) string { return *(*string)(unsafe.Pointer(&s)) }

// MaxDepth bounds the nesting of JSON that Valid accepts: deeper text is
// treated as not JSON. The scanners here do not recurse, but other readers
// of the same text (gjson, encoding/json) recurse once per level.
const MaxDepth = 512

// Valid reports whether s is valid JSON (RFC 8259, as gjson.Valid checks
// it: strings are not checked for valid UTF-8) nested at most MaxDepth
// deep. It does not recurse, and reads s once.
func Valid[T Text](s T) bool {
	v := str(s)
	e, ok := ValidValue(v, SkipSpace(v, 0), 0)
	return ok && SkipSpace(v, e) == len(v)
}

// Object checks that s is one valid JSON object, as Valid checks it, with
// its members read by f as Members reads them: one pass for checking and
// reading. It reports whether s is valid; when it is not, f may have been
// called for the members before the fault.
func Object(s string, f func(key string, esc bool, j, depth int) (end int, ok bool)) bool {
	i := SkipSpace(s, 0)
	if i >= len(s) || s[i] != '{' {
		return false
	}
	e, ok := Members(s, i, 0, f)
	return ok && SkipSpace(s, e) == len(s)
}

// Members checks the JSON object that opens at s[i] == '{', inside depth
// enclosing arrays and objects, as ValidValue checks it, but leaves its
// members' values to f: for each member in order, f gets the name (raw,
// without its quotes) and the offset of the value (white space skipped),
// checks the value inside depth+1 (ValidValue, or Members for an object
// it reads), and returns the offset just past it. Members returns the
// offset just past the object, and whether it is valid.
func Members(s string, i, depth int, f func(key string, esc bool, j, depth int) (end int, ok bool)) (end int, ok bool) {
	if depth >= MaxDepth {
		return i, false
	}
	if i = SkipSpace(s, i+1); i < len(s) && s[i] == '}' {
		return i + 1, true
	}
	for {
		if i >= len(s) || s[i] != '"' {
			return i, false
		}
		ke, esc, ok := ValidString(s, i)
		if !ok {
			return ke, false
		}
		key := s[i+1 : ke-1]
		if i = SkipSpace(s, ke); i >= len(s) || s[i] != ':' {
			return i, false
		}
		if i = SkipSpace(s, i+1); i >= len(s) {
			return i, false
		}
		e, ok := f(key, esc, i, depth+1)
		if !ok {
			return e, false
		}
		if i = SkipSpace(s, e); i >= len(s) {
			return i, false
		}
		switch s[i] {
		case ',':
			i = SkipSpace(s, i+1)
		case '}':
			return i + 1, true
		default:
			return i, false
		}
	}
}

// ValidValue checks the JSON value that starts at s[i] (white space before
// it already skipped), inside depth enclosing arrays and objects, and
// returns the offset just past it. It fails if the value is not valid JSON
// or nests deeper than MaxDepth in all. It does not recurse.
func ValidValue(s string, i, depth int) (end int, ok bool) {
	// open[k/64] bit k%64 is set when the k-th container opened here is an
	// object.
	var open [MaxDepth / 64]uint64
	n := 0 // containers open
	for {
		// A value starts at s[i].
		if i >= len(s) {
			return i, false
		}
		switch c := s[i]; c {
		case '"':
			if i, _, ok = ValidString(s, i); !ok {
				return i, false
			}
		case '{', '[':
			if depth+n >= MaxDepth {
				return i, false
			}
			if c == '{' {
				open[n/64] |= 1 << (n % 64)
			} else {
				open[n/64] &^= 1 << (n % 64)
			}
			n++
			i = SkipSpace(s, i+1)
			if i < len(s) && s[i] == c+2 { // '}' or ']': empty
				n--
				i++
				break
			}
			if c == '{' {
				if i, ok = validKey(s, i); !ok {
					return i, false
				}
			}
			continue
		default:
			if i, ok = validScalar(s, i); !ok {
				return i, false
			}
		}
		// After a value: close containers until one goes on.
		for {
			if n == 0 {
				return i, true
			}
			i = SkipSpace(s, i)
			if i >= len(s) {
				return i, false
			}
			obj := open[(n-1)/64]&(1<<((n-1)%64)) != 0
			switch c := s[i]; {
			case c == ',':
				i = SkipSpace(s, i+1)
				if obj {
					if i, ok = validKey(s, i); !ok {
						return i, false
					}
				}
			case obj && c == '}', !obj && c == ']':
				n--
				i++
				continue
			default:
				return i, false
			}
			break
		}
	}
}

// validScalar checks the literal or number at s[i] and returns its end.
func validScalar(s string, i int) (int, bool) {
	var lit string
	switch s[i] {
	case 't':
		lit = "true"
	case 'f':
		lit = "false"
	case 'n':
		lit = "null"
	default:
		return validNumber(s, i)
	}
	if !strings.HasPrefix(s[i:], lit) {
		return i, false
	}
	return i + len(lit), true
}

// validKey checks a member name and its colon at s[i] and returns the
// offset of the value after them.
func validKey(s string, i int) (int, bool) {
	if i >= len(s) || s[i] != '"' {
		return i, false
	}
	i, _, ok := ValidString(s, i)
	if !ok {
		return i, false
	}
	i = SkipSpace(s, i)
	if i >= len(s) || s[i] != ':' {
		return i, false
	}
	return SkipSpace(s, i+1), true
}

// ValidString checks the JSON string that opens at s[i] == '"' and returns
// the offset just past its closing quote, and whether it has escapes.
func ValidString(s string, i int) (end int, esc, ok bool) {
	i++
	// Most strings are short (member names, roles, numbers): look for
	// their end eight bytes at a time over the first 32 bytes, then go on
	// as a long string would.
	for n := 0; n < 4 && i+8 <= len(s); n++ {
		if m := special8(binary.LittleEndian.Uint64(unsafe.Slice(unsafe.StringData(s), len(s))[i : i+8])); m != 0 {
			// The lowest flag is exact (a false one only follows a true
			// one): the first special byte.
			i += bits.TrailingZeros64(m) >> 3
			if s[i] == '"' {
				return i + 1, false, true
			}
			break // an escape or a control character at i
		}
		i += 8
	}
	return validLongString(s, i)
}

// validLongString is ValidString from s[i], inside the string.
func validLongString(s string, i int) (end int, esc, ok bool) {
	// q is the next quote at or after i: the end, unless an escape holds
	// it. Between escapes, the text only needs its control characters
	// checked; quotes and backslashes are found by strings.IndexByte,
	// which is vectorized.
	q := nextByte(s, i, '"')
	for {
		lim := q
		if q < 0 {
			lim = len(s)
		}
		b := nextByte(s[:lim], i, '\\')
		seg := lim
		if b >= 0 {
			seg = b
		}
		if c := firstControl(s, i, seg); c >= 0 {
			return c, esc, false
		}
		if b < 0 {
			if q < 0 {
				return len(s), esc, false
			}
			return q + 1, esc, true
		}
		esc = true
		if b+1 >= len(s) {
			return b + 1, esc, false
		}
		switch s[b+1] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			i = b + 2
		case 'u':
			if b+6 > len(s) || !isHex(s[b+2]) || !isHex(s[b+3]) || !isHex(s[b+4]) || !isHex(s[b+5]) {
				return b, esc, false
			}
			i = b + 6
		default:
			return b, esc, false
		}
		if q >= 0 && i > q { // an escaped quote: the end is further on
			q = nextByte(s, i, '"')
		}
	}
}

// special8 is not zero when a byte of x is a quote, a backslash or below
// 0x20.
func special8(x uint64) uint64 {
	q := x ^ ('"' * ones)
	b := x ^ ('\\' * ones)
	return ((q-ones)&^q | (b-ones)&^b | (x-0x20*ones)&^x) & highs
}

// nextByte returns the index of the first c in s at or after i, or -1.
func nextByte(s string, i int, c byte) int {
	if j := strings.IndexByte(s[i:], c); j >= 0 {
		return i + j
	}
	return -1
}

// firstControl returns the index of the first byte of s[i:j] below 0x20,
// or -1.
func firstControl(s string, i, j int) int {
	for b := unsafe.Slice(unsafe.StringData(s), len(s)); i+8 <= j; i += 8 {
		if x := binary.LittleEndian.Uint64(b[i : i+8]); (x-0x20*ones)&^x&highs != 0 {
			break // one of these eight: found below
		}
	}
	for ; i < j; i++ {
		if s[i] < 0x20 {
			return i
		}
	}
	return -1
}

func isHex(c byte) bool {
	return c-'0' < 10 || (c|0x20)-'a' < 6
}

const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// validNumber checks the JSON number at s[i:] and returns its end.
func validNumber(s string, i int) (int, bool) {
	if s[i] == '-' {
		i++
	}
	switch {
	case i >= len(s) || s[i]-'0' > 9:
		return i, false
	case s[i] == '0':
		i++
	default:
		i = digits(s, i)
	}
	if i < len(s) && s[i] == '.' {
		i++
		if i >= len(s) || s[i]-'0' > 9 {
			return i, false
		}
		i = digits(s, i)
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if i >= len(s) || s[i]-'0' > 9 {
			return i, false
		}
		i = digits(s, i)
	}
	return i, true
}

func digits(s string, i int) int {
	for i < len(s) && s[i]-'0' <= 9 {
		i++
	}
	return i
}

// Depth returns the deepest nesting of arrays and objects in s, strings
// skipped.
func Depth[T Text](s T) int {
	v := str(s)
	depth, deepest, inString := 0, 0, false
	for i := 0; i < len(v); i++ {
		c := v[i]
		if inString {
			switch c {
			case '\\':
				i++
			case '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '[', '{':
			depth++
			deepest = max(deepest, depth)
		case ']', '}':
			depth--
		}
	}
	return deepest
}

// SkipSpace returns the index of the first byte of s at or after i that is
// not JSON white space.
func SkipSpace[T Text](s T, i int) int {
	for i < len(s) && s[i] <= ' ' && spaceMask>>s[i]&1 != 0 {
		i++
	}
	return i
}

// spaceMask has bit c set for each JSON white-space byte c.
const spaceMask = 1<<' ' | 1<<'\t' | 1<<'\n' | 1<<'\r'

// StringEnd returns the index of the quote that closes the JSON string
// opening at s[i], or len(s) when it is not closed.
func StringEnd[T Text](s T, i int) int {
	return stringEnd(str(s), i)
}

func stringEnd(s string, i int) int {
	j := i + 1
	for j < len(s) {
		var q int
		if len(s)-j <= 32 {
			// Short strings, such as the keys of a stream chunk: a plain
			// loop beats a search call.
			q = j
			for q < len(s) && s[q] != '"' {
				q++
			}
			if q == len(s) {
				return len(s)
			}
		} else {
			q = strings.IndexByte(s[j:], '"')
			if q < 0 {
				return len(s)
			}
			q += j
		}
		k := q
		for k > i+1 && s[k-1] == '\\' {
			k--
		}
		if (q-k)%2 == 0 {
			return q
		}
		j = q + 1
	}
	return len(s)
}

// SkipValue returns the offset just past the value that starts at s[i].
func SkipValue[T Text](s T, i int) int { return skipValue(str(s), i) }

func skipValue(s string, i int) int {
	if i >= len(s) {
		return i
	}
	switch s[i] {
	case '"':
		return min(stringEnd(s, i)+1, len(s))
	case '{', '[':
		depth := 0
		for i < len(s) {
			switch s[i] {
			case '"':
				i = min(stringEnd(s, i)+1, len(s))
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return len(s)
	}
	for i < len(s) {
		switch s[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
		i++
	}
	return i
}

// Each calls f with the key (raw, without its quotes; empty in an array)
// and the raw value of each member of the object or array at s[i:], in
// order, until f returns false. It does nothing if s[i:] is neither.
func Each[T Text](s T, i int, f func(key, val T) bool) {
	v := str(s)
	i = SkipSpace(v, i)
	if i >= len(v) || (v[i] != '{' && v[i] != '[') {
		return
	}
	obj := v[i] == '{'
	i++
	for {
		i = SkipSpace(v, i)
		if i >= len(v) || v[i] == '}' || v[i] == ']' {
			return
		}
		if v[i] == ',' {
			i++
			continue
		}
		ks, ke := 0, 0
		if obj {
			if v[i] != '"' {
				return
			}
			ks, ke = i+1, max(i+1, stringEnd(v, i))
			i = SkipSpace(v, min(ke+1, len(v)))
			if i >= len(v) || v[i] != ':' {
				return
			}
			i = SkipSpace(v, i+1)
			if i >= len(v) {
				return
			}
		}
		e := skipValue(v, i)
		if e <= i || !f(s[ks:ke], s[i:e]) {
			return
		}
		i = e
	}
}

// Field returns the raw value of the member key of the object s, or an
// empty value when there is none.
func Field[T Text](s T, key string) T {
	var out T
	Each(s, 0, func(k, v T) bool {
		if str(k) == key {
			out = v
			return false
		}
		return true
	})
	return out
}

// FindString returns the raw (escaped) text of the first string value of a
// member named key, anywhere in s: it scans the strings of s in order, so it
// also finds nested members, and is meant for small documents whose shape
// is known (a stream event).
func FindString[T Text](s T, key string) (T, bool) {
	v := str(s)
	for i := 0; ; {
		q := strings.IndexByte(v[i:], '"')
		if q < 0 {
			return s[:0], false
		}
		ks := i + q
		ke := stringEnd(v, ks)
		if ke >= len(v) {
			return s[:0], false
		}
		i = ke + 1
		j := SkipSpace(v, i)
		if j >= len(v) || v[j] != ':' {
			continue
		}
		j = SkipSpace(v, j+1)
		if j >= len(v) || v[j] != '"' {
			i = j
			continue
		}
		ve := stringEnd(v, j)
		if ve >= len(v) {
			return s[:0], false
		}
		if v[ks+1:ke] == key {
			return s[j+1 : ve], true
		}
		i = ve + 1
	}
}

// IsString reports whether raw is a non-empty JSON string.
func IsString[T Text](raw T) bool { return len(raw) > 2 && raw[0] == '"' }

// AppendString appends the decoded JSON string raw (a raw JSON value, with
// its quotes; nothing if it is not a string) to dst, stopping once dst holds
// limit bytes.
func AppendString[T Text](dst []byte, raw T, limit int) []byte {
	if len(raw) >= 2 && raw[0] == '"' {
		return AppendUnescaped(dst, str(raw)[1:len(raw)-1], limit)
	}
	return dst
}

// AppendUnescaped appends the decoded JSON string body raw (without its
// quotes) to dst, stopping once dst holds limit bytes. Invalid escapes are
// copied as they are; lone surrogates become U+FFFD.
func AppendUnescaped[T Text](dst []byte, raw T, limit int) []byte {
	s := str(raw)
	for i := 0; i < len(s) && len(dst) < limit; {
		j := strings.IndexByte(s[i:], '\\')
		if j < 0 {
			j = len(s)
		} else {
			j += i
		}
		if j > i {
			dst = append(dst, s[i:min(j, i+limit-len(dst))]...)
			i = j
			continue
		}
		if i+1 >= len(s) {
			dst = append(dst, '\\')
			break
		}
		var n int
		dst, n = appendEscape(dst, s, i)
		i += n
	}
	if len(dst) > limit {
		dst = dst[:limit]
	}
	return dst
}

// appendEscape decodes the escape at s[i] == '\\' and returns how many bytes
// of s it took.
func appendEscape(dst []byte, s string, i int) ([]byte, int) {
	switch c := s[i+1]; c {
	case '"', '\\', '/':
		return append(dst, c), 2
	case 'b':
		return append(dst, '\b'), 2
	case 'f':
		return append(dst, '\f'), 2
	case 'n':
		return append(dst, '\n'), 2
	case 'r':
		return append(dst, '\r'), 2
	case 't':
		return append(dst, '\t'), 2
	case 'u':
		r, ok := hex4(s, i+2)
		if !ok {
			return append(dst, s[i:i+2]...), 2
		}
		n := 6
		if r >= 0xD800 && r < 0xE000 {
			r2, ok2 := rune(0), false
			if i+n+1 < len(s) && s[i+n] == '\\' && s[i+n+1] == 'u' {
				r2, ok2 = hex4(s, i+n+2)
			}
			if ok2 && r < 0xDC00 && r2 >= 0xDC00 && r2 < 0xE000 {
				r = (r-0xD800)<<10 | (r2 - 0xDC00) + 0x10000
				n += 6
			} else {
				r = utf8.RuneError
			}
		}
		return utf8.AppendRune(dst, r), n
	}
	return append(dst, s[i:i+2]...), 2
}

func hex4(s string, i int) (rune, bool) {
	if i+4 > len(s) {
		return 0, false
	}
	v, err := strconv.ParseUint(s[i:i+4], 16, 32)
	if err != nil {
		return 0, false
	}
	return rune(v), true
}

// Pick stores in vals[i] the raw value of the member keys[i] of the object
// s (the last one, should a key repeat, as JSON decoders do), and leaves
// vals[i] as it is for a key s does not have.
func Pick[T Text](s T, keys []string, vals []T) {
	Each(s, 0, func(k, v T) bool {
		for i, key := range keys {
			if str(k) == key {
				vals[i] = v
			}
		}
		return true
	})
}
