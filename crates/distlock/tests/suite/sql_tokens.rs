//! Promise 3 for the session locks' fencing tokens, drawn from one sequence per database
//! (PostgreSQL; MariaDB) instead of a counter per name: a database whose per-name counters
//! were kept by earlier clients gets a sequence that starts above all of them, and tokens
//! grow across clients and across a client's reconnection.

use distlock::conformance::servers;
use sqlx::Connection;

/// The largest counter an earlier client left in the new database's `distlock_fencing`.
const EARLIER_TOKEN: i64 = 5_000_000_000;

/// Grants `name` once through a new client of `url` and returns its token.
async fn grant(url: &str, name: &str) -> u64 {
    let locks = distlock::connect(url).await.unwrap();
    let guard = locks.mutex(name).unwrap().try_acquire().await.unwrap();
    let guard = guard.expect("the lock was free");
    let token = guard.fencing_token();
    guard.release().await.unwrap();
    token
}

/// Two clients and a reconnected one take turns: every token is above the earlier counters
/// and above the one before it.
async fn tokens_grow_from(url: &str, name: &str) {
    let first = grant(url, name).await;
    assert!(
        first > EARLIER_TOKEN as u64,
        "{url}: the first token {first} is not above the earlier counter {EARLIER_TOKEN}"
    );
    let a = distlock::connect(url).await.unwrap();
    let b = distlock::connect(url).await.unwrap();
    let mut last = first;
    for round in 0..20 {
        let locks = if round % 2 == 0 { &a } else { &b };
        let guard = locks.mutex(name).unwrap().acquire().await.unwrap();
        let token = guard.fencing_token();
        assert!(token > last, "{url}: token {token} after {last}");
        last = token;
        guard.release().await.unwrap();
    }
    let again = grant(url, name).await;
    assert!(
        again > last,
        "{url}: token {again} after reconnecting, {last} before"
    );
}

/// PostgreSQL: a schema of its own (through `search_path`) with an earlier client's counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise3_postgres_sequence_starts_above_the_earlier_counters() {
    let url = servers::POSTGRES.url();
    let schema = format!("tokens_{}", uuid::Uuid::new_v4().simple());
    let mut admin = sqlx::PgConnection::connect(&url).await.unwrap();
    for statement in [
        format!("CREATE SCHEMA {schema}"),
        format!(
            "CREATE TABLE {schema}.distlock_fencing (name text PRIMARY KEY, last_token bigint NOT NULL)"
        ),
        format!("INSERT INTO {schema}.distlock_fencing VALUES ('earlier', {EARLIER_TOKEN})"),
    ] {
        sqlx::query(&statement).execute(&mut admin).await.unwrap();
    }
    let scoped = servers::with_query(&url, &format!("options[search_path]={schema}"));
    tokens_grow_from(&scoped, "earlier").await;
    // The sequence was made in that schema, once.
    let (sequences,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM pg_sequences WHERE schemaname = $1 AND sequencename = 'distlock_token_seq'",
    )
    .bind(&schema)
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!(sequences, 1);
    sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
        .execute(&mut admin)
        .await
        .unwrap();
}

/// MariaDB: a database of its own with an earlier client's counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promise3_mariadb_sequence_starts_above_the_earlier_counters() {
    let url = servers::MYSQL.url();
    let database = format!("tokens_{}", uuid::Uuid::new_v4().simple());
    let mut admin = sqlx::MySqlConnection::connect(&url).await.unwrap();
    let (version,): (String,) = sqlx::query_as("SELECT VERSION()")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert!(
        version.contains("MariaDB"),
        "this test checks MariaDB's sequence; the server is {version}"
    );
    for statement in [
        format!("CREATE DATABASE {database}"),
        format!(
            "CREATE TABLE {database}.distlock_fencing (name VARBINARY(1024) NOT NULL PRIMARY KEY, \
             last_token BIGINT NOT NULL) ENGINE = InnoDB"
        ),
        format!("INSERT INTO {database}.distlock_fencing VALUES ('earlier', {EARLIER_TOKEN})"),
    ] {
        sqlx::raw_sql(&statement).execute(&mut admin).await.unwrap();
    }
    let base = url.rsplit_once('/').map_or(url.as_str(), |(base, _)| base);
    let scoped = format!("{base}/{database}");
    tokens_grow_from(&scoped, "earlier").await;
    sqlx::raw_sql(&format!("DROP DATABASE {database}"))
        .execute(&mut admin)
        .await
        .unwrap();
}
