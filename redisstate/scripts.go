package redisstate

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Times in the scripts are microseconds since the Unix epoch (exact in a
// Lua number until the year 2255), all of them the times the caller gives:
// Redis's own clock only sets key lifetimes. Rates are per minute, 60e6 µs.

// script is a Lua script run with EVALSHA, and with EVAL (which also
// caches it) when Redis does not know it yet.
type script struct {
	src, sha string
}

func newScript(src string) *script {
	h := sha1.Sum([]byte(src))
	return &script{src: src, sha: hex.EncodeToString(h[:])}
}

// eval runs the script: one round trip, or two the first time a Redis
// server sees it. ff is the fail-fast switch of the keys' node.
func (s *State) eval(ctx context.Context, ff *failFast, sc *script, keys []string, args ...any) *redis.Cmd {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, "evalsha", sc.sha, len(keys))
	for _, k := range keys {
		a = append(a, k)
	}
	a = append(a, args...)
	cmd := s.do(ctx, ff, a...)
	if err := cmd.Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		a[0], a[1] = "eval", sc.src
		cmd = s.do(ctx, ff, a...)
	}
	return cmd
}

// luaUpstream is shared by the scripts of an upstream's hash: its fields
//
//	r, k  the RPM and TPM buckets' theoretical arrival times (GCRA)
//	h     the hold's end
//	o     the open period's end (none: closed); p its id; c its length
//	l     the end of the probe's claim in flight; q its token
//	n     the failure run; t its last failure
//
// and the constants and helpers: GCRA, the circuit's forgetting, and the
// hash's lifetime (while one of its fields matters, plus keep).
const luaUpstream = `
local MINUTE = 60000000
local now = tonumber(ARGV[1])
local KEEP, OPENKEEP, RUN = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
-- gcra returns the new theoretical arrival time of a bucket (limit per
-- minute) whose current one is tat, if n tokens are taken at now, and how
-- long until they are there (0: now).
local function gcra(tat, limit, n)
  tat = tonumber(tat) or now
  if tat < now then tat = now end
  local new = tat + n * MINUTE / limit
  local wait = new - MINUTE - now
  if wait < 0 then wait = 0 end
  return new, wait
end
local function back(tat)
  tat = tonumber(tat)
  if tat and tat > now then return math.ceil(tat - now) end
  return 0
end
local function num(x) return string.format('%.17g', x) end
-- circuit returns the open period's end, nil when closed; a half-open
-- circuit left unprobed for OPENKEEP is forgotten (closed).
local function circuit(open)
  open = tonumber(open)
  if open and now >= open + OPENKEEP then
    redis.call('HDEL', KEYS[1], 'o', 'p', 'c', 'l', 'q')
    return nil
  end
  return open
end
-- keep sets the hash's lifetime: until the last of its fields stops
-- mattering, plus KEEP ms; a hash none of whose fields matter goes.
local function keep()
  local f = redis.call('HMGET', KEYS[1], 'r', 'k', 'h', 'o', 'l', 'n', 't')
  local last = 0
  for i = 1, 3 do
    local v = tonumber(f[i])
    if v and v > last then last = v end
  end
  local o, l, n, t = tonumber(f[4]), tonumber(f[5]), tonumber(f[6]), tonumber(f[7])
  if o and o + OPENKEEP > last then last = o + OPENKEEP end
  if l and l > last then last = l end
  if n and t and t + RUN > last then last = t + RUN end
  if last <= now then
    redis.call('DEL', KEYS[1])
  else
    redis.call('PEXPIRE', KEYS[1], math.ceil((last - now) / 1000) + KEEP)
  end
end
`

