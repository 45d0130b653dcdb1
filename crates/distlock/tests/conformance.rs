//! The conformance suite on every backend compiled into this crate.

use distlock::conformance::Target;

fn memory() -> Target {
    // A named store, so that the two clients a case connects share it.
    Target::new(format!("memory://{}", uuid_like()))
}

#[cfg(feature = "sqlite")]
fn sqlite() -> Target {
    let dir = tempfile::tempdir().expect("temporary directory");
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    Target::with_resource(url, dir)
}

fn uuid_like() -> String {
    format!("conformance-{}-{}", std::process::id(), fastrand::u64(..))
}

distlock::conformance_suite!(memory, memory());
#[cfg(feature = "sqlite")]
distlock::conformance_suite!(sqlite, sqlite());
