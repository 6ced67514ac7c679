use autofusion::prelude::*;

// `& | !` and `and or not` take bools; comparisons take two values of one type; cumsum takes
// numbers, and its third argument can only be `exclusive`.
#[fused_graph(dims(D = 8))]
fn g(
    x: Tensor<f32, {[S, D]}>,
    ids: Tensor<i64, {[S, D]}>,
    keep: Tensor<bool, {[S, D]}>,
) -> (Tensor<bool, {[S, D]}>, Tensor<bool, {[S, D]}>, Tensor<i64, {[S, D]}>) {
    let a = !x | keep;
    let b = ids < x;
    let c = cumsum(keep, -1);
    let d = cumsum(ids, -1, inclusive);
    (a, b, c + d)
}

fn main() {}
