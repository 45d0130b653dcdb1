if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then return 0 end
if tonumber(redis.call('get', KEYS[2]) or '0') < tonumber(ARGV[2]) then
  redis.call('set', KEYS[2], ARGV[2])
end
redis.call('hset', KEYS[1], ':token', ARGV[2])
if ARGV[3] == '1' then redis.call('hset', KEYS[1], ARGV[1], 1) end
return 1
