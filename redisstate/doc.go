// Package redisstate keeps a relay.State on Redis, so that the replicas of
// a service share their upstreams' rate limits, holds and circuit
// breakers, and their budgets:
//
//	client := redis.NewClient(&redis.Options{
//		Addr:                  "redis:6379",
//		ContextTimeoutEnabled: true, // deadlines reach the connection
//		DialerRetries:         1,    // a refused connection fails at once
//	})
//	router, err := relay.New(relay.Config{
//		Upstreams: upstreams,
//		State:     redisstate.New(client, redisstate.WithPrefix("checkout")),
//		Replicas:  8, // while Redis is unreachable, each keeps to 1/8 of RPM and TPM
//	})
//
// # One round trip per call
//
// Every method is one command: a Lua script run with EVALSHA (EVAL once,
// when a server does not know it yet: after a restart or SCRIPT FLUSH), or
// a plain DEL or HMGET. Admit checks, in one script, the fleet's circuit,
// the hold, and the RPM and TPM buckets, and takes from both buckets or
// from neither.
//
// # Keys
//
// Every key starts with a hash tag, {relay:<prefix>:u:<upstream>} for an
// upstream and {relay:<prefix>:b:<budget>} for a budget, so each script
// touches one slot of a Redis Cluster. In names, %, :, { and } are
// percent-encoded. The prefix (WithPrefix, default "default") separates
// services sharing one Redis.
//
//	{relay:P:u:U}:rpm, :tpm   GCRA theoretical arrival time (µs); lives while ahead of now, plus a minute
//	{relay:P:u:U}:hold        end of the hold (µs); until then, plus a minute
//	{relay:P:u:U}:open        end of the open period (µs); until then, plus ten minutes (half-open)
//	{relay:P:u:U}:reopened    an open period not yet seen over; lives as long as :open
//	{relay:P:u:U}:probe       the half-open probe lock (SET NX PX), holding its claim's token; the ttl the router gives
//	{relay:P:u:U}:claim       the tokens of the open period's probe claims (a set); lives as long as :open
//	{relay:P:u:U}:fails       consecutive failures (INCR); a minute after the last (WithFailureRun)
//	{relay:P:b:B}:a:<end>:<key>  hash: s spent, r reserved (int64 nano-units); window end plus 24 h
//	{relay:P:b:B}:k:<end>     set of the budget's scope keys in the window; the same
//
// Times are microseconds since the Unix epoch; <end> is the window's end
// in Unix nanoseconds.
//
// # Rate limits
//
// The buckets behave as the router's in-process ones (x/time/rate): each
// holds one minute of quota and refills continuously; a TPM charge larger
// than the bucket is clamped to it. They are kept with GCRA: one
// timestamp per bucket, so a bucket that is full costs no key at all.
// Refund moves the timestamp back, never past a full bucket.
//
// # Circuits
//
// Failures add up across the fleet (Failure), and an open circuit keeps
// every replica off. Once its open period is over, one replica claims the
// probe (Probe) and gets a token; the probe's success (Success with that
// token) closes the circuit while the claim belongs to the current open
// period. A probe that outlived its lock still closes it when it
// succeeds, even with a newer probe in flight, unless the circuit opened
// again since it was claimed (the newer probe failed, or a replica called
// Open): its success then leaves the circuit open.
//
// # Clocks
//
// Decisions use the time the router passes (Config.Clock), not Redis's
// TIME, so a fake clock drives them in tests, and each replica decides by
// its own clock. A replica whose clock is δ ahead of the others' sees the
// buckets δ fuller: the fleet can exceed a limit once by δ's worth of
// refill (δ·RPM/60 requests), not by δ's worth every minute. Keep replica
// clocks within a few milliseconds (NTP does) and watch ClockOffset. Key
// lifetimes (TTLs) are set from the same times, or from WithClock for the
// calls that are given none (Hold, Open, Reserve, Settle).
//
// # When Redis is slow or down
//
// Each call is bounded by its context and never retried (go-redis's
// MaxRetries does not apply to these commands): it returns an error at
// its deadline at the latest, and the router then decides that call from
// its in-process state. After 10 calls in a row go unanswered, calls fail
// at once with ErrUnavailable, and one call every 100 ms tries Redis again
// (WithFailFast); go-redis reconnects by itself, and the first answer ends
// the fail-fast. Scripts are loaded again on first use after a restart.
package redisstate
