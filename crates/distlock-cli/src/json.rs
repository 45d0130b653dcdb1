//! What `--json` prints for `demo`, `demo hot-item`, `bench` and `status`: one object on one
//! line, `command` first (the command's words, e.g. `"demo hot-item"`).
//!
//! A command that reports rows (`demo`, `demo hot-item`, `bench`) prints its settings, then
//! `results` (one object per row) and `unavailable` (what could not run, and why); both
//! arrays are always present. `status` prints its answer's fields.

use serde::Serialize;

use crate::failure::{CliResult, Failure};

/// A strategy that could not run, and why.
#[derive(Debug, Serialize)]
pub struct Unavailable {
    /// The strategy's name on the command line.
    pub strategy: String,
    pub reason: String,
}

/// The report of a command that reports rows.
#[derive(Debug, Serialize)]
struct Rows<'a, S, R> {
    command: &'static str,
    #[serde(flatten)]
    settings: &'a S,
    results: &'a [R],
    unavailable: &'a [Unavailable],
}

/// The answer of a command that reports one fact.
#[derive(Debug, Serialize)]
struct Fact<'a, F> {
    command: &'static str,
    #[serde(flatten)]
    fields: &'a F,
}

/// Prints the rows of `command`, after its `settings` (a struct whose fields go to the top
/// level).
pub fn print_rows<S: Serialize, R: Serialize>(
    command: &'static str,
    settings: &S,
    results: &[R],
    unavailable: &[Unavailable],
) -> CliResult {
    print(&Rows {
        command,
        settings,
        results,
        unavailable,
    })
}

/// Prints the answer of `command`: `fields` (a struct) at the top level.
pub fn print_fact<F: Serialize>(command: &'static str, fields: &F) -> CliResult {
    print(&Fact { command, fields })
}

fn print<T: Serialize>(report: &T) -> CliResult {
    let line = serde_json::to_string(report)
        .map_err(|e| Failure::failed(format!("cannot encode the report: {e}")))?;
    println!("{line}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Settings {
        stock: u64,
    }

    #[derive(Serialize)]
    struct Row {
        strategy: &'static str,
    }

    #[test]
    fn rows_put_the_command_and_the_settings_at_the_top_level() {
        let report = Rows {
            command: "demo",
            settings: &Settings { stock: 5 },
            results: &[Row { strategy: "none" }],
            unavailable: &[Unavailable {
                strategy: "redis".to_owned(),
                reason: "refused".to_owned(),
            }],
        };
        assert_eq!(
            serde_json::to_string(&report).unwrap(),
            r#"{"command":"demo","stock":5,"results":[{"strategy":"none"}],"unavailable":[{"strategy":"redis","reason":"refused"}]}"#
        );
    }

    #[test]
    fn a_fact_is_its_fields_after_the_command() {
        let fact = Fact {
            command: "status",
            fields: &Settings { stock: 1 },
        };
        assert_eq!(
            serde_json::to_string(&fact).unwrap(),
            r#"{"command":"status","stock":1}"#
        );
    }
}