// admitScript is State.Admit.
//
// KEYS: the upstream's hash. ARGV: now, keep (ms), open keep, failure run,
// force (0 or 1), probe claim (µs; 0: none), claim's random part, rpm
// limit, tpm limit, tpm charge, requests owed, tokens owed. Returns {0, failing, requests backlog,
// tokens backlog, claim token or ""} when taken, {1, until} when the
// circuit keeps the attempt out, {2, wait, hold's end or 0, requests
// backlog, tokens backlog} when the hold or the limits do.
var admitScript = newScript(luaUpstream + `
local f = redis.call('HMGET', KEYS[1], 'r', 'k', 'h', 'o', 'p', 'l', 'n', 't')
local rpm, tpm, n = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local owed = false
if rpm > 0 and tonumber(ARGV[11]) > 0 then
  f[1] = num(gcra(f[1], rpm, tonumber(ARGV[11])))
  owed = true
end
if tpm > 0 and tonumber(ARGV[12]) > 0 then
  f[2] = num(gcra(f[2], tpm, tonumber(ARGV[12])))
  owed = true
end
if owed then
  redis.call('HSET', KEYS[1], 'r', f[1] or num(now), 'k', f[2] or num(now))
  keep()
end
local open = circuit(f[4])
local claim = false
if open and ARGV[5] == '0' then
  if now < open then return {1, open} end
  local lock = tonumber(f[6])
  if lock and lock > now then return {1, lock} end
  if tonumber(ARGV[6]) <= 0 then return {1, open} end
  claim = true
end
local wait = 0
local hold = tonumber(f[3])
if hold and hold > now then wait = hold - now else hold = 0 end
local rtat, ttat, w = f[1], f[2]
if rpm > 0 then
  rtat, w = gcra(f[1], rpm, 1)
  if w > wait then wait = w end
end
if tpm > 0 then
  ttat, w = gcra(f[2], tpm, n)
  if w > wait then wait = w end
end
if wait > 0 then return {2, math.ceil(wait), hold, back(f[1]), back(f[2])} end
if rpm > 0 then redis.call('HSET', KEYS[1], 'r', num(rtat)) end
if tpm > 0 then redis.call('HSET', KEYS[1], 'k', num(ttat)) end
local token = ''
if claim then
  token = (f[5] or '') .. ':' .. ARGV[7]
  redis.call('HSET', KEYS[1], 'l', num(now + tonumber(ARGV[6])), 'q', token)
end
local failing = 0
local runs, last = tonumber(f[7]), tonumber(f[8])
if runs and runs > 0 and last and now < last + RUN then failing = 1 end
keep()
return {0, failing, back(rtat), back(ttat), token}
`)

// refundScript is State.Refund: tokens go back, never past a full bucket.
//
// KEYS: the upstream's hash. ARGV: now, keep, open keep, failure run, rpm
// limit, tpm limit, requests, tokens.
var refundScript = newScript(luaUpstream + `
local function give(field, limit, n)
  if limit <= 0 or n <= 0 then return end
  local tat = tonumber(redis.call('HGET', KEYS[1], field))
  if not tat or tat <= now then return end
  if n > limit then n = limit end
  tat = tat - n * MINUTE / limit
  if tat <= now then
    redis.call('HDEL', KEYS[1], field)
  else
    redis.call('HSET', KEYS[1], field, num(tat))
  end
end
give('r', tonumber(ARGV[5]), tonumber(ARGV[7]))
give('k', tonumber(ARGV[6]), tonumber(ARGV[8]))
keep()
return 0
`)

// holdScript is State.Hold: the later of the two ends.
//
// KEYS: the upstream's hash. ARGV: now, keep, open keep, failure run,
// until.
var holdScript = newScript(luaUpstream + `
local old = tonumber(redis.call('HGET', KEYS[1], 'h'))
if not old or old < tonumber(ARGV[5]) then redis.call('HSET', KEYS[1], 'h', ARGV[5]) end
keep()
return 0
`)

// luaPeriod starts a new open period: until, its id and length; the run,
// the claim's lock and (with the id) every claim of the period before end.
const luaPeriod = `
local function period(ends, id, cool)
  redis.call('HSET', KEYS[1], 'o', num(ends), 'p', id, 'c', num(cool))
  redis.call('HDEL', KEYS[1], 'l', 'q', 'n', 't')
end
-- claimed reports whether token is a claim of the current open period p.
local function claimed(token, p)
  return token ~= '' and p and string.sub(token, 1, #p + 1) == p .. ':'
end
`

// outcomeScript is State.Outcome.
//
// KEYS: the upstream's hash. ARGV: now, keep, open keep, failure run,
// result (0 neutral, 1 success, 2 failure), probe token, hint (µs),
// failures tolerated, cooldown (µs), max cooldown (µs), the id of a new
// open period. Returns {closed (0 or 1), the end of the period it opened
// or 0, the run that opened it or 0}.
var outcomeScript = newScript(luaUpstream + luaPeriod + `
local f = redis.call('HMGET', KEYS[1], 'o', 'p', 'c', 'q', 'n', 't')
local open = circuit(f[1])
local result, token = ARGV[5], ARGV[6]
local out = {0, 0, 0}
if result == '1' then
  redis.call('HDEL', KEYS[1], 'n', 't')
  if open and claimed(token, f[2]) then
    redis.call('HDEL', KEYS[1], 'o', 'p', 'c', 'l', 'q')
    out = {1, 0, 0}
  end
elseif result == '0' then
  if token ~= '' and token == f[4] then redis.call('HDEL', KEYS[1], 'l', 'q') end
else
  local hint, cooldown, maxc = tonumber(ARGV[7]), tonumber(ARGV[9]), tonumber(ARGV[10])
  if open and now >= open and claimed(token, f[2]) then
    local cool = tonumber(f[3]) or 0
    if cooldown > cool then cool = cooldown end
    if maxc > cool then cool = math.min(2 * cool, maxc) end
    local ends = now + math.max(cool, hint)
    period(ends, ARGV[11], cool)
    out = {0, ends, 0}
  elseif not open and tonumber(ARGV[8]) > 0 then
    local runs, last = tonumber(f[5]) or 0, tonumber(f[6])
    if not last or now >= last + RUN then runs = 0 end
    runs = runs + 1
    if runs > tonumber(ARGV[8]) then
      local ends = now + math.max(cooldown, hint)
      period(ends, ARGV[11], cooldown)
      out = {0, ends, runs}
    else
      redis.call('HSET', KEYS[1], 'n', runs, 't', num(now))
    end
  end
end
keep()
return out
`)

