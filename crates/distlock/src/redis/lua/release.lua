
local lock, owner = KEYS[1], ARGV[1]
if redis.call('hexists', lock, owner) == 0 then
  if redis.call('exists', lock) == 1 then return -2 end
  return -1
end
local holds = redis.call('hincrby', lock, owner, -1)
if holds > 0 then return holds end
redis.call('del', lock)
pass_on(lock, KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], tonumber(ARGV[2]))
return 0
