local lock, fence = KEYS[1], KEYS[2]
local owner, lease, floor, mark = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ':a:' .. ARGV[4]
if redis.call('exists', lock) == 1 then
  if redis.call('hexists', lock, owner) == 0 then return {0, redis.call('pttl', lock)} end
  local reentered = reenter(lock, owner, lease)
  redis.call('hset', lock, mark, 1)
  return reentered
end
local granted
if floor == 0 then
  granted = grant(lock, fence, owner, lease)
else
  local token = tonumber(redis.call('get', fence) or '0') + 1
  if token < floor then token = floor end
  local text = string.format('%.0f', token)
  redis.call('set', fence, text)
  redis.call('hset', lock, owner, 1, ':token', text)
  redis.call('pexpire', lock, lease)
  granted = {1, token, 1}
end
redis.call('hset', lock, mark, 1)
return granted
