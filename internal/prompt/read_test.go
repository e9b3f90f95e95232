package prompt

import (
	"bytes"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/tokenrelay/relay/internal/jsonscan"
)

// fakeCount stands for a token count in the differential tests: a value
// that depends on every byte of s, so two sums agree only when the same
// strings were counted.
func fakeCount(s string) int {
	if s == "" {
		return 0 // as every count
	}
	h := fnv.New32a()
	h.Write([]byte(s))
	return int(h.Sum32()%1000) + len(s)
}

type refCounter struct{}

func (refCounter) Text(s string) int        { return fakeCount(s) }
func (refCounter) Tools(t gjson.Result) int { return ToolsTokens(fakeCount, t) }

// readCounter counts a Reader's strings the same way.
type readCounter struct{ r *Reader }

func (c readCounter) Str(i int) int { return fakeCount(string(c.r.AppendStr(nil, c.r.Strs[i]))) }
func (c readCounter) Tools(raw string) int {
	return ToolsTokens(fakeCount, gjson.Result{Type: gjson.JSON, Raw: raw})
}

// refTop reads the top-level fields as the router's reference reader
// does: gjson's ForEach over the object, the last of each key winning.
func refTop(body string) (f Fields, ok bool) {
	if !jsonscan.Valid(body) {
		return f, false
	}
	root := gjson.Parse(body)
	if !root.IsObject() {
		return f, false
	}
	root.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "messages":
			f.Messages = v
		case "input":
			f.Input = v
		case "prompt":
			f.Prompt = v
		case "instructions":
			f.Instructions = v
		case "tools":
			f.Tools = v
		}
		return true
	})
	return f, true
}

var endpoints = []string{Chat, Responses, Completions, Embeddings, ""}

// checkRead compares the Reader with the reference readers on body, for
// every endpoint.
func checkRead(t *testing.T, r *Reader, body string) {
	t.Helper()
	f, ok := refTop(body)
	for _, ep := range endpoints {
		r.Read(ep, body)
		if r.JSON != ok {
			t.Fatalf("%s: JSON = %v, want %v for %q", ep, r.JSON, ok, body)
		}
		if !ok || r.Fallback {
			continue
		}
		if got, want := r.Tokens(readCounter{r}, 85), Tokens(refCounter{}, 85, ep, &f); got != want {
			t.Fatalf("%s: Tokens = %d, want %d for %q", ep, got, want, body)
		}
		checkPieces(t, r, ep, body)
		for _, limit := range []int{1 << 30, 4097, 40, 7, 1} {
			c := Canon{Limit: limit}
			r.AppendCanonical(&c)
			want := AppendCanonical(nil, ep, body, limit)
			if !bytes.Equal(c.Buf, want) {
				t.Fatalf("%s: canonical (limit %d)\n got %q\nwant %q\nbody %q", ep, limit, c.Buf, want, body)
			}
			for i, at := range c.At {
				if at < 0 {
					continue
				}
				d := r.AppendStr(nil, r.Strs[i])
				if end := min(int(at)+len(d), len(c.Buf)); !bytes.Equal(c.Buf[at:end], d[:end-int(at)]) {
					t.Fatalf("%s: At[%d] = %d does not hold %q in %q", ep, i, at, d, c.Buf)
				}
				switch end := c.End[i]; {
				case end >= 0 && !bytes.Equal(c.Buf[at:end], d):
					t.Fatalf("%s: Buf[At:End] of %d = %q, the string is %q", ep, i, c.Buf[at:end], d)
				case end < 0 && int(at)+len(d) < limit:
					t.Fatalf("%s: string %d (%q) is all in Buf (limit %d) but End is -1", ep, i, d, limit)
				}
			}
			a := Canon{Buf: []byte("x"), Limit: limit}
			r.AppendAnchor(&a)
			if want := AppendAnchor([]byte("x"), ep, body, limit); !bytes.Equal(a.Buf, want) {
				t.Fatalf("%s: anchor (limit %d)\n got %q\nwant %q\nbody %q", ep, limit, a.Buf, want, body)
			}
		}
	}
}

type sinkFunc func(Piece) bool

func (f sinkFunc) Piece(p Piece) bool { return f(p) }