// openScript is State.Open: the later of the two ends; a new open period
// ends the run and every claim of the period before.
//
// KEYS: the upstream's hash. ARGV: now, keep, open keep, failure run,
// until, the id of a new open period.
var openScript = newScript(luaUpstream + luaPeriod + `
local f = redis.call('HMGET', KEYS[1], 'o', 'c')
local open, ends = circuit(f[1]), tonumber(ARGV[5])
if not (open and open >= ends) then
  local cool = tonumber(f[2]) or 0
  if ends - now > cool then cool = ends - now end
  period(ends, ARGV[6], cool)
end
keep()
return 0
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

// luaHolds ends the expired holds of an account (at most 64 a call), and
// forgets the settled holds kept past their time: each hold is a field
// h:<id> of the account holding its amount, and a member of the expiry
// set scored by its deadline (Unix ms); each settled hold a member of the
// settled set, scored by when it is forgotten.
//
// KEYS[1] account, KEYS[3] expiry set, KEYS[4] settled set; now is the
// caller's time (ms).
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
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
end
`

// reserveScript is State.Reserve: hold id is set to amount (a top-up
// adds the difference) if spent + reserved stays within limit with it,
// unless the hold was settled.
//
// KEYS: account (hash: s spent, r reserved, h:<id> each hold), keys of
// the window (set), expiry set, settled set. ARGV: limit, id, amount,
// deadline (ms), now (ms), ttl (ms), scope key. Returns {ok, spent,
// reserved} (amounts as decimal strings).
var reserveScript = newScript(luaAmounts + luaHolds + `
expire(ARGV[5])
local v = redis.call('HMGET', KEYS[1], 's', 'r', 'h:' .. ARGV[2])
local function out(ok)
  local w = redis.call('HMGET', KEYS[1], 's', 'r')
  return {ok, w[1] or '0', w[2] or '0'}
end
if redis.call('ZSCORE', KEYS[4], ARGV[2]) then return out(0) end
local delta = tonumber(ARGV[3]) - tonumber(v[3] or '0')
local d = string.format('%d', delta)
if delta > 0 and not fits(v[1], v[2], d, ARGV[1]) then return out(0) end
if delta ~= 0 and redis.call('HINCRBY', KEYS[1], 'r', d) < 0 then
  redis.call('HSET', KEYS[1], 'r', 0)
end
redis.call('HSET', KEYS[1], 'h:' .. ARGV[2], ARGV[3])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
redis.call('PEXPIRE', KEYS[3], ARGV[6])
redis.call('SADD', KEYS[2], ARGV[7])
redis.call('PEXPIRE', KEYS[2], ARGV[6])
return out(1)
`)

// settleScript is State.Settle: hold id ends (reservations fall by its
// amount, at least to 0) and is kept as settled; spend grows by spent.
//
// KEYS: account, keys of the window, expiry set, settled set. ARGV: id
// ("" for none), spent, ttl (ms), scope key, now (ms), settled keep (ms).
var settleScript = newScript(luaHolds + `
expire(ARGV[5])
if ARGV[1] ~= '' then
  local a = redis.call('HGET', KEYS[1], 'h:' .. ARGV[1])
  if a then
    if a ~= '0' and redis.call('HINCRBY', KEYS[1], 'r', '-' .. a) < 0 then
      redis.call('HSET', KEYS[1], 'r', 0)
    end
    redis.call('HDEL', KEYS[1], 'h:' .. ARGV[1])
    redis.call('ZREM', KEYS[3], ARGV[1])
  end
  redis.call('ZADD', KEYS[4], tonumber(ARGV[5]) + tonumber(ARGV[6]), ARGV[1])
  redis.call('PEXPIRE', KEYS[4], ARGV[3])
end
if ARGV[2] ~= '0' then redis.call('HINCRBY', KEYS[1], 's', ARGV[2]) end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('SADD', KEYS[2], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 0
`)

// usageScript is State.Usage: the expired holds end first.
//
// KEYS: account, keys of the window (unused), expiry set, settled set.
// ARGV: now (ms).
var usageScript = newScript(luaHolds + `
expire(ARGV[1])
return redis.call('HMGET', KEYS[1], 's', 'r')
`)

var scripts = []*script{admitScript, refundScript, holdScript, outcomeScript, openScript, reserveScript, settleScript, usageScript}
