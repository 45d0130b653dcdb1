
if redis.call('del', KEYS[1]) == 1 then
  pass_on(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], tonumber(ARGV[1]))
  return 1
end
return 0
