use autofusion::prelude::*;

#[fused_graph(dims(D = 8))]
fn g(x: Tensor<f32, {[S, D]}>) -> Tensor<f32, {[S, D]}> {
    let mut h = x;
    for _ in 0..2 {
        h = silu(h);
    }
    h
}

fn main() {}
