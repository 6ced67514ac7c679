//! A GPT-2 style block, written as a user of autofusion writes it.

use autofusion::prelude::*;

/// Pre-LayerNorm block with causal attention and a GELU (tanh) MLP.
#[fused_graph(dims(D = 64, H = 4), hints(S = 32))]
pub fn gpt2_block(
    x: Tensor<f32, { [S, D] }>,
    ln1_g: Tensor<f32, { [D] }>,
    ln1_b: Tensor<f32, { [D] }>,
    w_qkv: Tensor<f32, { [D, 3 * D] }>,
    b_qkv: Tensor<f32, { [3 * D] }>,
    w_proj: Tensor<f32, { [D, D] }>,
    b_proj: Tensor<f32, { [D] }>,
    ln2_g: Tensor<f32, { [D] }>,
    ln2_b: Tensor<f32, { [D] }>,
    w_fc: Tensor<f32, { [D, 4 * D] }>,
    b_fc: Tensor<f32, { [4 * D] }>,
    w_out: Tensor<f32, { [4 * D, D] }>,
    b_out: Tensor<f32, { [D] }>,
) -> Tensor<f32, { [S, D] }> {
    let h = layer_norm(x, ln1_g, ln1_b, 1e-5);
    let (q, k, v) = split(linear(h, w_qkv, b_qkv), 3, -1);
    let a = attention(
        split_heads(q, H),
        split_heads(k, H),
        split_heads(v, H),
        1.0 / sqrt(D / H),
        causal,
    );
    let x1 = x + linear(merge_heads(a), w_proj, b_proj);
    let m = gelu_tanh(linear(layer_norm(x1, ln2_g, ln2_b, 1e-5), w_fc, b_fc));
    x1 + linear(m, w_out, b_out)
}
