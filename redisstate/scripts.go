package redisstate

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Times in the scripts are microseconds since the Unix epoch (exact in a
// Lua number until the year 2255); rates are per minute, 60e6 µs.

// script is a Lua script run with EVALSHA, and with EVAL (which also
// caches it) when Redis does not know it yet.
type script struct {
	src, sha string
}

func newScript(src string) *script {
	h := sha1.Sum([]byte(src))
	return &script{src: src, sha: hex.EncodeToString(h[:])}
}

// run runs the script: one round trip, or two the first time a Redis
// server sees it.
func (s *State) eval(ctx context.Context, sc *script, keys []string, args ...any) *redis.Cmd {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, "evalsha", sc.sha, len(keys))
	for _, k := range keys {
		a = append(a, k)
	}
	a = append(a, args...)
	cmd := s.do(ctx, a...)
	if err := cmd.Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		a[0], a[1] = "eval", sc.src
		cmd = s.do(ctx, a...)
	}
	return cmd
}

// luaHelpers are shared by the rate scripts: the GCRA step of one bucket
// holding a minute of quota (limit per minute), and the storing of a
// theoretical arrival time.
const luaHelpers = `
local MINUTE = 60000000
-- gcra returns the new theoretical arrival time of a bucket (limit per
-- minute) whose current one is tat, if n tokens are taken at now, and how
-- long until they are there (0: now).
local function gcra(tat, limit, n, now)
  tat = tonumber(tat) or now
  if tat < now then tat = now end
  local new = tat + n * MINUTE / limit
  local wait = new - MINUTE - now
  if wait < 0 then wait = 0 end
  return new, wait
end
-- store keeps a theoretical arrival time while it is ahead of now, and
-- keep ms longer.
local function store(key, tat, now, keep)
  if tat <= now then
    redis.call('DEL', key)
  else
    redis.call('SET', key, string.format('%.17g', tat), 'PX', math.ceil((tat - now) / 1000) + keep)
  end
end
`

// admitScript is State.Admit: one MGET, and a SET per bucket taken from.
//
// KEYS: open, probe, hold, rpm, tpm, reopened, fails (one upstream's).
// ARGV: now, force (0 or 1), rpm limit, tpm limit, tpm charge, keep (ms).
// Returns {0, failing} when taken (failing: 1 while a failure run is in
// progress), {1, until} when the circuit keeps the request out, {2, wait,
// hold's end or 0} when the hold or the limits do.
var admitScript = newScript(luaHelpers + `
local now = tonumber(ARGV[1])
local v = redis.call('MGET', KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[7])
local u = tonumber(v[1])
if u and ARGV[2] == '0' then
  if now < u then return {1, u} end
  local lock = redis.call('PTTL', KEYS[2])
  if lock > 0 then return {1, now + lock * 1000} end
  redis.call('DEL', KEYS[6]) -- seen half-open: a probe may be claimed
  return {1, u}
end
local wait = 0
local hold = tonumber(v[2])
if hold and hold > now then wait = hold - now end
local rpm, tpm, n = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local rtat, ttat, w
if rpm > 0 then
  rtat, w = gcra(v[3], rpm, 1, now)
  if w > wait then wait = w end
end
if tpm > 0 then
  ttat, w = gcra(v[4], tpm, n, now)
  if w > wait then wait = w end
end
if wait > 0 then
  if hold and hold > now then return {2, math.ceil(wait), hold} end
  return {2, math.ceil(wait), 0}
end
local keep = tonumber(ARGV[6])
if rtat then store(KEYS[4], rtat, now, keep) end
if ttat then store(KEYS[5], ttat, now, keep) end
if v[5] then return {0, 1} end
return {0, 0}
`)

// refundScript is State.Refund.
//
// KEYS: rpm, tpm. ARGV: now, rpm limit, tpm limit, requests, tokens, keep.
var refundScript = newScript(luaHelpers + `
local now, keep = tonumber(ARGV[1]), tonumber(ARGV[6])
local function give(key, limit, n)
  if limit <= 0 or n <= 0 then return end
  local tat = tonumber(redis.call('GET', key))
  if not tat then return end
  if n > limit then n = limit end
  store(key, tat - n * MINUTE / limit, now, keep)
end
give(KEYS[1], tonumber(ARGV[2]), tonumber(ARGV[4]))
give(KEYS[2], tonumber(ARGV[3]), tonumber(ARGV[5]))
return 0
`)

// holdScript is State.Hold: the later of the two ends.
//
// KEYS: hold. ARGV: until, ttl (ms).
var holdScript = newScript(`
local old = tonumber(redis.call('GET', KEYS[1]))
if old and old >= tonumber(ARGV[1]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
`)

// failureScript is State.Failure. An open circuit counts no failure and
// returns its end; a half-open one (its open period over) opens again
// for the cooldown, as a failed probe does; a closed one adds to the run,
// and past the tolerated count it opens.
//
// KEYS: fails, open, probe, reopened, claim. ARGV: failures, now, until
// if it opens, run ttl (ms), open ttl (ms).
var failureScript = newScript(`
local u = tonumber(redis.call('GET', KEYS[2]))
if u and tonumber(ARGV[2]) < u then return u end
if not u then
  local n = redis.call('INCR', KEYS[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  if n <= tonumber(ARGV[1]) then return 0 end
end
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[5])
redis.call('SET', KEYS[4], '1', 'PX', ARGV[5])
redis.call('DEL', KEYS[1], KEYS[3], KEYS[5])
return tonumber(ARGV[3])
`)

