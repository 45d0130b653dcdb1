local lock, fence, writers = KEYS[1], KEYS[2], KEYS[3]
local owner, lease, reader = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1'
local mark, recheck = tonumber(ARGV[4]), tonumber(ARGV[5])
local now = now_ms()
-- Marks that ended linger until the set expires (each mark renews it): count fresh ones only.
local function writer_waits()
  return #redis.call('zrange', writers, '(' .. now, '+inf', 'BYSCORE', 'LIMIT', 0, 1) > 0
end
-- A waiting writer (one that marked itself when it began to wait) keeps its mark fresh.
local function turned_away(pttl)
  if not reader and redis.call('zscore', writers, owner) then
    redis.call('zadd', writers, now + mark, owner)
    redis.call('pexpire', writers, mark)
  end
  if pttl > recheck then pttl = recheck end
  return {0, pttl}
end
local readers = live_readers(lock, now)
if readers > 0 then
  if not reader then return turned_away(recheck) end
  if reader_ends(lock, owner, now) then
    local holds = redis.call('hincrby', lock, owner, 1)
    if reader_ends(lock, owner, now) < now + lease then
      redis.call('hset', lock, ':e:' .. owner, now + lease)
    end
    keep_key_for(lock, lease)
    return {1, tonumber(redis.call('hget', lock, ':t:' .. owner)), holds}
  end
elseif redis.call('exists', lock) == 1 then
  if not reader and redis.call('hexists', lock, owner) == 1 then
    return reenter(lock, owner, lease)
  end
  return turned_away(redis.call('pttl', lock))
end
if not reader then
  redis.call('zrem', writers, owner)
  return grant(lock, fence, owner, lease)
end
if writer_waits() then return {0, recheck} end
local token = next_token(fence)
redis.call('hset', lock, ':mode', 'r', owner, 1, ':t:' .. owner, string.format('%.0f', token),
  ':e:' .. owner, now + lease)
keep_key_for(lock, lease)
return {1, token, 1}
