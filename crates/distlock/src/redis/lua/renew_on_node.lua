#!lua flags=allow-cross-slot-keys
local renewed = {}
for i = 2, #ARGV, 3 do
  if redis.call('hexists', ARGV[i], ARGV[i + 1]) == 1
    and redis.call('hget', ARGV[i], ':token') == ARGV[i + 2] then
    redis.call('pexpire', ARGV[i], ARGV[1])
    renewed[#renewed + 1] = 1
  else
    renewed[#renewed + 1] = 0
  end
end
return renewed
