local lock, channel, owner, mark = KEYS[1], KEYS[2], ARGV[1], ':a:' .. ARGV[2]
if redis.call('hdel', lock, mark) == 0 then return 0 end
if redis.call('hincrby', lock, owner, -1) > 0 then return 1 end
redis.call('del', lock)
redis.call('publish', channel, '*')
return 1