// checkPieces asserts that the pieces of the canonical prompt and of the
// anchor make up what AppendCanonical and AppendAnchor build, and that a
// walk stops when told.
func checkPieces(t *testing.T, r *Reader, ep, body string) {
	t.Helper()
	var buf []byte
	n := 0
	add := func(p Piece) bool {
		n++
		if p.Str < 0 {
			buf = append(buf, p.Lit...)
		} else {
			buf = r.AppendStr(buf, r.Strs[p.Str])
		}
		return true
	}
	r.CanonicalPieces(sinkFunc(add))
	if want := AppendCanonical(nil, ep, body, 1<<30); !bytes.Equal(buf, want) {
		t.Fatalf("%s: canonical pieces\n got %q\nwant %q\nbody %q", ep, buf, want, body)
	}
	all := n
	for stop := 1; stop < all; stop += 1 + all/4 {
		buf, n = buf[:0], 0
		r.CanonicalPieces(sinkFunc(func(p Piece) bool { add(p); return n < stop }))
		if n != stop {
			t.Fatalf("%s: told to stop after %d pieces, walked %d", ep, stop, n)
		}
	}
	buf = buf[:0]
	r.AnchorPieces(sinkFunc(add))
	if want := AppendAnchor(nil, ep, body, 1<<30); !bytes.Equal(buf, want) {
		t.Fatalf("%s: anchor pieces\n got %q\nwant %q\nbody %q", ep, buf, want, body)
	}
}

func wireFixtures(t testing.TB) []string {
	files, err := filepath.Glob("../../testdata/openai-wire/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("fixtures: %v", err)
	}
	var out []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, string(b))
	}
	return out
}

// readCases are bodies of every shape the readers disagree on unless
// the Reader is careful.
var readCases = []string{
	`{"model":"gpt-4o","messages":[{"role":"user","content":"Hello world"}]}`,
	`{"messages":[{"role":"system","content":"S"},{"role":"developer","content":"D"},{"role":"user","content":"Q"}],"tools":[{"type":"function","function":{"name":"f","description":"d.","parameters":{"properties":{"a":{"type":"string","enum":["x",1]}}}}}]}`,
	`{"messages":[{"role":"user","content":[{"type":"text","text":"What is this?"},{"type":"image_url","image_url":{"url":"u"}},{"text":"t2","type":"input_text"},{"type":"refusal","refusal":"no"},{"type":1,"text":"x"},"str",[1]]}]}`,
	`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get","arguments":"{\"a\":1}"}},{"function":1},2,[3],{"function":{"arguments":"x","name":"n","name":"m"}},{"function":"s","function":{"name":"late"}}]},{"role":"tool","tool_call_id":"c1","content":"sunny"}]}`,
	`{"messages":[{"role":"user","role":"assistant","content":"a","content":"b","name":"n","name":1}]}`,
	`{"messages":[{"role":1,"type":"function_call","name":"f","arguments":"{}"}]}`,
	`{"messages":[{"role":"user","tool_calls":{"a":{"function":{"name":"x","arguments":"y"}}},"function_call":{"name":"fc","arguments":"fa","name":"no"}}]}`,
	`{"messages":{"a":{"role":"system","content":"S"},"b":{"role":"user","content":"Q"}},"tools":[{"a":1}]}`,
	`{"messages":"x","tools":[1]}`,
	`{"messages":[],"tools":[]}`,
	`{"messages":[1,"x",null,[],{}],"tools":[ ]}`,
	`{"messages":[{"role":"user","content":"a"}],"messages":[{"role":"user","content":"b"}]}`,
	`{"messages":[{"role":"user","content":"caf\u00e9 \ud83d\ude00 \ud800 x\ndone \"q\" \\ \/"}]}`,
	`{"instructions":"Be brief.","input":"Hi there"}`,
	`{"instructions":"","input":""}`,
	`{"instructions":1,"input":{"a":1},"tools":[{"type":"function","name":"f"}]}`,
	`{"input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"Hi"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c1","output":"42"},{"type":"reasoning","id":"r","status":"done","summary":[]}]}`,
	`{"prompt":"Say this is a test","input":["a b","c d",1,[1,2,"x",[3]],{"a":"b"},true,""]}`,
	`{"prompt":["a","",[1,2],3],"input":[[1,2,3],[4]]}`,
	`{"prompt":[[1,2.5,-3e2,"4"],null]}`,
	`{"model":"m","model":1,"stream":true,"stream":false,"max_tokens":5,"max_tokens":-1,"max_output_tokens":0}`,
	`{"mod\u0065l":"x","messages":[{"role":"user","content":"hi"}]}`,
	`{"messages":[{"ro\u006ce":"user","content":"hi"}]}`,
	`{"messages":[{"role":"user","content":[{"type":"te\u0078t","text":"hi"}]}]}`,
	`{"messages":[{"role":"user","content":"x"}]} `,
	` {"messages":[{"role":"user","content":"x"}]}x`,
	`{"messages":[{"role":"user","content":"x"}],}`,
	`{"messages":[{"role":"user","content":"x\u00"}]}`,
	`[{"messages":[]}]`,
	`"x"`,
	`{"messages":[{"role":"user","content":"` + strings.Repeat("long text ", 1000) + `"}]}`,
	`{"messages":[{"role":"user","content":"x","extra":` + strings.Repeat("[", 600) + strings.Repeat("]", 600) + `}]}`,
	`{"messages":[{"role":"user","content":"x","extra":` + strings.Repeat("[", 509) + strings.Repeat("]", 509) + `}]}`,
	`{"messages":[{"role":"user","content":"x","extra":` + strings.Repeat("[", 510) + strings.Repeat("]", 510) + `}]}`,
	`{"messages":[{"role":"user","content":[{"type":"text","text":"x","x":` + strings.Repeat("[", 507) + strings.Repeat("]", 507) + `}]}]}`,
	`{"messages":[{"role":"user","content":[{"type":"text","text":"x","x":` + strings.Repeat("[", 508) + strings.Repeat("]", 508) + `}]}]}`,
	`{"a":` + strings.Repeat(`{"a":`, 100000),
}

