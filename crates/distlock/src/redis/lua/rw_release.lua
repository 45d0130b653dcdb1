local lock, owner = KEYS[1], ARGV[1]
local now = now_ms()
if redis.call('hget', lock, ':mode') ~= 'r' or not reader_ends(lock, owner, now) then return -1 end
local holds = redis.call('hincrby', lock, owner, -1)
if holds > 0 then return holds end
forget_reader(lock, owner)
if live_readers(lock, now) == 0 then
  pass_on(lock, KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], tonumber(ARGV[2]))
end
return 0
