//! The graphs a Llama-architecture decoder runs, every size a dynamic dim bound from the
//! tensors passed (tokens S, hidden D, KV heads KVH, query heads per KV head G, head dim DH,
//! intermediate F, vocabulary V, RoPE table rows R, cache length T), so one build runs
//! checkpoints of any shape; the tiling is chosen per call for the actual shapes. The
//! planner estimates the dims with `hints` at SmolLM2-135M's shapes in a decode step
//! (estimates only: any size runs).
//!
//! What a number in a graph cannot carry comes in from the loader: the attention scale
//! `1 / sqrt(DH)` is folded into the query weight, and the RMSNorm epsilon is a `[1]` tensor.

use autofusion::fused_graph;

/// Token ids to rows of the embedding table (an id outside it is an error naming the table).
#[fused_graph(opt_level = 3, hints(S = 1, V = 49152, D = 576))]
pub fn llama_embed(
    ids: Tensor<i64, { [S] }>,
    table: Tensor<f32, { [V, D] }>,
) -> Tensor<f32, { [S, D] }> {
    gather(table, ids)
}

/// One decoder layer at positions `P .. P + S`: RMSNorm, Q / K / V projections, RoPE at the
/// absolute positions (rotate-half, rows `P .. P + S` of the tables), the new keys and values
/// written into the caches at `P`, grouped-query attention over the `P + S` cached positions
/// (causal, aligned to the bottom-right corner), the output projection, RMSNorm and a SwiGLU
/// MLP, each with its residual. The caches are `[KVH, 1, T, DH]`: the `1` broadcasts each KV
/// head over its G query heads with no copy.
///
/// Every rule, and `qkv_horizontal` too: the Q, K and V projections read the same normalised
/// rows, and one launch for the three paid 2-4% at ctx 0 in decode on Sapphire Rapids (two
/// paired `--bench` runs, prefill and longer contexts unchanged); the Ascend backend plans
/// without it.
#[fused_graph(
    opt_level = 3,
    rules = [
        elementwise_chain,
        reduce_epilogue,
        add_norm,
        linear_epilogue,
        norm_linear_prologue,
        flash_attention,
        layout_store,
        qkv_horizontal,
        sibling_matmul,
        pipeline
    ],
    hints(S = 1, T = 2048, R = 2048, P = 512, D = 576, KVH = 3, G = 3, DH = 64, F = 1536)
)]
pub fn llama_layer(
    x: Tensor<f32, { [S, D] }>,
    eps: Tensor<f32, { [1] }>,
    cos: Tensor<f32, { [R, DH] }>,
    sin: Tensor<f32, { [R, DH] }>,
    attn_norm: Tensor<f32, { [D] }>,
    w_q: Tensor<f32, { [D, KVH, G, DH] }>,
    w_k: Tensor<f32, { [D, KVH * DH] }>,
    w_v: Tensor<f32, { [D, KVH * DH] }>,
    w_o: Tensor<f32, { [KVH * G * DH, D] }>,
    mlp_norm: Tensor<f32, { [D] }>,
    w_gate: Tensor<f32, { [D, F] }>,
    w_up: Tensor<f32, { [D, F] }>,
    w_down: Tensor<f32, { [F, D] }>,
    k_cache: Cache<f32, { [KVH, 1, T, DH] }>,
    v_cache: Cache<f32, { [KVH, 1, T, DH] }>,
    P: usize,
) -> Tensor<f32, { [S, D] }> {
    let h = x * rsqrt(mean(x * x, 1) + eps) * attn_norm;
    let cos_s = slice(cos, 0, P, P + S);
    let sin_s = slice(sin, 0, P, P + S);
    // [S, KVH, G, DH] -> [KVH, G, S, DH]: query head kvh * G + g reads KV head kvh.
    let q = matmul(h, reshape(w_q, [D, KVH * G * DH]));
    let q = transpose(transpose(reshape(q, [S, KVH, G, DH]), 0, 1), 1, 2);
    let q = rope(q, cos_s, sin_s);
    let k = transpose(transpose(reshape(matmul(h, w_k), [S, KVH, 1, DH]), 0, 1), 1, 2);
    let k = rope(k, cos_s, sin_s);
    let v = transpose(transpose(reshape(matmul(h, w_v), [S, KVH, 1, DH]), 0, 1), 1, 2);
    let k_all = cache_write(k_cache, k, 2, P);
    let v_all = cache_write(v_cache, v, 2, P);
    let k_vis = slice(k_all, 2, 0, P + S);
    let v_vis = slice(v_all, 2, 0, P + S);
    let a = attention(q, k_vis, v_vis, 1.0, causal);
    let a = reshape(transpose(transpose(a, 1, 2), 0, 1), [S, KVH * G * DH]);
    let x1 = x + matmul(a, w_o);
    let h2 = x1 * rsqrt(mean(x1 * x1, 1) + eps) * mlp_norm;
    x1 + matmul(silu(matmul(h2, w_gate)) * matmul(h2, w_up), w_down)
}

/// The final RMSNorm and the output projection `[D, V]`.
#[fused_graph(opt_level = 3, hints(S = 1, V = 49152, D = 576))]
pub fn llama_head(
    x: Tensor<f32, { [S, D] }>,
    eps: Tensor<f32, { [1] }>,
    norm: Tensor<f32, { [D] }>,
    w_out: Tensor<f32, { [D, V] }>,
) -> Tensor<f32, { [S, V] }> {
    matmul(x * rsqrt(mean(x * x, 1) + eps) * norm, w_out)
}

/// The head of a model whose output projection is its embedding table `[V, D]`, read
/// transposed (packed once, like any weight).
#[fused_graph(opt_level = 3, hints(S = 1, V = 49152, D = 576))]
pub fn llama_head_tied(
    x: Tensor<f32, { [S, D] }>,
    eps: Tensor<f32, { [1] }>,
    norm: Tensor<f32, { [D] }>,
    table: Tensor<f32, { [V, D] }>,
) -> Tensor<f32, { [S, V] }> {
    matmul(x * rsqrt(mean(x * x, 1) + eps) * norm, transpose(table, 0, 1))
}