func TestReaderMatchesReference(t *testing.T) {
	var r Reader
	for _, body := range append(readCases, wireFixtures(t)...) {
		checkRead(t, &r, body)
	}
	r.Read(Chat, readCases[len(readCases)-1])
	if r.JSON {
		t.Fatal("deep body read as JSON")
	}
}

// TestReaderFallback checks the bodies the Reader hands to the reference
// readers: member names and part types spelled with escapes.
func TestReaderFallback(t *testing.T) {
	var r Reader
	for _, c := range []struct {
		body string
		want bool
	}{
		{`{"mod\u0065l":"x"}`, true},
		{`{"messages":[{"ro\u006ce":"user"}]}`, true},
		{`{"messages":[{"role":"user","content":[{"type":"te\u0078t","text":"hi"}]}]}`, true},
		{`{"messages":[{"role":"user","content":"caf\u00e9"}]}`, false},
		{`{"metadata":{"k\u0065y":1}}`, false},
	} {
		r.Read(Chat, c.body)
		if !r.JSON || r.Fallback != c.want {
			t.Errorf("%s: JSON %v, Fallback %v, want %v", c.body, r.JSON, r.Fallback, c.want)
		}
	}
}

// randBody returns a random request body built from the members the
// readers look at, with duplicates, wrong types, escapes, unicode and
// invalid UTF-8, and now and then a broken byte.
func randBody(rng *rand.Rand) string {
	var b strings.Builder
	str := func() {
		words := []string{"hello", " world", "caf\\u00e9", "\\ud83d\\ude00", "\\ud800", "\\n", "\\\"", "\\\\", "東京", "\xff", " ", "x", "system", "text", "{\\\"a\\\":1}", "\\/", "\\u0041"}
		b.WriteByte('"')
		for n := rng.IntN(6); n > 0; n-- {
			b.WriteString(words[rng.IntN(len(words))])
		}
		b.WriteByte('"')
	}
	var value func(depth int, keys []string)
	keysOf := [][]string{
		{"role", "content", "name", "tool_calls", "function_call", "type", "id", "status", "arguments", "output", "tool_call_id", "x"},
		{"type", "text", "refusal", "image_url"},
		{"function", "id", "type", "name", "arguments"},
	}
	object := func(depth int, keys []string) {
		b.WriteByte('{')
		for n := rng.IntN(5); n > 0; n-- {
			k := keys[rng.IntN(len(keys))]
			if rng.IntN(40) == 0 {
				k = strings.Replace(k, "e", `\u0065`, 1)
			}
			b.WriteString(`"` + k + `":`)
			value(depth+1, keysOf[rng.IntN(len(keysOf))])
			if n > 1 {
				b.WriteByte(',')
			}
		}
		b.WriteByte('}')
	}
	value = func(depth int, keys []string) {
		if depth > 6 {
			b.WriteString("1")
			return
		}
		switch rng.IntN(10) {
		case 0, 1, 2:
			str()
		case 3:
			types := []string{`"text"`, `"input_text"`, `"image_url"`, `"refusal"`, `"function_call"`, `"system"`, `"user"`, `"developer"`}
			b.WriteString(types[rng.IntN(len(types))])
		case 4:
			b.WriteString([]string{"1", "-2", "3.5e1", "null", "true", "false", "0"}[rng.IntN(7)])
		case 5, 6:
			b.WriteByte('[')
			for n := rng.IntN(4); n > 0; n-- {
				value(depth+1, keys)
				if n > 1 {
					b.WriteByte(',')
				}
			}
			b.WriteByte(']')
		default:
			object(depth, keys)
		}
	}
	top := []string{"model", "messages", "input", "prompt", "instructions", "tools", "stream", "max_tokens", "metadata"}
	b.WriteString(" {")
	for n := rng.IntN(5); n > 0; n-- {
		k := top[rng.IntN(len(top))]
		b.WriteString(`"` + k + `" : `)
		switch {
		case (k == "messages" || k == "input") && rng.IntN(3) > 0:
			b.WriteByte('[')
			for m := rng.IntN(4); m > 0; m-- {
				object(1, keysOf[0])
				if m > 1 {
					b.WriteString(", ")
				}
			}
			b.WriteByte(']')
		default:
			value(1, keysOf[rng.IntN(len(keysOf))])
		}
		if n > 1 {
			b.WriteByte(',')
		}
	}
	b.WriteString("}\n")
	s := b.String()
	if rng.IntN(10) == 0 { // break it
		i := rng.IntN(len(s))
		s = s[:i] + string("{}[],:\"\\ x"[rng.IntN(10)]) + s[i+1:]
	}
	return s
}

