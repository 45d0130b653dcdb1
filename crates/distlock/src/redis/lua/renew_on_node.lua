#!lua flags=allow-cross-slot-keys
local renewed = {}
local now = now_ms()
for i = 2, #ARGV, 3 do
  renewed[#renewed + 1] = renew_one(ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[1]), now)
end
return renewed
