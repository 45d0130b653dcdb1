if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
  if redis.call('hget', KEYS[1], ':token') ~= ARGV[3] then return -1 end
  redis.call('pexpire', KEYS[1], ARGV[2])
  return 1
end
if redis.call('exists', KEYS[1]) == 1 then return -2 end
return -1
