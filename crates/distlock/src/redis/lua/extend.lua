local lock, owner, lease, token = KEYS[1], ARGV[1], tonumber(ARGV[2]), ARGV[3]
if redis.call('hget', lock, ':t:' .. owner) == token then
  local now = now_ms()
  if not reader_ends(lock, owner, now) then return -1 end
  redis.call('hset', lock, ':e:' .. owner, now + lease)
  keep_key_for(lock, lease)
  return 1
end
if redis.call('hexists', lock, owner) == 1 then
  if redis.call('hget', lock, ':token') ~= token then return -1 end
  redis.call('pexpire', lock, lease)
  return 1
end
if redis.call('exists', lock) == 1 then return -2 end
return -1
