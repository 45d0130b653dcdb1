local lock, owner = KEYS[1], ARGV[1]
if not reader_ends(lock, owner, now_ms()) then return 0 end
return tonumber(redis.call('hget', lock, owner) or '0')
