use autofusion::prelude::*;

// A number next to an integer tensor must be a whole number in range; a bool takes none.
#[fused_graph(dims(D = 8))]
fn g(
    ids: Tensor<i64, {[S, D]}>,
    small: Tensor<i32, {[S, D]}>,
    keep: Tensor<bool, {[S, D]}>,
) -> (Tensor<i64, {[S, D]}>, Tensor<i32, {[S, D]}>, Tensor<bool, {[S, D]}>) {
    let half = ids * 0.5;
    let big = small + 3000000000;
    let both = keep & 1;
    (half, big, both)
}

fn main() {}
