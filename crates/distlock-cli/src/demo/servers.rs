//! The demo's server flags (`--redis URL`, `--nats URL`, …): one for each server a lock
//! strategy of the registry uses ([`distlock::scheme::demo_servers`]), so that a backend's
//! strategy brings its flag with it. The stock databases are named by the same flags.

use std::collections::BTreeMap;

use clap::{Arg, ArgAction, ArgMatches, Args, Command, FromArgMatches};
use distlock::scheme::{DemoServer, demo_servers};

use super::strategy::{Database, Strategy};

/// The servers the demo's strategies use, by flag.
#[derive(Debug, Clone, Default)]
pub struct Servers {
    urls: BTreeMap<&'static str, String>,
}

impl Servers {
    /// The URL a flag gives (its default unless given); `None` for a flag no strategy has.
    pub fn url(&self, flag: &str) -> Option<&str> {
        self.urls.get(flag).map(String::as_str)
    }

    /// The URL of `server`.
    pub fn of(&self, server: &DemoServer) -> String {
        self.url(server.flag).unwrap_or(server.default).to_owned()
    }
}

/// The flag's help: what it is and which strategies use it.
fn help(server: &DemoServer) -> String {
    let users: Vec<String> = Strategy::all()
        .into_iter()
        .filter(|strategy| strategy.server_flags().contains(&server.flag))
        .map(|strategy| strategy.name().to_owned())
        .collect();
    let mut help = format!(
        "{} of the {} strategies",
        capitalized(server.what),
        users.join(", ")
    );
    if Database::Redis.server_flag() == Some(server.flag) {
        help.push_str(" (in hot-item, also the stock of the locks that keep none of their own)");
    }
    help
}

fn capitalized(text: &str) -> String {
    let mut chars = text.chars();
    chars
        .next()
        .map(|first| first.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

impl Args for Servers {
    fn augment_args(mut command: Command) -> Command {
        for server in demo_servers() {
            command = command.arg(
                Arg::new(server.flag)
                    .long(server.flag)
                    .value_name("URL")
                    .action(ArgAction::Set)
                    .value_parser(clap::value_parser!(String))
                    .default_value(server.default)
                    .help(help(server)),
            );
        }
        command
    }

    fn augment_args_for_update(command: Command) -> Command {
        Self::augment_args(command)
    }
}

impl FromArgMatches for Servers {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut servers = Servers::default();
        servers.update_from_arg_matches(matches)?;
        Ok(servers)
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        for server in demo_servers() {
            if let Some(url) = matches.get_one::<String>(server.flag) {
                self.urls.insert(server.flag, url.clone());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Demo {
        #[command(flatten)]
        servers: Servers,
    }

    #[test]
    fn every_server_of_the_registry_has_a_flag_with_its_default() {
        let given = demo_servers()[0];
        let flag = format!("--{}", given.flag);
        let demo = Demo::try_parse_from(["demo", flag.as_str(), "x://other:1/"]).unwrap();
        assert_eq!(demo.servers.url(given.flag), Some("x://other:1/"));
        for server in &demo_servers()[1..] {
            assert_eq!(demo.servers.url(server.flag), Some(server.default));
        }
    }

    #[test]
    fn every_stock_database_has_its_flag() {
        for database in Database::all() {
            if let Some(flag) = database.server_flag() {
                assert!(
                    demo_servers().iter().any(|server| server.flag == flag),
                    "no server flag --{flag} for the stock in {}",
                    database.name()
                );
            }
        }
    }
}
