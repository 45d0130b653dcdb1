//! Concert tickets over HTTP, first come first served, across several processes.
//!
//! `POST /concerts/{id}/orders` sells one ticket under a distlock lock named after the
//! concert (`#[distlock::locked]` on [`Shop::order`]); the stock lives in the backend's own
//! store and every write carries the lock's fencing token. `PUT /concerts/{id}` with
//! `{"tickets": 100}` puts tickets on sale; `GET /concerts/{id}` says how many are left.
//!
//! ```text
//! cargo run -p tickets -- --port 8080                      # SQLite file ./tickets.db
//! cargo run -p tickets -- --port 8081 --backend redis://127.0.0.1:6379/
//! curl -X PUT localhost:8080/concerts/7 -H 'content-type: application/json' -d '{"tickets":100}'
//! curl -X POST localhost:8080/concerts/7/orders -H 'content-type: application/json' -d '{"buyer":"ann"}'
//! curl localhost:8081/concerts/7
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Parser;
use distlock::Locks;
use distlock::stock::StockStore;
use serde::{Deserialize, Serialize};

/// The ticket service.
#[derive(Debug, Parser)]
struct Args {
    /// The port on 127.0.0.1 to listen on (0 picks a free one; the address is printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// The lock backend: sqlite://FILE (default), redis://, postgres:// or zk://.
    #[arg(long, default_value = "sqlite://tickets.db")]
    backend: String,
    /// Where the stock lives: the lock backend's own store by default (an SQLite file,
    /// Redis, PostgreSQL); a Redis URL for ZooKeeper, which keeps no stock.
    #[arg(long)]
    store: Option<String>,
    /// Sell without the lock (a read and a write with a pause between, as the seed's
    /// unprotected controller did): shows the overselling the lock prevents.
    #[arg(long)]
    no_lock: bool,
    /// Milliseconds between reading the stock and writing it back (the work an order does
    /// under the lock: payment, seat assignment).
    #[arg(long, default_value_t = 1)]
    work_ms: u64,
    /// Seconds an order waits for the concert's lock before it is answered 503.
    #[arg(long, default_value_t = 60)]
    wait_s: u64,
}

/// An order as it arrives: the concert from the path, the buyer from the body.
#[derive(Debug)]
struct Order {
    concert_id: u64,
    buyer: String,
}

#[derive(Debug, Deserialize)]
struct OrderBody {
    buyer: String,
}

#[derive(Debug, Deserialize)]
struct OnSale {
    tickets: u64,
}

#[derive(Debug, Serialize)]
struct Receipt {
    concert: u64,
    buyer: String,
    /// Tickets left after this one.
    left: u64,
    /// The grant's fencing token the write carried (0 without the lock).
    fencing_token: u64,
}

/// What can go wrong with an order, and its HTTP answer.
#[derive(Debug)]
enum ShopError {
    SoldOut,
    /// The lock could not be had in time (the service is overloaded): try again.
    Busy,
    Lock(distlock::Error),
}

impl From<distlock::Error> for ShopError {
    fn from(error: distlock::Error) -> Self {
        if error.is_timeout() {
            ShopError::Busy
        } else {
            ShopError::Lock(error)
        }
    }
}

impl IntoResponse for ShopError {
    fn into_response(self) -> Response {
        let (status, message) = match self {
            ShopError::SoldOut => (StatusCode::CONFLICT, "sold out".to_owned()),
            ShopError::Busy => (
                StatusCode::SERVICE_UNAVAILABLE,
                "busy: try again".to_owned(),
            ),
            ShopError::Lock(error) => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
        };
        (status, Json(serde_json::json!({ "error": message }))).into_response()
    }
}

/// The service's state: the locks, the stock store, and how to sell.
struct Shop {
    locks: Locks,
    store: Arc<dyn StockStore>,
    work: Duration,
    /// How long an order waits for the lock.
    wait: Duration,
}

fn item(concert_id: u64) -> String {
    format!("concert:{concert_id}")
}

impl Shop {
    /// Sells one ticket: read the stock, do the order's work, write the stock back, all
    /// under the concert's lock, every store access fenced by the grant's token.
    #[distlock::locked(locks = self.locks, name = "concert:{order.concert_id}", wait = self.wait, token = token)]
    async fn order(&self, order: Order) -> Result<Receipt, ShopError> {
        let item = item(order.concert_id);
        let left = self.store.read_fenced(&item, token).await?;
        if left == 0 {
            return Err(ShopError::SoldOut);
        }
        tokio::time::sleep(self.work).await;
        self.store.write_fenced(&item, left - 1, token).await?;
        Ok(Receipt {
            concert: order.concert_id,
            buyer: order.buyer,
            left: left - 1,
            fencing_token: token,
        })
    }

