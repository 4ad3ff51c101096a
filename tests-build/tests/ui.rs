//! Compile tests: supported handler shapes compile cleanly, misuse fails with the
//! errors under `tests/ui/fail/*.stderr`. Regenerate those with `TRYBUILD=overwrite` and
//! read the diff: the messages are part of the product.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass/*.rs");
    cases.compile_fail("tests/ui/fail/*.rs");
}
