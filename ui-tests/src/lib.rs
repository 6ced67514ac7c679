//! Nothing here: the tests are in `tests/ui.rs` and `tests/ui/`.
