use autofusion::prelude::*;

#[fused_graph(dims(D = 8))]
fn g(x: Tensor<f32, {[S, D]}>, x: Tensor<f32, {[S, D]}>) -> Tensor<f32, {[S, D]}> {
    x + x
}

fn main() {}
