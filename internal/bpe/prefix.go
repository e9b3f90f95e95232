package bpe

// Prefixes gives the byte-pair count of every prefix of one piece in a
// single pass over it, where counting each prefix on its own would merge
// it again from its start: the splitter's search for the rune at which a
// run without pre-token boundaries reaches a token count asks for about
// nine prefixes of the same run.
//
// It is the appendable encoder of GitHub's "bpe" crate, run forward on
// the backtracker's tables: the last token of the encoding of p[:m] is the
// longest token t that ends at m and either is all of p[:m] or forms a
// valid pair (validPair) with the last token of the encoding of
// p[:m-len(t)]; the count of p[:m] is then the count of p[:m-len(t)] plus
// one. Walking the token trie from each offset q in turn, once the counts
// up to q are known, meets the tokens that end at each m by increasing
// start, so the first valid one is the longest. A prefix that is itself a
// token counts 1, as tiktoken's own shortcut does.
//
// A Prefixes is not safe for concurrent use; its buffers are reused by
// Reset.
type Prefixes struct {
	bt   *backtracker
	long int // the longest token's length: no walk reaches further
	s    string
	last []uint32 // last[m]: the last token of the encoding of s[:m], none32 while not found
	cnt  []int32  // cnt[m]: the count of s[:m], once last[m] is found
	done int      // offsets below done are walked: cnt[m] is final for m <= done
}

// Prefixes starts p on piece s (non-empty), reusing p's buffers, and
// reports whether it did; n is about how many bytes of s the caller will
// ask about. It does not start while the backtracker's tables are not
// built and the bytes refused so far add up to prefixBudget or less: n is
// then charged, and the caller counts the prefixes it needs one by one.
// Every offset of s may be asked for, also inside a UTF-8 sequence; only
// the bytes up to the longest prefix asked for (and a token's length past
// it) are read.
func (e *Encoding) Prefixes(p *Prefixes, s string, n int) bool {
	if e.bt.Load() == nil && e.prefixRefused.Add(int64(n)) <= prefixBudget {
		return false
	}
	p.bt, p.long = e.backtracker(), e.ranks.maxLen
	p.s = s
	p.done = 0
	p.last = append(p.last[:0], none32) // s[:0]: the start
	p.cnt = append(p.cnt[:0], 0)
	return true
}

// Count returns the byte-pair count of s[:m], 0 <= m <= len(s), for the
// piece s given to Prefixes: what Count(s[:m]) is when s[:m] is a single
// pre-token (OnePiece). It walks s up to m on the first call that needs
// it, so asking for increasing prefixes costs one pass in all.
func (p *Prefixes) Count(m int) int {
	for p.done < m {
		p.walk(p.done)
		p.done++
	}
	return int(p.cnt[m])
}

// walk meets the tokens that start at q, whose prefix s[:q] has its
// count: every end they reach that has no token yet takes the first one
// whose pair with s[:q]'s last token is valid.
func (p *Prefixes) walk(q int) {
	bt, s := p.bt, p.s
	tr := &bt.trie
	for reach := min(len(s), q+p.long); len(p.last) <= reach; {
		p.last = append(p.last, none32)
		p.cnt = append(p.cnt, 0)
	}
	prev, c := p.last[q], p.cnt[q]+1
	// The first two levels by table, then the trie's edges.
	node := tr.one[s[q]]
	for k := q + 1; node != none32; k++ {
		if t := tr.nodeTok[node]; t != none32 && p.last[k] == none32 && (q == 0 || bt.validPair(prev, t)) {
			p.last[k], p.cnt[k] = t, c
		}
		switch {
		case k == len(s):
			return
		case k == q+1:
			node = tr.two[int(s[q])|int(s[k])<<8]
		default:
			node = tr.child(node, s[k])
		}
	}
}

// prefixBudget is how many bytes an encoding refuses to Prefixes before
// it builds the backtracker's tables for it: a caller counting those
// prefixes one by one instead (the splitter's searches, by an estimate
// from their time and bytes about 40 ns a byte) spends about what
// building the tables takes (100 to 300 ms), so a
// caller that stops short of it never pays for them, and one that goes on
// pays at most about twice what it would have with them built from the
// start (ski rental). Long pieces have their own budget (heapBudget).
const prefixBudget = 4 << 20

// OnePiece reports whether the valid UTF-8 text s is a single pre-token,
// which Count counts as one piece.
func (e *Encoding) OnePiece(s string) bool {
	if s == "" {
		return false
	}
	c := e.cls
	j, ok := 0, false
	if e.o200k {
		if j, ok = c.nextO200KASCII(s, 0); !ok {
			j = c.nextO200KGeneral(s, 0)
		}
	} else if j, ok = c.nextCL100KASCII(s, 0); !ok {
		j = c.nextCL100KGeneral(s, 0)
	}
	return j == len(s)
}
