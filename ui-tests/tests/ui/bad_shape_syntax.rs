use autofusion::prelude::*;

#[fused_graph(dims(D = 8))]
fn g(x: Tensor<f32, D>) -> Tensor<f64, {[S, D]}> {
    x
}

fn main() {}
