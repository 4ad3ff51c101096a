//! Compile tests: misuse fails with the errors under `tests/ui/fail/*.stderr`.
//! Regenerate those with `TRYBUILD=overwrite` and read the diff: the messages are part
//! of the product. The shapes that must compile are the examples of `tests-shapes`,
//! which `cargo clippy --workspace --all-targets` checks: trybuild would build every
//! dependency again, with code generation, to build them.

#[test]
fn ui() {
    trybuild::TestCases::new().compile_fail("tests/ui/fail/*.rs");
}
