#![allow(dead_code)]
use autofusion::prelude::*;

// build.rs compiled a different graph under this name (tests/ui.rs sets the env var that
// build.rs would have set, with another hash).
#[fused_graph(dims(D = 8))]
fn stale_graph(x: Tensor<f32, {[S, D]}>) -> Tensor<f32, {[S, D]}> {
    silu(x)
}

fn main() {}
