use autofusion::prelude::*;

// The ids of a gather are integers; the axis is within the table's rank.
#[fused_graph(dims(V = 50, D = 8))]
fn g(
    table: Tensor<f32, {[V, D]}>,
    ids: Tensor<f32, {[B, S]}>,
    tokens: Tensor<i64, {[B, S]}>,
) -> (Tensor<f32, {[B, S, D]}>, Tensor<f32, {[B, S, D]}>) {
    let a = gather(table, ids);
    let b = gather(table, tokens, 2);
    (a, b)
}

fn main() {}
