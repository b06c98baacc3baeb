"""The Redis queue store's keys and Lua scripts (services/common/store/redis_queue.py runs
them). Every script names only keys of one hash slot: a queue's keys share the tag
`{<len(tenant)>:<tenant>:<queue_id>}` (the length keeps "a:b"/"c" apart from "a"/"b:c"), a
partition's keys the tag `{p<n>}`, so the same scripts run on one server, behind Sentinel and
on a Redis Cluster.

A queue (base key `<prefix>{...}`):
- `:st` hash: last, acked, depth, dropped, dlv (delivered_through), bytes; fence (the highest
  epoch a claim took the queue to), owner (the epoch whose check passed, see redis_queue.py),
  born (a token set when the hash is created for a first write).
- `:log` stream: one entry per seq, id `<seq>-0`, fields q (QoS), d (data), e (expiry ms).
- `:ids` sorted set: message id -> append time (ms), pruned past the de-duplication window.
- `:rel` sorted set: the seqs marked released (outbound QoS 2), scored by seq.
A partition: `<prefix>{p<n>}:epoch` (INCR per claim), `<prefix>{p<n>}:queues` (the set of
queue base keys registered under it, which a claim takes).
"""

from __future__ import annotations

SUFFIXES = (":st", ":log", ":ids", ":rel")


def queue_base(prefix: str, tenant: str, queue_id: str) -> str:
    """The base of a queue's keys (append SUFFIXES); its hash tag is the tenant and queue."""
    return f"{prefix}{{{len(tenant)}:{tenant}:{queue_id}}}"


def parse_base(prefix: str, base: str) -> tuple[str, str]:
    """(tenant, queue id) of a queue base key made by `queue_base`."""
    body = base[len(prefix) + 1 : -1]
    size, _, rest = body.partition(":")
    n = int(size)
    return rest[:n], rest[n + 1 :]


def partition_keys(prefix: str, partition: int) -> tuple[str, str]:
    """The partition's epoch counter and its set of registered queues."""
    return f"{prefix}{{p{partition}}}:epoch", f"{prefix}{{p{partition}}}:queues"


# Shared by the scripts: a stream entry's seq and data.
_HELPERS = """
local function seq_of(id) return tonumber(string.match(id, '^(%d+)')) end
local function field(f, name)
  for j = 1, #f, 2 do if f[j] == name then return f[j + 1] end end
  return ''
end
"""

# KEYS st, log, ids, rel. ARGV epoch, born ('' : the owner check has not been made here),
# max_depth, drop_oldest, room (-1: none), mark_delivered, now_ms, retention_ms, then
# (message id, qos, data, expiry) per item. 'F': fenced; 'C': check the partition first;
# else {outcome letters, last, dropped change, depth change, bytes change}.
APPEND = (
    _HELPERS
    + """
local st, log, ids, rel = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local e = tonumber(ARGV[1])
local s = redis.call('HMGET', st, 'fence', 'owner', 'born', 'last', 'depth', 'dropped', 'bytes')
if (tonumber(s[1]) or 0) > e or (tonumber(s[2]) or 0) > e then return 'F' end
if (tonumber(s[2]) or 0) < e then
  if ARGV[2] == '' or s[3] ~= ARGV[2] then return 'C' end
  redis.call('HSET', st, 'owner', e)
end
local last0, depth0 = tonumber(s[4]) or 0, tonumber(s[5]) or 0
local dropped0, bytes0 = tonumber(s[6]) or 0, tonumber(s[7]) or 0
local last, depth, dropped, held = last0, depth0, dropped0, bytes0
local maxd, oldest, room = tonumber(ARGV[3]), ARGV[4] == '1', tonumber(ARGV[5])
local now, keep = tonumber(ARGV[7]), tonumber(ARGV[8])
redis.call('ZREMRANGEBYSCORE', ids, '-inf', '(' .. string.format('%d', now - keep))
local out = {}
for i = 9, #ARGV, 4 do
  local mid, data = ARGV[i], ARGV[i + 2]
  if redis.call('ZSCORE', ids, mid) then
    out[#out + 1] = 'd'
  elseif room >= 0 and held - bytes0 + #data > room then
    out[#out + 1] = 'b'
  elseif maxd > 0 and depth >= maxd and not oldest then
    dropped = dropped + 1
    out[#out + 1] = 'f'
  else
    if maxd > 0 and depth >= maxd then
      local first = redis.call('XRANGE', log, '-', '+', 'COUNT', 1)[1]
      if first then
        redis.call('XDEL', log, first[1])
        redis.call('ZREM', rel, seq_of(first[1]))
        held = held - #field(first[2], 'd')
        depth = depth - 1
        dropped = dropped + 1
      end
    end
    last = last + 1
    redis.call('XADD', log, string.format('%d-0', last), 'q', ARGV[i + 1], 'd', data,
      'e', ARGV[i + 3])
    redis.call('ZADD', ids, now, mid)
    depth = depth + 1
    held = held + #data
    out[#out + 1] = 'o'
  end
end
if last ~= last0 or dropped ~= dropped0 or depth ~= depth0 then
  redis.call('HSET', st, 'last', last, 'depth', depth, 'dropped', dropped, 'bytes', held)
  redis.call('PEXPIRE', ids, keep)
end
if ARGV[6] == '1' and last > last0 and (tonumber(redis.call('HGET', st, 'dlv')) or 0) < last
then
  redis.call('HSET', st, 'dlv', last)
end
return {table.concat(out), last, dropped - dropped0, depth - depth0, held - bytes0}
"""
)

