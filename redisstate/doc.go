// Package redisstate keeps a store.State on Redis, so that the replicas of
// a service share their upstreams' rate limits, holds and circuits, and
// their budgets:
//
//	client := redis.NewClient(&redis.Options{
//		Addr:                  "redis:6379",
//		ContextTimeoutEnabled: true, // deadlines reach the connection
//		DialerRetries:         1,    // a refused connection fails at once
//		PoolSize:              128,  // a connection for each caller that may wait on one
//		MinIdleConns:          32,   // opened by Load, before traffic
//	})
//	state := redisstate.New(client, redisstate.WithPrefix("checkout"))
//	if err := state.Load(ctx); err != nil {
//		log.Fatal(err)
//	}
//	router, err := relay.New(relay.Config{
//		Upstreams: upstreams,
//		State:     state,
//		Replicas:  8, // while Redis does not answer, each decides from 1/8 of what the fleet had left
//	})
//
// The State has the semantics of the store contract (package store),
// which store.Local has too; package storetest checks both
// (TestConformance runs it on miniredis and on a real redis-server).
// docs/fleet-state.md is the guide.
//
// # One round trip per call
//
// Every method is one command: a Lua script run with EVALSHA (EVAL once,
// when a server does not know it yet: after a restart or SCRIPT FLUSH), or
// a plain SMEMBERS. Admit checks, in one script, the circuit (claiming a
// half-open circuit's probe), the hold, and the RPM and TPM buckets, and
// takes from both buckets or from neither.
//
// # Keys
//
// Every key starts with a hash tag, {relay:<prefix>:u:<upstream>} for an
// upstream and {relay:<prefix>:b:<budget>} for a budget, so each script
// touches one slot of a Redis Cluster. In names, %, :, { and } are
// percent-encoded. The prefix (WithPrefix, default "default") separates
// services sharing one Redis.
//
//	{relay:P:u:U}:s           hash: the RPM and TPM buckets' arrival times (GCRA, µs), the hold's end,
//	                          the circuit (its open period's end, id and length, the probe's claim and its
//	                          token, the failure run); lives while a field matters, plus a minute
//	{relay:P:b:B}:a:<end>:<key>  hash: s spent, r reserved, h:<id> each hold (int64 nano-units)
//	{relay:P:b:B}:e:<end>:<key>  the holds' deadlines (a sorted set)
//	{relay:P:b:B}:x:<end>:<key>  the holds settled in the last minute (a sorted set)
//	{relay:P:b:B}:k:<end>     set of the budget's scope keys in the window
//
// A budget's keys live until WithBudgetRetention (a day) after their
// window ends; <end> is the window's end in Unix nanoseconds.
//
// # Time
//
// Every decision uses the time the caller gives (the router's
// Config.Clock), never Redis's TIME or the State's own clock: a fake clock
// drives it in tests, and each replica decides by its own clock. A
// replica whose clock is δ ahead of the others' sees the buckets δ
// fuller: the fleet can exceed a limit once by δ's worth of refill
// (δ·RPM/60 requests), not by δ's worth every minute. Keep replica clocks
// within a few milliseconds (NTP does) and watch ClockOffset. Redis's
// clock only sets how long keys live.
//
// # When Redis is slow or down
//
// Each call is bounded by its context and never retried (go-redis's
// MaxRetries does not apply to these commands): it returns an error at
// its deadline at the latest, and the router then decides that call from
// its local share. After 10 calls in a row for one hash tag (one
// upstream's keys, one budget's: one Cluster slot) go unanswered, its
// calls fail at once with ErrUnavailable, and one call every 100 ms tries
// Redis again (WithFailFast); go-redis reconnects by itself, and the first
// answer ends the fail-fast. Scripts are loaded again on first use after a
// restart.
package redisstate
