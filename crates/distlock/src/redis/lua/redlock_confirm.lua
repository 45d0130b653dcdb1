if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then return 0 end
if tonumber(redis.call('get', KEYS[2]) or '0') < tonumber(ARGV[2]) then
  redis.call('set', KEYS[2], ARGV[2])
end
redis.call('hset', KEYS[1], ':token', ARGV[2])
if ARGV[3] == '1' then
  redis.call('hset', KEYS[1], ARGV[1], 1)
  local mine = ':a:' .. ARGV[4]
  for _, field in ipairs(redis.call('hkeys', KEYS[1])) do
    if string.sub(field, 1, 3) == ':a:' and field ~= mine then
      redis.call('hdel', KEYS[1], field)
    end
  end
end
return 1
