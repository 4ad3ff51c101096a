//! Nothing here: the compile tests are in `tests/ui.rs`, the cases in `tests/ui/`.
