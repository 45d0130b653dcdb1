local lock, fence = KEYS[1], KEYS[2]
local owner, lease, floor = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
if redis.call('exists', lock) == 1 then
  if redis.call('hexists', lock, owner) == 1 then return reenter(lock, owner, lease) end
  return {0, redis.call('pttl', lock)}
end
if floor == 0 then return grant(lock, fence, owner, lease) end
local token = tonumber(redis.call('get', fence) or '0') + 1
if token < floor then token = floor end
local text = string.format('%.0f', token)
redis.call('set', fence, text)
redis.call('hset', lock, owner, 1, ':token', text)
redis.call('pexpire', lock, lease)
return {1, token, 1}
