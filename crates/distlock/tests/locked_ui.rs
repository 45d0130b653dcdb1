//! The compile errors of `#[distlock::locked]`: every case in `tests/locked/ui/` must fail
//! to compile with the message in its `.stderr` file, pointing at the option at fault.

#[test]
fn locked_compile_errors() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/locked/ui/*.rs");
    // rustc names a type by its whole path when another type of the same name exists: with
    // the `blocking` feature, `blocking::Locks` makes `Locks` read `distlock::Locks`.
    #[cfg(feature = "blocking")]
    cases.compile_fail("tests/locked/ui/with-blocking/*.rs");
    #[cfg(not(feature = "blocking"))]
    cases.compile_fail("tests/locked/ui/without-blocking/*.rs");
}
