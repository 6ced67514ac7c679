use autofusion::prelude::*;

#[fused_graph(dims(D = 8))]
fn g(x: Tensor<f32, {[S, D]}>, gamma: Tensor<f32, {[D, D]}>) -> Tensor<f32, {[S, D]}> {
    rms_norm(x, gamma, 1e-6)
}

fn main() {}
