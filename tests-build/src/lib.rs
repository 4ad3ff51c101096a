//! Nothing here: the compile tests of misuse are in `tests/ui.rs`, their cases in
//! `tests/ui/fail/`. The handler shapes that must compile are in `tests-shapes`.
