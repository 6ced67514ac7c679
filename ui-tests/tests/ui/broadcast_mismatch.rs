use autofusion::prelude::*;

#[fused_graph(dims(D = 8, F = 32))]
fn g(x: Tensor<f32, {[S, D]}>, b: Tensor<f32, {[F]}>) -> Tensor<f32, {[S, D]}> {
    x + b
}

fn main() {}
