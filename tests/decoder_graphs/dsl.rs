//! The decoder layer of `decoder_graphs::decoder_layer` written in the DSL: caches are
//! `Cache<..>` parameters written with `cache_write`, and the position `P` at which a call
//! writes is a `usize` parameter the caller gives. Compiled by the root build.rs.
#![allow(dead_code)]

use autofusion::prelude::*;

/// Llama-style decoder layer with grouped-query attention over KV caches (2 KV heads, 2 query
/// heads each), RoPE at positions `P .. P + S`.
#[fused_graph(dims(D = 32, H = 4, KVH = 2, G = 2, DH = 8, F = 48), opt_level = 3)]
pub fn decoder_kv(
    x: Tensor<f32, { [S, D] }>,
    cos: Tensor<f32, { [T, DH] }>,
    sin: Tensor<f32, { [T, DH] }>,
    attn_norm: Tensor<f32, { [D] }>,
    w_q: Tensor<f32, { [D, H * DH] }>,
    w_k: Tensor<f32, { [D, KVH * DH] }>,
    w_v: Tensor<f32, { [D, KVH * DH] }>,
    w_o: Tensor<f32, { [H * DH, D] }>,
    mlp_norm: Tensor<f32, { [D] }>,
    w_gate: Tensor<f32, { [D, F] }>,
    w_up: Tensor<f32, { [D, F] }>,
    w_down: Tensor<f32, { [F, D] }>,
    k_cache: Cache<f32, { [KVH, 1, T, DH] }>,
    v_cache: Cache<f32, { [KVH, 1, T, DH] }>,
    P: usize,
) -> Tensor<f32, { [S, D] }> {
    let h = rms_norm(x, attn_norm, 1e-5);
    let cos_s = slice(cos, 0, P, P + S);
    let sin_s = slice(sin, 0, P, P + S);
    // [S, KVH, G, DH] -> [KVH, G, S, DH]: query head kvh * G + g reads KV head kvh.
    let q = transpose(transpose(reshape(matmul(h, w_q), [S, KVH, G, DH]), 0, 1), 1, 2);
    let q = rope(q, cos_s, sin_s);
    let k = transpose(transpose(reshape(matmul(h, w_k), [S, KVH, 1, DH]), 0, 1), 1, 2);
    let k = rope(k, cos_s, sin_s);
    let v = transpose(transpose(reshape(matmul(h, w_v), [S, KVH, 1, DH]), 0, 1), 1, 2);
    let k_all = cache_write(k_cache, k, 2, P);
    let v_all = cache_write(v_cache, v, 2, P);
    let k_vis = slice(k_all, 2, 0, P + S);
    let v_vis = slice(v_all, 2, 0, P + S);
    let a = attention(q, k_vis, v_vis, 1.0 / sqrt(DH), causal);
    let a = reshape(transpose(transpose(a, 1, 2), 0, 1), [S, H * DH]);
    let x1 = x + matmul(a, w_o);
    let h2 = rms_norm(x1, mlp_norm, 1e-5);
    x1 + matmul(silu(matmul(h2, w_gate)) * matmul(h2, w_up), w_down)
}
