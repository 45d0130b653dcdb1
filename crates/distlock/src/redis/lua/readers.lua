
local function now_ms()
  local t = redis.call('time')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function keep_key_for(lock, lease)
  if redis.call('pttl', lock) < lease then redis.call('pexpire', lock, lease) end
end
local function forget_reader(lock, owner)
  redis.call('hdel', lock, owner, ':t:' .. owner, ':e:' .. owner)
end
local function live_readers(lock, now)
  if redis.call('hget', lock, ':mode') ~= 'r' then return 0 end
  local fields = redis.call('hgetall', lock)
  local live, last = 0, 0
  for i = 1, #fields, 2 do
    local field = fields[i]
    if string.sub(field, 1, 3) == ':e:' then
      local ends = tonumber(fields[i + 1])
      if ends <= now then
        forget_reader(lock, string.sub(field, 4))
      else
        live = live + 1
        if ends > last then last = ends end
      end
    end
  end
  if live == 0 then
    redis.call('del', lock)
  else
    redis.call('pexpire', lock, last - now)
  end
  return live
end
local function reader_ends(lock, owner, now)
  local ends = tonumber(redis.call('hget', lock, ':e:' .. owner) or '0')
  if ends <= now then return nil end
  return ends
end
local function renew_one(lock, owner, token, lease, now)
  if redis.call('hget', lock, ':t:' .. owner) == token then
    if not reader_ends(lock, owner, now) then return 0 end
    redis.call('hset', lock, ':e:' .. owner, now + lease)
    keep_key_for(lock, lease)
    return 1
  end
  if redis.call('hexists', lock, owner) == 1 and redis.call('hget', lock, ':token') == token then
    redis.call('pexpire', lock, lease)
    return 1
  end
  return 0
end
