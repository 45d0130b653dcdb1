
local function next_token(fence)
  local t = redis.call('time')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local token = redis.call('incr', fence)
  if token < now then
    token = now
    redis.call('set', fence, string.format('%.0f', now))
  end
  return token
end
local function grant(lock, fence, owner, lease)
  local token = next_token(fence)
  redis.call('hset', lock, owner, 1, ':token', string.format('%.0f', token))
  redis.call('pexpire', lock, lease)
  return {1, token, 1}
end
local function owner_of(id)
  return string.match(id, '^(.*)#[^#]*$') or id
end
local function reenter(lock, owner, lease)
  local holds = redis.call('hincrby', lock, owner, 1)
  if redis.call('pttl', lock) < lease then
    redis.call('pexpire', lock, lease)
  end
  return {1, tonumber(redis.call('hget', lock, ':token')), holds}
end
