-- KEYS: the published record (a hash: term, value, holder). ARGV: term, value, holder.
-- Stores the record unless the stored one has a larger term; returns the record stored
-- afterwards as {term, value, holder}. Terms are decimal strings without leading zeros,
-- compared exactly (by length, then by digits), beyond the 2^53 of Lua numbers.
local stored = redis.call('hmget', KEYS[1], 'term', 'value', 'holder')
local term = stored[1]
if term and (#term > #ARGV[1] or (#term == #ARGV[1] and term > ARGV[1])) then
  return {term, stored[2] or '', stored[3] or ''}
end
redis.call('hset', KEYS[1], 'term', ARGV[1], 'value', ARGV[2], 'holder', ARGV[3])
return {ARGV[1], ARGV[2], ARGV[3]}
