use autofusion::prelude::*;

#[fused_graph(dims(D = 8), opt_level = 7)]
fn g(x: Tensor<f32, {[S, D]}>) -> Tensor<f32, {[S, D]}> {
    silu(x)
}

fn main() {}
