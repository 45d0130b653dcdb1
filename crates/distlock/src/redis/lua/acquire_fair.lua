
local lock, fence, queue, seen, terms = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local owner, lease = ARGV[1], tonumber(ARGV[2])
if redis.call('exists', lock) == 1 then
  if redis.call('hexists', lock, owner) == 1 then return reenter(lock, owner, lease) end
  return {0, redis.call('pttl', lock)}
end
local head = live_head(queue, seen, terms, tonumber(ARGV[3]))
if head then
  if owner_of(head) ~= owner then return {0, -3} end
  redis.call('zrem', queue, head)
  redis.call('hdel', seen, head)
  redis.call('hdel', terms, head)
end
return grant(lock, fence, owner, lease)
