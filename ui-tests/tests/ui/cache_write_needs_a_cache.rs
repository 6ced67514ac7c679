use autofusion::prelude::*;

// cache_write writes a Cache parameter, not a tensor; every cache is written once.
#[fused_graph(dims(D = 8))]
fn g(x: Tensor<f32, {[S, D]}>, w: Tensor<f32, {[T, D]}>, k_cache: Cache<f32, {[T, D]}>, P: usize) -> Tensor<f32, {[S, D]}> {
    let all = cache_write(w, x, 0, P);
    x
}

fn main() {}
