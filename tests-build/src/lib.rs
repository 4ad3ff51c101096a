//! Nothing here: the shapes that must compile are the examples (`examples/*.rs`), and
//! the compile tests of misuse are in `tests/ui.rs`, their cases in `tests/ui/fail/`.
