//! Stock in Redis: one hash per item, `distlock:stock:{<item>}` with fields `quantity` and
//! `fence` (the newest fencing token seen). Each operation is one Lua script, so it is atomic
//! against every other client of the server.

use async_trait::async_trait;
use redis::Script;
use redis::aio::MultiplexedConnection;

use crate::error::{Error, Result};
use crate::stock::{Spread, StockStore, Taken, fenced, missing_item};

const SCHEME: &str = "redis";

/// `{1, quantity}` after raising the fence to the token, `{0, fence}` when a newer token was
/// seen, `{-1}` when there is no such item.
const READ_FENCED: &str = r"
if redis.call('exists', KEYS[1]) == 0 then return {-1} end
local fence = tonumber(redis.call('hget', KEYS[1], 'fence'))
local token = tonumber(ARGV[1])
if token < fence then return {0, fence} end
redis.call('hset', KEYS[1], 'fence', ARGV[1])
return {1, tonumber(redis.call('hget', KEYS[1], 'quantity'))}";

/// As `READ_FENCED`, writing the quantity (ARGV[2]) instead of reading it.
const WRITE_FENCED: &str = r"
if redis.call('exists', KEYS[1]) == 0 then return {-1} end
local fence = tonumber(redis.call('hget', KEYS[1], 'fence'))
local token = tonumber(ARGV[1])
if token < fence then return {0, fence} end
redis.call('hset', KEYS[1], 'fence', ARGV[1], 'quantity', ARGV[2])
return {1, 0}";

/// `{1, remaining}` after taking ARGV[1] units, `{0, available}` when there are not enough,
/// `{-1}` when there is no such item. The lock-free ceiling: check and decrement in one call.
const TAKE: &str = r"
local quantity = tonumber(redis.call('hget', KEYS[1], 'quantity'))
if quantity == nil then return {-1} end
local n = tonumber(ARGV[1])
if quantity < n then return {0, quantity} end
return {1, redis.call('hincrby', KEYS[1], 'quantity', -n)}";

/// Takes ARGV[1] units from the items KEYS together, fullest first (the lower index on a
/// tie), all or nothing. `{1, q1, p1, q2, p2, ...}` with each item's quantity before and the
/// part taken (all parts 0 when the total is short), `{-1, i}` when item i is missing.
const TAKE_SPREAD: &str = r"
local n = tonumber(ARGV[1])
local q, total = {}, 0
for i, k in ipairs(KEYS) do
  local v = tonumber(redis.call('hget', k, 'quantity'))
  if v == nil then return {-1, i} end
  q[i] = v
  total = total + v
end
local parts = {}
for i = 1, #KEYS do parts[i] = 0 end
if total >= n then
  local order = {}
  for i = 1, #KEYS do order[i] = i end
  table.sort(order, function(a, b)
    if q[a] ~= q[b] then return q[a] > q[b] end
    return a < b
  end)
  local left = n
  for _, i in ipairs(order) do
    if left == 0 then break end
    local part = math.min(left, q[i])
    if part > 0 then
      redis.call('hincrby', KEYS[i], 'quantity', -part)
      parts[i] = part
      left = left - part
    end
  end
end
local reply = {1}
for i = 1, #KEYS do
  reply[#reply + 1] = q[i]
  reply[#reply + 1] = parts[i]
end
return reply";

/// `{1, total}` after adding ARGV[1], `{-1}` when there is no such item.
const ADD: &str = r"
if redis.call('exists', KEYS[1]) == 0 then return {-1} end
return {1, redis.call('hincrby', KEYS[1], 'quantity', ARGV[1])}";

/// Stock in a Redis server (standalone `redis://` URL).
#[derive(Clone)]
pub struct RedisStockStore {
    connection: MultiplexedConnection,
}

impl std::fmt::Debug for RedisStockStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStockStore").finish_non_exhaustive()
    }
}

/// A refused login or command is [`Error::NotAuthorized`], as on the lock backend; anything
/// else [`Error::Backend`].
fn redis_error(operation: &'static str) -> impl FnOnce(redis::RedisError) -> Error {
    move |e| {
        crate::redis::refused(operation, &e).unwrap_or_else(|| Error::backend(SCHEME, operation, e))
    }
}

fn key(item: &str) -> String {
    // The braces make the item the hash tag, so an item's key has one slot on a Cluster.
    format!("distlock:stock:{{{item}}}")
}

