use autofusion::prelude::*;

#[fused_graph(dims(D = 8))]
fn g(x: Tensor<f32, {[S, D]}>) -> Tensor<f32, {[S, D]}> {
    softmax(x)
}

fn main() {}
