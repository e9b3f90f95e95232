// Package bpe is an exact, fast token counter for the tiktoken encodings
// cl100k_base and o200k_base. It returns counts only, never token IDs.
//
// # Model
//
// Counting follows tiktoken's EncodeOrdinary: the text is split into
// pre-tokens by the encoding's split pattern, and every pre-token is
// byte-pair encoded independently (lowest merge rank first, leftmost on
// ties). Special tokens such as <|endoftext|> are ordinary text. The split
// patterns are implemented by a hand-written scanner (no regex engine) that
// reproduces the leftmost-alternative, greedy-with-backtracking semantics of
// the regexes, including \s+(?!\S), with \s, \p{L}, \p{N}, \p{M} etc. taken
// from the standard unicode package exactly as github.com/dlclark/regexp2
// (used by tiktoken-go) evaluates them.
//
// # Exactness
//
// Count(s) == len(tiktoken-go EncodeOrdinary(s)) for every string, including
// invalid UTF-8: like tiktoken-go (which converts the text to runes), every
// byte that is not part of a valid UTF-8 sequence is treated as U+FFFD both
// for splitting and for byte-pair encoding. This is checked by differential
// tests and a fuzz target against github.com/pkoukk/tiktoken-go (in the
// module github.com/tokenrelay/relay/interop, package tiktoken).
//
// # Complexity
//
// Pre-tokenization is linear. A pre-token that is itself a token counts 1
// after one hash lookup; pre-tokens up to 32 bytes use tiktoken's merge on
// stack arrays (bounded size); longer ones use an O(n log n) heap of merge
// candidates over a linked list of parts, and pre-tokens of 1 KiB or more
// use the linear backtracking encoder of GitHub's "bpe" crate. Its tables (a
// token trie and the merge split/pair tables) take 50 to 200 ms to build,
// so an encoding first merges up to 64 KiB of such long pre-tokens with the
// heap (about 10 ms at worst) and builds the tables only when they add up
// to more, or when one is longer (or when Warm is called). The whole count
// is therefore O(n log n) in the worst case and linear for long runs.
// The same tables give the counts of all the prefixes of a pre-token in
// one pass (Prefixes, the crate's appendable encoder), for a caller that
// searches a long run for the byte at which it reaches a count.
//
// # Loading
//
// The vocabularies are embedded in the package in a compact form generated
// from the assets of github.com/pkoukk/tiktoken-go-loader (go generate;
// a test of the module interop checks that regenerating gives the same
// bytes): token bytes are
// used in place and the open-addressing rank table is filled in one nearly
// sequential pass, on memory advised to use huge pages where the system
// allows. The first count with an encoding therefore costs a few
// milliseconds more than the next (BenchmarkFirstCount measures it in a
// fresh process); nothing is downloaded.
//
// # Speed
//
// Pre-tokens that start with an ASCII byte are split by fast paths (a byte
// class table, letter runs eight bytes at a time). The count of every
// pre-token of 2 to 120 bytes is kept in a bounded, lock-free piece cache
// (pieceCache: 2,304 KiB per encoding, fixed at load), so words, code
// identifiers and clauses that repeat cost one hash and one table access.
// The cache stores whole keys: a hit is never another pre-token's count.
// Pre-tokens seen for the first time are merged with the ranks of byte
// pairs from a 256 KiB direct table, and a 256 KiB Bloom filter answers
// most lookups of non-ASCII strings that are not tokens.
//
// # Concurrency and allocation
//
// An *Encoding is safe for concurrent use: its vocabulary is immutable after
// loading and its piece cache is updated with atomic operations only.
// Scratch buffers come from a sync.Pool, so steady-state counting does not
// allocate per token (at most a few allocations per call, none for most).
package bpe
