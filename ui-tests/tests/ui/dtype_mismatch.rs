use autofusion::prelude::*;

#[fused_graph(dims(D = 8))]
fn g(x: Tensor<f16, {[S, D]}>, r: Tensor<f32, {[S, D]}>) -> Tensor<f32, {[S, D]}> {
    x + r
}

fn main() {}