// randRuns is how many random bodies a test reads.
func randRuns() int {
	if testing.Short() {
		return 2000
	}
	return 20000
}

func TestReaderRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var r Reader
	n := randRuns()
	valid := 0
	for range n {
		body := randBody(rng)
		checkRead(t, &r, body)
		if r.JSON && !r.Fallback {
			valid++
		}
	}
	if valid < n/2 {
		t.Fatalf("only %d of %d random bodies are JSON read in one pass", valid, n)
	}
	t.Logf("%d of %d random bodies are JSON read in one pass", valid, n)
}

func FuzzReader(f *testing.F) {
	for _, c := range readCases[:len(readCases)-1] {
		f.Add(c)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 50 {
		f.Add(randBody(rng))
	}
	// A Reader whose Known learns the strings of every JSON body, across
	// the inputs: strings met again are not checked again.
	kr := Reader{Known: &learner{seen: map[string]uint64{}}, KnownMin: 4}
	f.Fuzz(func(t *testing.T, body string) {
		if len(body) > 1<<14 {
			return
		}
		var r Reader
		checkRead(t, &r, body)
		checkRead(t, &kr, body)
		for _, ep := range endpoints {
			kr.Read(ep, body)
			kr.Known.(*learner).learn(&kr)
		}
	})
}

// learner is a Known that knows the strings of the bodies it was told were
// JSON, as the router's memo does.
type learner struct {
	seen  map[string]uint64
	asked int
}

func (l *learner) Known(raw string) (h, w uint64, ok bool) {
	l.asked++
	w, ok = l.seen[raw]
	return uint64(len(raw)), w, ok
}

// learn records the strings of the body r read last, if it was JSON.
func (l *learner) learn(r *Reader) {
	if !r.JSON {
		return
	}
	for _, s := range r.Strs {
		if raw := r.Raw(s); len(raw) >= r.KnownMin {
			l.seen[raw] = uint64(len(raw)) + 1
		}
	}
}

// TestReaderKnownRandom reads random bodies with a Known that learns every
// string of the JSON ones: strings met again are not checked again, and
// every result stays the reference's, invalid bodies included.
func TestReaderKnownRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	l := &learner{seen: map[string]uint64{}}
	r := Reader{Known: l, KnownMin: 4}
	n := randRuns()
	hits := 0
	for range n {
		body := randBody(rng)
		checkRead(t, &r, body)
		for _, ep := range endpoints {
			r.Read(ep, body)
			for _, s := range r.Strs {
				if s.Seen {
					hits++
					if s.W != uint64(len(r.Raw(s)))+1 || !s.Hashed || s.H != uint64(len(r.Raw(s))) {
						t.Fatalf("string %q carries H %d, W %d, not what Known said", r.Raw(s), s.H, s.W)
					}
				}
			}
			l.learn(&r)
		}
	}
	if hits < n/10 {
		t.Fatalf("only %d known strings met in %d bodies", hits, n)
	}
	t.Logf("%d known strings in %d bodies, %d asked", hits, n, l.asked)
}

