//! Maintenance tasks of the distlock workspace, run with `cargo run -p xtask -- TASK`.
//!
//! * `codegen`: regenerates the Rust code of etcd's API (`crates/distlock/src/etcd/api/*.rs`)
//!   from the `.proto` files beside it, with a protobuf compiler written in Rust (`protox`),
//!   so that neither this task nor a build of distlock needs `protoc`. The test of this crate
//!   regenerates into a temporary folder and fails when the committed code differs.
//! * `public-api`: writes the public API of `distlock`, one line per item, to `docs/api.txt`
//!   ([`public_api`]); the test of this crate fails when the committed listing differs.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

mod public_api;

/// Where the etcd API's `.proto` files and their generated Rust code live.
fn etcd_api_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../distlock/src/etcd/api")
}

/// The workspace's target directory, where `public-api` has rustdoc write its JSON.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"))
}

/// The `.proto` files compiled, relative to [`etcd_api_dir`]; those they import come along.
const ETCD_PROTOS: &[&str] = &["rpc.proto"];

/// Writes the Rust code of etcd's API into `out`: the messages of every package and a client
/// (no server, no transport: the backend makes its own channel) for every service.
fn generate_etcd_api(out: &Path) -> Result<(), String> {
    let dir = etcd_api_dir();
    let files = protox::compile(ETCD_PROTOS, [&dir])
        .map_err(|e| format!("compiling the .proto files in {}: {e}", dir.display()))?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_transport(false)
        // They carry a password and a token: their `Debug` is written by hand, hiding them.
        .skip_debug([
            ".etcdserverpb.AuthenticateRequest",
            ".etcdserverpb.AuthenticateResponse",
        ])
        .out_dir(out)
        .compile_fds(files)
        .map_err(|e| format!("generating Rust code into {}: {e}", out.display()))
}

fn main() -> ExitCode {
    let task = std::env::args().nth(1);
    let result = match task.as_deref() {
        Some("codegen") => generate_etcd_api(&etcd_api_dir()),
        Some("public-api") => public_api::current(&target_dir()).and_then(|listing| {
            let file = public_api::api_file();
            std::fs::write(&file, listing).map_err(|e| format!("writing {file:?}: {e}"))
        }),
        _ => Err("usage: cargo run -p xtask -- codegen | public-api".to_owned()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("xtask: {error}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The generated files, one per protobuf package.
    const ETCD_GENERATED: &[&str] = &["etcdserverpb.rs", "mvccpb.rs"];

    #[test]
    fn the_committed_etcd_api_code_is_what_the_proto_files_generate() {
        let out = tempfile::tempdir().expect("a temporary folder");
        generate_etcd_api(out.path()).expect("generating the etcd API");
        let mut made: Vec<String> = std::fs::read_dir(out.path())
            .expect("the generated files")
            .map(|entry| {
                entry
                    .expect("a generated file")
                    .file_name()
                    .to_string_lossy()
                    .into()
            })
            .collect();
        made.sort();
        assert_eq!(
            made, ETCD_GENERATED,
            "the generated files changed: update ETCD_GENERATED"
        );
        for file in ETCD_GENERATED {
            let fresh = std::fs::read_to_string(out.path().join(file)).expect("generated code");
            let committed = std::fs::read_to_string(etcd_api_dir().join(file)).unwrap_or_default();
            assert!(
                fresh == committed,
                "crates/distlock/src/etcd/api/{file} is not what its .proto files generate: \
                 run `cargo run -p xtask -- codegen` and commit the result"
            );
        }
    }

    #[test]
    fn the_committed_public_api_is_the_crates() {
        let made = public_api::current(&target_dir()).expect("the public API from rustdoc");
        let file = public_api::api_file();
        let committed = std::fs::read_to_string(&file).expect("docs/api.txt");
        if made != committed {
            let added: Vec<&str> = made
                .lines()
                .filter(|l| !committed.lines().any(|c| c == *l))
                .collect();
            let removed: Vec<&str> = committed
                .lines()
                .filter(|l| !made.lines().any(|m| m == *l))
                .collect();
            panic!(
                "the public API differs from {file:?}; if the change is meant, run \
                 `cargo run -p xtask -- public-api` and commit it\nadded:\n  {}\nremoved:\n  {}",
                added.join("\n  "),
                removed.join("\n  ")
            );
        }
    }
}
