local renewed = {}
for i, lock in ipairs(KEYS) do
  if redis.call('hexists', lock, ARGV[2 * i]) == 1
    and redis.call('hget', lock, ':token') == ARGV[2 * i + 1] then
    redis.call('pexpire', lock, ARGV[1])
    renewed[i] = 1
  else
    renewed[i] = 0
  end
end
return renewed
