//! Layers compiled by this package's build.rs and shared by the integration tests. The
//! differential matrix (tests/differential.rs) also re-plans them at every opt level.
#![allow(dead_code)]

use autofusion::prelude::*;

/// BERT encoder layer: post-LayerNorm, GELU (erf), additive attention mask over keys.
#[fused_graph(dims(D = 128, H = 4, F = 512))]
pub fn bert_layer(
    x: Tensor<f32, { [S, D] }>,
    mask: Tensor<f32, { [1, S] }>,
    w_q: Tensor<f32, { [D, D] }>,
    b_q: Tensor<f32, { [D] }>,
    w_k: Tensor<f32, { [D, D] }>,
    b_k: Tensor<f32, { [D] }>,
    w_v: Tensor<f32, { [D, D] }>,
    b_v: Tensor<f32, { [D] }>,
    w_o: Tensor<f32, { [D, D] }>,
    b_o: Tensor<f32, { [D] }>,
    ln1_g: Tensor<f32, { [D] }>,
    ln1_b: Tensor<f32, { [D] }>,
    w1: Tensor<f32, { [D, F] }>,
    b1: Tensor<f32, { [F] }>,
    w2: Tensor<f32, { [F, D] }>,
    b2: Tensor<f32, { [D] }>,
    ln2_g: Tensor<f32, { [D] }>,
    ln2_b: Tensor<f32, { [D] }>,
) -> Tensor<f32, { [S, D] }> {
    let q = split_heads(linear(x, w_q, b_q), H);
    let k = split_heads(linear(x, w_k, b_k), H);
    let v = split_heads(linear(x, w_v, b_v), H);
    let a = merge_heads(attention(q, k, v, 1.0 / sqrt(D / H), mask));
    let x1 = layer_norm(x + linear(a, w_o, b_o), ln1_g, ln1_b, 1e-12);
    let f = gelu(linear(x1, w1, b1));
    layer_norm(x1 + linear(f, w2, b2), ln2_g, ln2_b, 1e-12)
}

/// Llama-style block: RMSNorm, rotary embeddings, causal attention, SwiGLU FFN.
#[fused_graph(dims(D = 128, H = 4, F = 352), opt_level = 2)]
pub fn llama_block(
    x: Tensor<f32, { [S, D] }>,
    attn_norm: Tensor<f32, { [D] }>,
    w_q: Tensor<f32, { [D, D] }>,
    w_k: Tensor<f32, { [D, D] }>,
    w_v: Tensor<f32, { [D, D] }>,
    w_o: Tensor<f32, { [D, D] }>,
    cos: Tensor<f32, { [S, D / H] }>,
    sin: Tensor<f32, { [S, D / H] }>,
    ffn_norm: Tensor<f32, { [D] }>,
    w_gate: Tensor<f32, { [D, F] }>,
    w_up: Tensor<f32, { [D, F] }>,
    w_down: Tensor<f32, { [F, D] }>,
) -> Tensor<f32, { [S, D] }> {
    let h = rms_norm(x, attn_norm, 1e-6);
    let q = rope(split_heads(matmul(h, w_q), H), cos, sin);
    let k = rope(split_heads(matmul(h, w_k), H), cos, sin);
    let v = split_heads(matmul(h, w_v), H);
    let a = merge_heads(attention(q, k, v, 1.0 / sqrt(D / H), causal));
    let x1 = x + matmul(a, w_o);
    let h2 = rms_norm(x1, ffn_norm, 1e-6);
    x1 + matmul(silu(matmul(h2, w_gate)) * matmul(h2, w_up), w_down)
}

/// A half-precision FFN with a pre-norm: f16 storage, f32 arithmetic inside kernels.
#[fused_graph(dims(D = 64, F = 160))]
pub fn ffn_f16(
    x: Tensor<f16, { [S, D] }>,
    g: Tensor<f16, { [D] }>,
    b: Tensor<f16, { [D] }>,
    w1: Tensor<f16, { [D, F] }>,
    b1: Tensor<f16, { [F] }>,
    w2: Tensor<f16, { [F, D] }>,
) -> Tensor<f16, { [S, D] }> {
    let h = layer_norm(x, g, b, 1e-5);
    x + matmul(gelu_tanh(linear(h, w1, b1)), w2)
}

/// Half-precision causal self-attention: on Ascend the cube reads f16 activations and weights
/// in place and computes P V in f16 (P rounded into its own tile).
#[fused_graph(dims(D = 64, H = 4))]
pub fn attention_f16(
    x: Tensor<f16, { [S, D] }>,
    w_q: Tensor<f16, { [D, D] }>,
    w_k: Tensor<f16, { [D, D] }>,
    w_v: Tensor<f16, { [D, D] }>,
    w_o: Tensor<f16, { [D, D] }>,
) -> Tensor<f16, { [S, D] }> {
    let q = split_heads(matmul(x, w_q), H);
    let k = split_heads(matmul(x, w_k), H);
    let v = split_heads(matmul(x, w_v), H);
    x + matmul(merge_heads(attention(q, k, v, 1.0 / sqrt(D / H), causal)), w_o)
}

/// bf16 in, f32 math through casts, two outputs (residual stream and its normed copy).
#[fused_graph(dims(D = 96))]
pub fn add_norm_bf16(
    x: Tensor<bf16, { [S, D] }>,
    r: Tensor<bf16, { [S, D] }>,
    g: Tensor<bf16, { [D] }>,
) -> (Tensor<bf16, { [S, D] }>, Tensor<f32, { [S, D] }>) {
    let s = x + r;
    let n = rms_norm(cast(s, f32), cast(g, f32), 1e-5);
    (s, n)
}

/// Every remaining op kind: reductions over a non-last axis, slices, concat, pow/max/min,
/// the other activations, causal masking, reshape of a transposed view (needs a copy).
#[fused_graph(dims(D = 24))]
pub fn op_zoo(
    x: Tensor<f32, { [S, D] }>,
    y: Tensor<f32, { [S, D] }>,
    w: Tensor<f32, { [D, 2 * D] }>,
) -> (
    Tensor<f32, { [S, D] }>,
    Tensor<f32, { [1, D] }>,
    Tensor<f32, { [S, 2 * D] }>,
    Tensor<f32, { [2, S, D / 2] }>,
) {
    let a = relu(x) + tanh(y) * sigmoid(x) - exp(neg(y * y));
    let b = pow(max(x, y), 2.0) / (min(x, y) * min(x, y) + 1.0);
    let c = log(sqrt(b + 1.0))
        + rsqrt(b + 2.0)
        + gelu(a)
        + silu(a)
        + erf(a - y)
        + sin(a * 3.0) * cos(y);
    let col = mean(c, 0) + sum(x, 0) * 0.5 - max(y, 0);
    let (lo, hi) = split(matmul(c, w), 2, -1);
    let cat = concat([hi, lo * 2.0], -1);
    let sc = causal_mask(matmul(x, transpose(slice(y, 0, 0, S), 0, 1)));
    let attnish = matmul(softmax(sc, -1), slice(cat, 1, 0, D));
    let r = reshape(transpose(reshape(attnish, [S, 2, D / 2]), 0, 1), [2, S, D / 2]);
    (attnish, col, cat, r)
}