    /// Puts `tickets` on sale, under the concert's lock so that it never lands between an
    /// order's read and write. Setting the stock starts the item's fencing history anew.
    #[distlock::locked(locks = self.locks, name = "concert:{concert_id}", wait = "60s")]
    async fn put_on_sale(&self, concert_id: u64, tickets: u64) -> Result<(), ShopError> {
        self.store.set(&item(concert_id), tickets).await?;
        Ok(())
    }

    /// The same without the lock: two orders that read the same stock both sell.
    async fn order_unlocked(&self, order: Order) -> Result<Receipt, ShopError> {
        let item = item(order.concert_id);
        let left = self.store.quantity(&item).await?;
        if left == 0 {
            return Err(ShopError::SoldOut);
        }
        tokio::time::sleep(self.work).await;
        self.store.set(&item, left - 1).await?;
        Ok(Receipt {
            concert: order.concert_id,
            buyer: order.buyer,
            left: left - 1,
            fencing_token: 0,
        })
    }
}

struct App {
    shop: Shop,
    no_lock: bool,
}

async fn place_order(
    State(app): State<Arc<App>>,
    Path(concert_id): Path<u64>,
    Json(body): Json<OrderBody>,
) -> Result<(StatusCode, Json<Receipt>), ShopError> {
    let order = Order {
        concert_id,
        buyer: body.buyer,
    };
    let receipt = if app.no_lock {
        app.shop.order_unlocked(order).await?
    } else {
        app.shop.order(order).await?
    };
    Ok((StatusCode::CREATED, Json(receipt)))
}

async fn put_on_sale(
    State(app): State<Arc<App>>,
    Path(concert_id): Path<u64>,
    Json(sale): Json<OnSale>,
) -> Result<StatusCode, ShopError> {
    app.shop.put_on_sale(concert_id, sale.tickets).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn show(
    State(app): State<Arc<App>>,
    Path(concert_id): Path<u64>,
) -> Result<Json<serde_json::Value>, ShopError> {
    let left = app.shop.store.quantity(&item(concert_id)).await?;
    Ok(Json(
        serde_json::json!({ "concert": concert_id, "left": left }),
    ))
}

/// The stock store for a URL: the lock backend's own store where it has one.
async fn open_store(url: &str) -> Result<Arc<dyn StockStore>, String> {
    let scheme = url.split("://").next().unwrap_or_default();
    match scheme {
        "sqlite" => {
            let path = url.trim_start_matches("sqlite://");
            let path = path.split('?').next().unwrap_or(path);
            let store = distlock::stock::SqliteStockStore::open(format!("{path}.stock"))
                .map_err(|e| e.to_string())?;
            Ok(Arc::new(store))
        }
        #[cfg(feature = "redis")]
        "redis" => {
            let store = distlock::stock::RedisStockStore::connect(url)
                .await
                .map_err(|e| e.to_string())?;
            Ok(Arc::new(store))
        }
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => {
            let store = distlock::stock::SqlStockStore::connect(url, 8)
                .await
                .map_err(|e| e.to_string())?;
            Ok(Arc::new(store))
        }
        "zk" => Err("ZooKeeper keeps no stock: give --store redis://...".to_owned()),
        other => Err(format!(
            "no stock store for {other}://; give --store with sqlite://, redis:// or postgres://"
        )),
    }
}

async fn serve(args: Args) -> Result<(), String> {
    let locks = distlock::connect(&args.backend)
        .await
        .map_err(|e| e.to_string())?;
    let store = open_store(args.store.as_deref().unwrap_or(&args.backend)).await?;
    let app = Arc::new(App {
        shop: Shop {
            locks,
            store,
            work: Duration::from_millis(args.work_ms),
            wait: Duration::from_secs(args.wait_s),
        },
        no_lock: args.no_lock,
    });
    let router = Router::new()
        .route("/concerts/{id}", get(show).put(put_on_sale))
        .route("/concerts/{id}/orders", post(place_order))
        .with_state(app);
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], args.port)))
        .await
        .map_err(|e| format!("cannot listen on port {}: {e}", args.port))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    println!("listening on http://{local}");
    axum::serve(listener, router)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match serve(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tickets: error: {error}");
            std::process::ExitCode::from(1)
        }
    }
}
