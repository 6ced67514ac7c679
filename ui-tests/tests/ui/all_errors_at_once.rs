use autofusion::prelude::*;

// Every error of the phase is reported, not just the first.
#[fused_graph(dims(D = 8, F = 32))]
fn g(x: Tensor<f32, {[S, D]}>, w: Tensor<f32, {[F, D]}>) -> Tensor<f32, {[S, D]}> {
    let a = gleu(x);
    let b = matmul(x, w);
    let c = x + undefined_thing;
    softmax(x, 5)
}

fn main() {}
