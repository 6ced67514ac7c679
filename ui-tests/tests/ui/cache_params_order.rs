use autofusion::prelude::*;

// Tensors first, then caches, then the dims the caller gives; a caller dim is no shape's axis.
#[fused_graph(dims(D = 8))]
fn g(k_cache: Cache<f32, {[T, D]}>, P: usize, x: Tensor<f32, {[S, D]}>, S: usize) -> Tensor<f32, {[S, D]}> {
    let all = cache_write(k_cache, x, 0, P);
    slice(all, 0, 0, S)
}

fn main() {}