impl RedisStockStore {
    /// Connects to the server a `redis://` URL names.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a malformed URL; [`Error::NotAuthorized`] when the server
    /// refuses the URL's login (or asks for one); [`Error::Backend`] when it cannot be reached.
    pub async fn connect(url: &str) -> Result<Self> {
        let client = redis::Client::open(url).map_err(|e| {
            Error::invalid(
                "URL",
                format!(
                    "{:?}: {e}; write redis://[user:password@]host[:port][/db]",
                    crate::redact::shown(url)
                ),
            )
        })?;
        // The lock backend's timeouts, not the driver's defaults: a reply slower than half a
        // second under load is not a lost one.
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(crate::redis::deployment::CONNECT_TIMEOUT))
            .set_response_timeout(Some(crate::redis::deployment::RESPONSE_TIMEOUT));
        let connection = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(redis_error("connect"))?;
        let mut store = RedisStockStore { connection };
        // A server that wants a password the URL did not give answers NOAUTH to any command:
        // ask once, so that connecting says so rather than the first order.
        let _: String = redis::cmd("PING")
            .query_async(&mut store.connection)
            .await
            .map_err(redis_error("connect"))?;
        Ok(store)
    }

    /// Runs one of the scripts: its status (1, 0 or -1) and value.
    async fn run(
        &self,
        script: &str,
        item: &str,
        args: &[u64],
        operation: &'static str,
    ) -> Result<(i64, i64)> {
        let script = Script::new(script);
        let mut invocation = script.key(key(item));
        for arg in args {
            invocation.arg(*arg);
        }
        let reply: Vec<i64> = invocation
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(redis_error(operation))?;
        Ok((
            reply.first().copied().unwrap_or(-1),
            reply.get(1).copied().unwrap_or(0),
        ))
    }
}

fn to_u64(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

#[async_trait]
impl StockStore for RedisStockStore {
    fn kind(&self) -> &'static str {
        SCHEME
    }

    async fn set(&self, item: &str, quantity: u64) -> Result<()> {
        redis::cmd("HSET")
            .arg(key(item))
            .arg("quantity")
            .arg(quantity)
            .arg("fence")
            .arg(0)
            .exec_async(&mut self.connection.clone())
            .await
            .map_err(redis_error("set the stock"))
    }

    async fn remove(&self, item: &str) -> Result<bool> {
        let deleted: i64 = redis::cmd("DEL")
            .arg(key(item))
            .query_async(&mut self.connection.clone())
            .await
            .map_err(redis_error("remove an item"))?;
        Ok(deleted > 0)
    }

    async fn quantity(&self, item: &str) -> Result<u64> {
        let quantity: Option<i64> = redis::cmd("HGET")
            .arg(key(item))
            .arg("quantity")
            .query_async(&mut self.connection.clone())
            .await
            .map_err(redis_error("read the stock"))?;
        quantity.map(to_u64).ok_or_else(|| missing_item(item))
    }

    async fn read_fenced(&self, item: &str, token: u64) -> Result<u64> {
        match self
            .run(READ_FENCED, item, &[token], "read the stock")
            .await?
        {
            (1, quantity) => Ok(to_u64(quantity)),
            (0, newest) => Err(fenced(item, token, to_u64(newest))),
            _ => Err(missing_item(item)),
        }
    }

    async fn write_fenced(&self, item: &str, quantity: u64, token: u64) -> Result<()> {
        match self
            .run(WRITE_FENCED, item, &[token, quantity], "write the stock")
            .await?
        {
            (1, _) => Ok(()),
            (0, newest) => Err(fenced(item, token, to_u64(newest))),
            _ => Err(missing_item(item)),
        }
    }

    async fn take_atomic(&self, item: &str, n: u64) -> Result<Taken> {
        match self.run(TAKE, item, &[n], "take stock").await? {
            (1, remaining) => Ok(Taken::Taken {
                remaining: to_u64(remaining),
            }),
            (0, available) => Ok(Taken::SoldOut {
                available: to_u64(available),
            }),
            _ => Err(missing_item(item)),
        }
    }

    async fn add_atomic(&self, item: &str, n: u64) -> Result<u64> {
        match self.run(ADD, item, &[n], "restock").await? {
            (1, total) => Ok(to_u64(total)),
            _ => Err(missing_item(item)),
        }
    }

    async fn take_spread(&self, items: &[String], n: u64) -> Result<Spread> {
        let script = Script::new(TAKE_SPREAD);
        let mut invocation = script.prepare_invoke();
        for item in items {
            invocation.key(key(item));
        }
        invocation.arg(n);
        let reply: Vec<i64> = invocation
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(redis_error("take stock from several items"))?;
        match reply.first() {
            Some(1) if reply.len() == 1 + 2 * items.len() => Ok(Spread {
                quantities: reply[1..].iter().step_by(2).map(|&q| to_u64(q)).collect(),
                parts: reply[2..].iter().step_by(2).map(|&p| to_u64(p)).collect(),
            }),
            Some(-1) => {
                let i = reply.get(1).and_then(|&i| usize::try_from(i - 1).ok());
                Err(missing_item(
                    i.and_then(|i| items.get(i)).map_or("?", |s| s),
                ))
            }
            _ => Err(Error::backend(
                SCHEME,
                "take stock from several items",
                format!("the script answered {reply:?}"),
            )),
        }
    }
}
