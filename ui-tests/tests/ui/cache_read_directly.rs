use autofusion::prelude::*;

// A cache is read only through the cache_write that updates it.
#[fused_graph(dims(D = 8))]
fn g(x: Tensor<f32, {[S, D]}>, k_cache: Cache<f32, {[T, D]}>, P: usize) -> Tensor<f32, {[S, D]}> {
    let all = cache_write(k_cache, x, 0, P);
    let old = slice(k_cache, 0, 0, S);
    x + old + slice(all, 0, 0, S)
}

fn main() {}
