
local queue, seen, ticket, terms, lock = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
if redis.call('hget', lock, ':handoff') == ARGV[1] then
  return {1, tonumber(redis.call('hget', lock, ':token')), tonumber(redis.call('hget', lock, ':seq'))}
end
local t = redis.call('time')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if not redis.call('zscore', queue, ARGV[1]) then
  redis.call('zadd', queue, redis.call('incr', ticket), ARGV[1])
end
redis.call('hset', seen, ARGV[1], now)
redis.call('hset', terms, ARGV[1], ARGV[2] .. ' ' .. ARGV[3])
return {0}
