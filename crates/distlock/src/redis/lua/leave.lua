
local lock, id = KEYS[1], ARGV[1]
redis.call('zrem', KEYS[4], id)
redis.call('hdel', KEYS[5], id)
redis.call('hdel', KEYS[6], id)
if redis.call('hget', lock, ':handoff') == id then
  redis.call('hdel', lock, ':handoff')
  if redis.call('hincrby', lock, owner_of(id), -1) > 0 then return 1 end
  redis.call('del', lock)
end
if redis.call('exists', lock) == 0 then
  pass_on(lock, KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], tonumber(ARGV[2]))
end
return 1
