redis.call('zadd', KEYS[1], now_ms() + tonumber(ARGV[2]), ARGV[1])
redis.call('pexpire', KEYS[1], ARGV[2])
return 1
