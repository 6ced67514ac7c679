use autofusion::prelude::*;

// `where_` takes a bool condition and two branches of one type.
#[fused_graph(dims(D = 8))]
fn g(
    x: Tensor<f32, {[S, D]}>,
    mask: Tensor<i64, {[S, D]}>,
) -> (Tensor<f32, {[S, D]}>, Tensor<f32, {[S, D]}>) {
    let a = where_(mask, x, 0.0);
    let b = where_(mask == 1, x, mask);
    (a, b)
}

fn main() {}
