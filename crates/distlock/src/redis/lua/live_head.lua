
local function live_head(queue, seen, terms, stale)
  local now
  while true do
    local head = redis.call('zrange', queue, 0, 0)[1]
    if not head then return nil end
    if not now then
      local t = redis.call('time')
      now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
    local last = tonumber(redis.call('hget', seen, head) or '0')
    if last + stale > now then return head end
    redis.call('zrem', queue, head)
    redis.call('hdel', seen, head)
    redis.call('hdel', terms, head)
  end
end
local function pass_on(lock, fence, channel, queue, seen, terms, stale)
  local head = live_head(queue, seen, terms, stale)
  if not head then
    redis.call('publish', channel, '*')
    return
  end
  local t = redis.call('hget', terms, head) or '0 0'
  local lease, seq = string.match(t, '^(%d+) (%d+)$')
  lease = tonumber(lease or '0')
  if lease > 0 then
    local token = grant(lock, fence, owner_of(head), lease)[2]
    redis.call('hset', lock, ':handoff', head, ':seq', seq)
    redis.call('zrem', queue, head)
    redis.call('hdel', seen, head)
    redis.call('hdel', terms, head)
    redis.call('publish', channel .. '>' .. head, '!' .. head .. ' ' .. string.format('%.0f', token) .. ' ' .. seq)
  else
    redis.call('publish', channel .. '>' .. head, head)
  end
end
