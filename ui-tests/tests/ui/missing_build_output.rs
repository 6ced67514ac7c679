#![allow(dead_code)]
use autofusion::prelude::*;

// A valid graph in a crate whose build.rs did not compile it.
#[fused_graph(dims(D = 8))]
fn not_built(x: Tensor<f32, {[S, D]}>) -> Tensor<f32, {[S, D]}> {
    silu(x)
}

fn main() {}
