
local lock, fence = KEYS[1], KEYS[2]
local owner, lease = ARGV[1], tonumber(ARGV[2])
if redis.call('exists', lock) == 0 then return grant(lock, fence, owner, lease) end
if redis.call('hexists', lock, owner) == 1 then return reenter(lock, owner, lease) end
return {0, redis.call('pttl', lock)}