// TestReaderKnownSkipsCheck shows what Known changes: a string it knows is
// not checked again (here one that is not valid, which a Known that keeps
// its contract never knows), while an unknown one is, and a known string
// that is not closed still ends the body's validity.
func TestReaderKnownSkipsCheck(t *testing.T) {
	bad := "a control char \x01 in a string"
	body := `{"messages":[{"role":"user","content":[{"type":"text","text":"` + bad + `"}]}]}`
	var plain Reader
	plain.Read(Chat, body)
	if plain.JSON {
		t.Fatal("a raw control character is JSON")
	}
	l := &learner{seen: map[string]uint64{bad: 7}}
	r := Reader{Known: l, KnownMin: 8}
	r.Read(Chat, body)
	if !r.JSON {
		t.Fatal("a known string was checked again")
	}
	var s Str
	for _, x := range r.Strs {
		if r.Raw(x) == bad {
			s = x
		}
	}
	if !s.Seen || s.W != 7 || !s.Hashed {
		t.Fatalf("the part's text carries %+v, not what Known said", s)
	}
	for _, b := range []string{
		`{"messages":[{"role":"user","content":"` + bad,                   // not closed
		`{"messages":[{"role":"user","content":"` + bad + `"}]`,           // the body not closed
		`{"messages":[{"role":"user","content":"` + bad + `x\u12"}]}`,     // another string
		`{"messages":[{"role":"user","content":"` + bad + `"}]} trailing`, // after the body
	} {
		r.Read(Chat, b)
		if r.JSON {
			t.Fatalf("%q read as JSON", b)
		}
	}
}

// TestRepeatedMemberCountsLast: a member repeated within one message
// (two contents, two names, two roles) counts its last occurrence only, as
// upstreams read it, in the Reader and in the reference reader alike.
func TestRepeatedMemberCountsLast(t *testing.T) {
	long := strings.Repeat("a long first content ", 50)
	for _, c := range []struct{ repeated, last string }{
		{`{"messages":[{"role":"user","content":"` + long + `","content":"short"}]}`,
			`{"messages":[{"role":"user","content":"short"}]}`},
		{`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}],"content":"hi"}]}`,
			`{"messages":[{"role":"user","content":"hi"}]}`},
		{`{"messages":[{"role":"user","name":"alice","content":"hi","name":3}]}`,
			`{"messages":[{"role":"user","content":"hi"}]}`},
		{`{"messages":[{"role":"system","role":"user","content":"hi","tool_calls":[{"function":{"name":"f","arguments":"{}"}}],"tool_calls":[]}]}`,
			`{"messages":[{"role":"user","content":"hi","tool_calls":[]}]}`},
		{`{"input":[{"type":"message","role":"user","content":"` + long + `","content":"x"},{"type":"function_call_output","output":"1","output":"22"}]}`,
			`{"input":[{"type":"message","role":"user","content":"x"},{"type":"function_call_output","output":"22"}]}`},
	} {
		for _, ep := range []string{Chat, Responses} {
			var r, rl Reader
			r.Read(ep, c.repeated)
			rl.Read(ep, c.last)
			if !r.JSON || r.Fallback || !rl.JSON {
				t.Fatalf("%s: not read as plain JSON", c.repeated)
			}
			got, want := r.Tokens(readCounter{&r}, 85), rl.Tokens(readCounter{&rl}, 85)
			if got != want {
				t.Errorf("%s: Reader counts %d for %s, %d without the earlier occurrences", ep, got, c.repeated, want)
			}
			f, _ := refTop(c.repeated)
			fl, _ := refTop(c.last)
			if got, want := Tokens(refCounter{}, 85, ep, &f), Tokens(refCounter{}, 85, ep, &fl); got != want {
				t.Errorf("%s: reference counts %d for %s, %d without the earlier occurrences", ep, got, c.repeated, want)
			}
		}
	}
}

