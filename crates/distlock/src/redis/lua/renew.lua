local renewed = {}
local now = now_ms()
for i, lock in ipairs(KEYS) do
  renewed[i] = renew_one(lock, ARGV[2 * i], ARGV[2 * i + 1], tonumber(ARGV[1]), now)
end
return renewed
