//! The demo crate: a user crate with its own build.rs compiling fused layers.

pub mod layers;
