use autofusion::prelude::*;

// Matrix products, norms and reductions compute on floats: integer ids must be looked up or cast.
#[fused_graph(dims(D = 8))]
fn g(ids: Tensor<i64, {[S, D]}>, w: Tensor<f32, {[D, D]}>) -> Tensor<f32, {[S, D]}> {
    let h = matmul(ids, w);
    let s = softmax(cast(ids, i32), -1);
    h + cast(s, f32)
}

fn main() {}
