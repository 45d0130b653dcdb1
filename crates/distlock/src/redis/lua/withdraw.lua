-- KEYS: the published record. ARGV: term. Withdraws the record if its term is ARGV[1]: its
-- value and holder are emptied, its term kept (so that older terms stay refused). Returns 1
-- when it did, 0 otherwise.
local stored = redis.call('hmget', KEYS[1], 'term', 'holder')
if stored[1] == ARGV[1] and stored[2] and stored[2] ~= '' then
  redis.call('hset', KEYS[1], 'value', '', 'holder', '')
  return 1
end
return 0