# KEYS st, log, rel. ARGV from_seq, limit, mark_delivered, max_bytes. {last, acked, depth,
# dropped, dlv, bytes (before this read), then seq, qos, data, expiry, released per entry}.
READ = (
    _HELPERS
    + """
local st, log, rel = KEYS[1], KEYS[2], KEYS[3]
local s = redis.call('HMGET', st, 'last', 'acked', 'depth', 'dropped', 'dlv', 'bytes')
local out = {}
for i = 1, 6 do out[i] = tonumber(s[i]) or 0 end
local from, cap = math.max(tonumber(ARGV[1]), 1), tonumber(ARGV[4])
local rows = redis.call('XRANGE', log, string.format('%d-0', from), '+', 'COUNT', ARGV[2])
local total, seq = 0, 0
for _, row in ipairs(rows) do
  local data = field(row[2], 'd')
  total = total + #data
  if seq > 0 and cap > 0 and total > cap then break end
  seq = seq_of(row[1])
  local released = 0
  if redis.call('ZSCORE', rel, seq) then released = 1 end
  out[#out + 1] = seq
  out[#out + 1] = tonumber(field(row[2], 'q'))
  out[#out + 1] = data
  out[#out + 1] = tonumber(field(row[2], 'e'))
  out[#out + 1] = released
end
if ARGV[3] == '1' and seq > out[5] then redis.call('HSET', st, 'dlv', seq) end
return out
"""
)

# KEYS st, log, rel. ARGV through_seq. {depth change, bytes change}.
ACK = (
    _HELPERS
    + """
local st, log, rel = KEYS[1], KEYS[2], KEYS[3]
if redis.call('EXISTS', st) == 0 then return {0, 0} end
local s = redis.call('HMGET', st, 'acked', 'last', 'depth', 'bytes')
local acked, last = tonumber(s[1]) or 0, tonumber(s[2]) or 0
local depth, held = tonumber(s[3]) or 0, tonumber(s[4]) or 0
local through = tonumber(ARGV[1])
if through <= acked then return {0, 0} end
local upto, start, freed = string.format('%d-0', through), '-', 0
while true do
  local rows = redis.call('XRANGE', log, start, upto, 'COUNT', 512)
  for _, row in ipairs(rows) do freed = freed + #field(row[2], 'd') end
  if #rows < 512 then break end
  start = '(' .. rows[#rows][1]
end
local n = redis.call('XTRIM', log, 'MINID', string.format('%d-0', through + 1))
redis.call('ZREMRANGEBYSCORE', rel, '-inf', through)
local depth2, held2 = math.max(0, depth - n), math.max(0, held - freed)
redis.call('HSET', st, 'acked', math.min(through, last), 'depth', depth2, 'bytes', held2)
return {depth2 - depth, held2 - held}
"""
)

# KEYS st, log, ids, rel. {depth change, bytes change}.
DROP = """
local s = redis.call('HMGET', KEYS[1], 'depth', 'bytes')
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
return {-(tonumber(s[1]) or 0), -(tonumber(s[2]) or 0)}
"""

# KEYS log, rel. ARGV seq. Marks only an entry still stored.
RELEASE = """
local id = string.format('%d-0', tonumber(ARGV[1]))
if #redis.call('XRANGE', KEYS[1], id, id) > 0 then
  redis.call('ZADD', KEYS[2], ARGV[1], ARGV[1])
end
return 0
"""

# KEYS st. ARGV token. The hash made to exist (born set once); its born token.
CREATE = """
redis.call('HSETNX', KEYS[1], 'born', ARGV[1])
return redis.call('HGET', KEYS[1], 'born')
"""

# KEYS st. ARGV epoch. A claim takes the queue: fence raised to the epoch. 0: no such queue.
TAKE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if (tonumber(redis.call('HGET', KEYS[1], 'fence')) or 0) < tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'fence', ARGV[1])
end
return 1
"""

# KEYS epoch, queues. ARGV epoch, then queue base keys: forgotten only while the epoch is
# still the partition's (see redis_queue.py, "Forgetting").
FORGET = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
for i = 2, #ARGV do redis.call('SREM', KEYS[2], ARGV[i]) end
return 1
"""
