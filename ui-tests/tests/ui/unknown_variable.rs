use autofusion::prelude::*;

#[fused_graph(dims(D = 8))]
fn g(x: Tensor<f32, {[S, D]}>, bias: Tensor<f32, {[D]}>) -> Tensor<f32, {[S, D]}> {
    let h = x + bais;
    h
}

fn main() {}