// openScript is State.Open: the later of the two ends; a new open period
// ends the failure run and every claim on the probe of the previous one.
//
// KEYS: open, fails, probe, reopened, claim. ARGV: until, ttl (ms).
var openScript = newScript(`
local old = tonumber(redis.call('GET', KEYS[1]))
if old and old >= tonumber(ARGV[1]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SET', KEYS[4], '1', 'PX', ARGV[2])
redis.call('DEL', KEYS[2], KEYS[3], KEYS[5])
return 1
`)

// probeScript is State.Probe: the lock is taken only on a circuit that is
// open and was seen half-open (by an Admit) since its open period began,
// and only by one caller. The lock holds the caller's token for ttl; the
// claim set holds every token claimed in the open period, for as long as
// the open key lives.
//
// KEYS: open, probe, reopened, claim. ARGV: ttl (ms), token.
var probeScript = newScript(`
local keep = redis.call('PTTL', KEYS[1])
if keep == -2 or redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
if not redis.call('SET', KEYS[2], ARGV[2], 'NX', 'PX', ARGV[1]) then return 0 end
redis.call('SADD', KEYS[4], ARGV[2])
if keep >= 0 then redis.call('PEXPIRE', KEYS[4], math.max(keep, 1)) end
return 1
`)

// successScript is State.Success for a probe: the failure run ends; the
// circuit closes (open, lock, reopened and claims deleted) only if token
// was claimed in the current open period.
//
// KEYS: fails, open, probe, reopened, claim. ARGV: token.
var successScript = newScript(`
if redis.call('SISMEMBER', KEYS[5], ARGV[1]) == 0 then
  redis.call('DEL', KEYS[1])
  return 0
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
return 1
`)

// luaAmounts compares sums of int64 amounts exactly: Lua numbers are
// doubles, exact only to 2^53, so each amount (a non-negative decimal
// string) is split into its last nine digits and the rest.
const luaAmounts = `
local function split(x)
  if not x then return 0, 0 end
  local n = #x
  if n <= 9 then return 0, tonumber(x) end
  return tonumber(string.sub(x, 1, n - 9)), tonumber(string.sub(x, n - 8))
end
local function fits(a, b, c, limit)
  local ah, al = split(a)
  local bh, bl = split(b)
  local ch, cl = split(c)
  local lh, ll = split(limit)
  local lo = al + bl + cl
  local hi = ah + bh + ch + math.floor(lo / 1e9)
  lo = lo % 1e9
  return hi < lh or (hi == lh and lo <= ll)
end
`

// luaHolds ends the expired holds of an account (at most 64 a call):
// each hold is a field h:<id> of the account holding its amount, and a
// member of the expiry set scored by its deadline (Unix ms).
//
// KEYS[1] account, KEYS[3] expiry set; now is the caller's clock (ms).
const luaHolds = `
local function expire(now)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 64)
  for _, id in ipairs(gone) do
    local a = redis.call('HGET', KEYS[1], 'h:' .. id)
    if a then
      if a ~= '0' and redis.call('HINCRBY', KEYS[1], 'r', '-' .. a) < 0 then
        redis.call('HSET', KEYS[1], 'r', 0)
      end
      redis.call('HDEL', KEYS[1], 'h:' .. id)
    end
    redis.call('ZREM', KEYS[3], id)
  end
end
`

// reserveScript is State.Reserve: hold id is set to amount (a top-up
// adds the difference) if spent + reserved stays within limit with it.
//
// KEYS: account (hash: s spent, r reserved, h:<id> each hold), keys of
// the window (set), expiry set. ARGV: limit, id, amount, deadline (ms),
// now (ms), ttl (ms), scope key.
var reserveScript = newScript(luaAmounts + luaHolds + `
expire(ARGV[5])
local v = redis.call('HMGET', KEYS[1], 's', 'r', 'h:' .. ARGV[2])
local delta = tonumber(ARGV[3]) - tonumber(v[3] or '0')
local d = string.format('%d', delta)
if delta > 0 and not fits(v[1], v[2], d, ARGV[1]) then return 0 end
if delta ~= 0 and redis.call('HINCRBY', KEYS[1], 'r', d) < 0 then
  redis.call('HSET', KEYS[1], 'r', 0)
end
redis.call('HSET', KEYS[1], 'h:' .. ARGV[2], ARGV[3])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
redis.call('PEXPIRE', KEYS[3], ARGV[6])
redis.call('SADD', KEYS[2], ARGV[7])
redis.call('PEXPIRE', KEYS[2], ARGV[6])
return 1
`)

// settleScript is State.Settle: hold id ends (reservations fall by its
// amount, at least to 0); spend grows by spent.
//
// KEYS: account, keys of the window, expiry set. ARGV: id, spent, ttl
// (ms), scope key.
var settleScript = newScript(`
local a = redis.call('HGET', KEYS[1], 'h:' .. ARGV[1])
if a then
  if a ~= '0' and redis.call('HINCRBY', KEYS[1], 'r', '-' .. a) < 0 then
    redis.call('HSET', KEYS[1], 'r', 0)
  end
  redis.call('HDEL', KEYS[1], 'h:' .. ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
end
if ARGV[2] ~= '0' then redis.call('HINCRBY', KEYS[1], 's', ARGV[2]) end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('SADD', KEYS[2], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 0
`)

// usageScript is State.Usage: the expired holds end first.
//
// KEYS: account, keys of the window (unused), expiry set. ARGV: now (ms).
var usageScript = newScript(luaHolds + `
expire(ARGV[1])
return redis.call('HMGET', KEYS[1], 's', 'r')
`)

var scripts = []*script{admitScript, refundScript, holdScript, failureScript, openScript, probeScript, successScript, reserveScript, settleScript, usageScript}