// TestRepeatedEmptyMemberName: members named "" repeat like any other.
func TestRepeatedEmptyMemberName(t *testing.T) {
	var r, rl Reader
	r.Read(Chat, `{"messages":[{"":"first words","role":"user","":"x"}]}`)
	rl.Read(Chat, `{"messages":[{"role":"user","":"x"}]}`)
	if got, want := r.Tokens(readCounter{&r}, 85), rl.Tokens(readCounter{&rl}, 85); got != want {
		t.Errorf("Tokens = %d, want %d, the count without the first \"\" member", got, want)
	}
}

// manyMembers returns a chat body of one message with n members after its
// role: n times the same name when same, else n distinct names, and then
// the first few of them again.
func manyMembers(n int, same bool) string {
	var b strings.Builder
	b.WriteString(`{"messages":[{"role":"user"`)
	for i := range n {
		if same {
			b.WriteString(`,"a":"x` + strconv.Itoa(i%7) + `"`)
		} else {
			b.WriteString(`,"k` + strconv.Itoa(i) + `":"v` + strconv.Itoa(i) + `"`)
		}
	}
	for i := range min(n, 20) {
		b.WriteString(`,"k` + strconv.Itoa(i) + `":"again"`)
	}
	b.WriteString(`}]}`)
	return b.String()
}

// TestManyMembersLinear: a message of many members, one name repeated or
// all names distinct, is read in linear time (each member's lookup makes
// at most linearMembers comparisons, then one by name), and counted as
// the reference counts it. (Every member was compared with every earlier
// one: 1m46s for a 960 KB body of one repeated member.)
func TestManyMembersLinear(t *testing.T) {
	for _, same := range []bool{true, false} {
		for _, n := range []int{3, 9, 30000} {
			body := manyMembers(n, same)
			var r Reader
			r.Read(Chat, body)
			if !r.JSON || r.Fallback {
				t.Fatalf("n=%d same=%v: not read as plain JSON", n, same)
			}
			// At most 8 comparisons (linearMembers) a member, or one lookup.
			if members := n + min(n, 20) + 1; r.steps > 8*members {
				t.Errorf("n=%d same=%v: %d comparisons for %d members", n, same, r.steps, members)
			}
			f, _ := refTop(body)
			if got, want := r.Tokens(readCounter{&r}, 85), Tokens(refCounter{}, 85, Chat, &f); got != want {
				t.Errorf("n=%d same=%v: Tokens = %d, the reference %d", n, same, got, want)
			}
			checkPieces(t, &r, Chat, body)
		}
	}
}

// BenchmarkManyMembers reads a message of 30,000 distinct members with the
// Reader and with the reference reader: both linear (ns per member).
func BenchmarkManyMembers(b *testing.B) {
	body := manyMembers(30000, false)
	b.Run("reader", func(b *testing.B) {
		var r Reader
		for b.Loop() {
			r.Read(Chat, body)
			r.Tokens(readCounter{&r}, 85)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/30000, "ns/member")
	})
	b.Run("reference", func(b *testing.B) {
		f, _ := refTop(body)
		for b.Loop() {
			Tokens(refCounter{}, 85, Chat, &f)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/30000, "ns/member")
	})
}
