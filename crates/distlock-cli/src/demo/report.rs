//! What the overselling demo reports: one row per strategy, as a table or as JSON.

use serde::Serialize;

use super::stock::OPTIMISTIC_ATTEMPTS;
use super::strategy::Strategy;
use super::worker::WorkerReport;
use crate::cli::DemoArgs;
use crate::failure::{CliResult, Failure};

/// The demo's settings, at the top level of its JSON report.
#[derive(Debug, Serialize)]
pub struct Settings {
    pub workers: u32,
    pub tasks_per_worker: u32,
    pub orders: u64,
    pub stock: u64,
    pub hold_ms: u64,
}

impl Settings {
    pub fn of(args: &DemoArgs) -> Self {
        Settings {
            workers: args.workers,
            tasks_per_worker: args.tasks,
            orders: args.orders,
            stock: args.stock,
            hold_ms: args.hold_ms,
        }
    }
}

/// One row of the table.
#[derive(Debug, Serialize)]
pub struct Outcome {
    pub strategy: Strategy,
    pub description: String,
    pub orders: u64,
    pub accepted: u64,
    /// Refused for lack of stock.
    pub refused: u64,
    /// Refused after every optimistic attempt lost its race (stock was left).
    pub gave_up: u64,
    pub errors: u64,
    pub initial_stock: u64,
    pub final_stock: i64,
    /// Units sold beyond the initial stock.
    pub oversold: u64,
    /// Sales the stock does not show: accepted - (initial - final).
    pub lost_updates: i64,
    pub orders_per_s: f64,
    pub elapsed_s: f64,
    /// Sold + remaining = initial, and nothing oversold.
    pub exact: bool,
}

impl Outcome {
    /// Adds up the workers' reports of one strategy's run; fails with the first error a
    /// worker met.
    pub fn tally(
        strategy: Strategy,
        args: &DemoArgs,
        reports: &[WorkerReport],
        final_stock: i64,
        elapsed_s: f64,
    ) -> CliResult<Self> {
        let initial = i64::try_from(args.stock).map_err(Failure::usage)?;
        let accepted: u64 = reports.iter().map(|r| r.accepted).sum();
        let refused: u64 = reports.iter().map(|r| r.refused).sum();
        let gave_up: u64 = reports.iter().map(|r| r.gave_up).sum();
        let errors: u64 = reports.iter().map(|r| r.errors).sum();
        if let Some(error) = reports.iter().find_map(|r| r.first_error.as_ref()) {
            return Err(Failure::failed(format!(
                "strategy {strategy}: {errors} orders failed; the first: {error}"
            )));
        }
        let accepted_signed = i64::try_from(accepted).unwrap_or(i64::MAX);
        let lost_updates = accepted_signed - (initial - final_stock);
        let oversold = accepted.saturating_sub(args.stock);
        Ok(Outcome {
            strategy,
            description: strategy.description().to_owned(),
            orders: args.orders,
            accepted,
            refused,
            gave_up,
            errors,
            initial_stock: args.stock,
            final_stock,
            oversold,
            lost_updates,
            orders_per_s: (accepted + refused + gave_up) as f64 / elapsed_s.max(1e-9),
            elapsed_s,
            exact: oversold == 0 && lost_updates == 0 && final_stock >= 0,
        })
    }
}

/// The settings line and the table's header.
pub fn print_header(args: &DemoArgs) {
    println!(
        "{} worker processes x {} buyers, {} orders of 1 unit, stock {}, {} ms critical section\n",
        args.workers, args.tasks, args.orders, args.stock, args.hold_ms
    );
    println!(
        "{:<18} {:>7} {:>9} {:>8} {:>12} {:>9} {:>13} {:>9}  verdict",
        "strategy",
        "orders",
        "accepted",
        "gave up",
        "final stock",
        "oversold",
        "lost updates",
        "orders/s"
    );
}

pub fn print_row(o: &Outcome) {
    let verdict = if o.exact {
        "exact"
    } else if o.oversold > 0 {
        "OVERSOLD"
    } else {
        "LOST UPDATES"
    };
    println!(
        "{:<18} {:>7} {:>9} {:>8} {:>12} {:>9} {:>13} {:>9.0}  {verdict}",
        o.strategy,
        o.orders,
        o.accepted,
        o.gave_up,
        o.final_stock,
        o.oversold,
        o.lost_updates,
        o.orders_per_s
    );
}

pub fn print_unavailable(strategy: Strategy, reason: &str) {
    println!("{strategy:<18} unavailable: {reason}");
}

/// What the table's columns mean.
pub fn print_legend() {
    println!(
        "\noversold: units sold beyond the stock. lost updates: sales the stock does not show.\n\
         gave up: orders refused after {OPTIMISTIC_ATTEMPTS} lost races (optimistic only), with stock left."
    );
}
