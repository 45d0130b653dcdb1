//! The compile errors of `#[distlock::locked]`: every case in `tests/locked/ui/` must fail
//! to compile with the message in its `.stderr` file, pointing at the option at fault.

#[test]
fn locked_compile_errors() {
    trybuild::TestCases::new().compile_fail("tests/locked/ui/*.rs");
}
