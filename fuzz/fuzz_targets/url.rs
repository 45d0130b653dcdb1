//! Any string as a backend URL: `distlock::validate_url` answers Ok or a typed error,
//! never a panic, and agrees with the registry about the scheme; `distlock::redact_url`
//! never panics (what it keeps is checked by `redact`'s property test).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(url) = std::str::from_utf8(data) else {
        return;
    };
    let _ = distlock::redact_url(url);
    match distlock::validate_url(url) {
        Ok(scheme) => {
            assert!(url.starts_with(&format!("{}://", scheme.name)), "{url:?}");
            assert!(scheme.is_available(), "{url:?}");
        }
        Err(error) => {
            assert!(
                error.is_invalid_input() || error.is_unsupported(),
                "{url:?}: {error}"
            );
            assert!(!error.to_string().is_empty());
        }
    }
});
