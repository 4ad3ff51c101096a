//! Nothing here: the handler shapes that must compile are the examples
//! (`examples/*.rs`). The misuse that must not compile is in `tests-build`.
