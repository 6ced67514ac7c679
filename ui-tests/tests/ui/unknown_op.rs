use autofusion::prelude::*;

#[fused_graph(dims(D = 8))]
fn g(x: Tensor<f32, {[S, D]}>, gamma: Tensor<f32, {[D]}>, beta: Tensor<f32, {[D]}>) -> Tensor<f32, {[S, D]}> {
    layer_nrom(x, gamma, beta, 1e-5)
}

fn main() {}
