use autofusion::prelude::*;

#[fused_graph(dims(D = 8), rules = [add_norm, fuse_everything])]
fn g(x: Tensor<f32, {[S, D]}>) -> Tensor<f32, {[S, D]}> {
    silu(x)
}

fn main() {}
