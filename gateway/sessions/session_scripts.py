"""The Lua scripts behind every write of a session's state (``gateway.sessions.session_store``):
each checks the session's epoch first, so an owner that was replaced cannot write; appends also
check the expected length. Return codes: -1 a later epoch owns the session, -2 the length
differs, -3 the record is gone, -4 the record is behind the writer's epoch."""

APPEND_SCRIPT = """
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if not epoch then return -3 end
if epoch ~= ARGV[1] then
  if tonumber(epoch) < tonumber(ARGV[1]) then return -4 end
  return -1
end
local stored, expected, count = redis.call('LLEN', KEYS[2]), tonumber(ARGV[2]), #ARGV - 5
if stored == expected + count and count > 0 then
  local tail = redis.call('LRANGE', KEYS[2], expected, -1)
  local same = true
  for i = 1, count do
    if tail[i] ~= ARGV[5 + i] then same = false break end
  end
  if same then return stored end
end
if count == 0 and stored == expected and redis.call('HGET', KEYS[1], 'status') == 'finished' then
  return stored
end
if stored ~= expected then return -2 end
if count > 0 then redis.call('RPUSH', KEYS[2], unpack(ARGV, 6)) end
local length = stored + count
redis.call('RPUSH', KEYS[3], length)
local now = redis.call('TIME')
redis.call('HSET', KEYS[1], 'lease_ms', now[1] * 1000 + math.floor(now[2] / 1000) + ARGV[4])
if ARGV[5] ~= '' then
  redis.call('HSET', KEYS[1], 'status', 'finished', 'finish_reason', ARGV[5])
end
for i = 1, 3 do redis.call('EXPIRE', KEYS[i], ARGV[3]) end
return length
"""
"""Idempotent: an append whose exact tokens already follow the expected length (a retry whose
first reply was lost) changes nothing and succeeds. Each append is one round (its end goes on
the rounds list) and renews the lease; the final round (ARGV[5], its finish reason) records
the session finished in the same step, so no stored session is complete but still running.
-3: the record is gone (a Redis restart lost it); -1: a later epoch owns the session; -4: the
stored epoch is older than the writer's (a restart lost an epoch bump); -2: the stored length
differs."""

CREATE_SCRIPT = """
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
redis.call('EXPIRE', KEYS[1], ARGV[1])
local now = redis.call('TIME')
redis.call('HSET', KEYS[1], 'lease_ms', now[1] * 1000 + math.floor(now[2] / 1000) + ARGV[2])
return 0
"""
"""A new session's record (ARGV[3:], field and value in turn) with its TTL (ARGV[1]) and this
gateway's lease (ARGV[2] ms); 0: the length of its token list."""

RESTORE_SCRIPT = """
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if epoch and tonumber(epoch) > tonumber(ARGV[1]) then return -1 end
local num_fields, num_tokens = tonumber(ARGV[3]), tonumber(ARGV[4])
local first = 5 + num_fields
local stored = redis.call('LRANGE', KEYS[2], 0, -1)
if #stored > num_tokens then return -2 end
for i = 1, #stored do
  if stored[i] ~= ARGV[first + i - 1] then return -2 end
end
redis.call('HSET', KEYS[1], unpack(ARGV, 5, 4 + num_fields))
if num_tokens > #stored then
  redis.call('RPUSH', KEYS[2], unpack(ARGV, first + #stored, first + num_tokens - 1))
end
redis.call('DEL', KEYS[3])
if #ARGV >= first + num_tokens then redis.call('RPUSH', KEYS[3], unpack(ARGV, first + num_tokens)) end
for i = 1, 3 do redis.call('EXPIRE', KEYS[i], ARGV[2]) end
return num_tokens
"""
"""Re-writes a session the gateway holds after Redis lost writes (a restart without the last
second of its append-only file): the record's fields, the tokens missing after the stored ones
(which must be a prefix of the gateway's) and the round ends. Checked before anything is
written: refused (-1) when a later epoch owns it, (-2) when the stored tokens are not a prefix
of the gateway's. A missing record has no epoch to compare (that loss is what this repairs);
the prefix check still guards the tokens."""

TAKEOVER_SCRIPT = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return -3 end
if status ~= 'running' and status ~= 'cancelled' then return -2 end
local now = redis.call('TIME')
local now_ms = now[1] * 1000 + math.floor(now[2] / 1000)
local lease = tonumber(redis.call('HGET', KEYS[1], 'lease_ms') or '0')
if status == 'running' and lease > now_ms then return -1 end
local epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'lease_ms', now_ms + ARGV[2], 'status', 'running')
return epoch
"""
"""A new epoch for gateway ARGV[1], if the session is unfinished and no stream holds a live
lease on it (this gateway's own streams included: a second caller never takes a live stream
over): -1 the lease is held, -2 the session has ended, -3 it is gone."""

RENEW_SCRIPT = """
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return 0 end
local now = redis.call('TIME')
redis.call('HSET', KEYS[1], 'lease_ms', now[1] * 1000 + math.floor(now[2] / 1000) + ARGV[2])
return 1
"""

SET_IF_EPOCH_SCRIPT = """
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
for i = 1, #KEYS do redis.call('EXPIRE', KEYS[i], ARGV[2]) end
return 1
"""
"""Sets the record's fields ARGV[3:] if the epoch is ARGV[1]; every key in KEYS (the record
first) then expires in ARGV[2] seconds."""

REASSIGN_SCRIPT = """
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if not epoch then return -3 end
if epoch ~= ARGV[1] then
  if tonumber(epoch) < tonumber(ARGV[1]) then return -4 end
  return -1
end
epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('HSET', KEYS[1], 'drafter', ARGV[2], 'verifier', ARGV[3])
return epoch
"""
"""-3, -4, -1 as in APPEND_SCRIPT: a record lost by Redis (a failover to a replica that had not
received it) is told apart from one a later epoch owns."""
