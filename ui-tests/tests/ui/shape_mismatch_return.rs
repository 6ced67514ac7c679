use autofusion::prelude::*;

#[fused_graph(dims(D = 8, F = 32))]
fn g(x: Tensor<f32, {[S, D]}>, w: Tensor<f32, {[D, F]}>) -> Tensor<f32, {[S, D]}> {
    matmul(x, w)
}

fn main() {}
