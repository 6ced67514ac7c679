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

/// RoBERTa-style embeddings from token ids, as Hugging Face computes them: position ids from
/// the ids (padding tokens keep position `PAD`, the others count on from `PAD + 1`), the word,
/// position and token-type rows summed and normalised, and the additive key mask
/// `(1 - attention_mask) * f32::MIN` viewed `[B, 1, 1, S]` for the encoder layers.
#[fused_graph(dims(D = 32, V = 50, P = 520, PAD = 1))]
pub fn token_embeddings(
    input_ids: Tensor<i64, { [B, S] }>,
    token_type_ids: Tensor<i64, { [B, S] }>,
    attention_mask: Tensor<i64, { [B, S] }>,
    word: Tensor<f32, { [V, D] }>,
    position: Tensor<f32, { [P, D] }>,
    token_type: Tensor<f32, { [2, D] }>,
    ln_g: Tensor<f32, { [D] }>,
    ln_b: Tensor<f32, { [D] }>,
) -> (Tensor<f32, { [B, S, D] }>, Tensor<i64, { [B, S] }>, Tensor<f32, { [B, 1, 1, S] }>) {
    let not_pad = cast(input_ids != PAD, i64);
    let positions = cumsum(not_pad, 1) * not_pad + PAD;
    let e =
        gather(word, input_ids) + gather(position, positions) + gather(token_type, token_type_ids);
    let h = layer_norm(e, ln_g, ln_b, 1e-5);
    let keep = cast(attention_mask, f32);
    let mask = reshape((1.0 - keep) * -3.4028234663852886e38, [B, 1, 1, S]);
    (h, positions, mask)
}

/// A BERT encoder layer over a batch of padded sequences: the key mask is computed from the
/// int64 `attention_mask` in the graph and broadcast over heads and queries.
#[fused_graph(dims(D = 32, H = 4, F = 64))]
pub fn encoder_batched(
    x: Tensor<f32, { [B, S, D] }>,
    attention_mask: Tensor<i64, { [B, S] }>,
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
) -> Tensor<f32, { [B, S, D] }> {
    let mask = reshape((1.0 - cast(attention_mask, f32)) * -3.4028234663852886e38, [B, 1, 1, S]);
    let q = split_heads(linear(x, w_q, b_q), H);
    let k = split_heads(linear(x, w_k, b_k), H);
    let v = split_heads(linear(x, w_v, b_v), H);
    let a = merge_heads(attention(q, k, v, 1.0 / sqrt(D / H), mask));
    let x1 = layer_norm(x + linear(a, w_o, b_o), ln1_g, ln1_b, 1e-12);
    let f = gelu(linear(x1, w1, b1));
    layer_norm(x1 + linear(f, w2, b2), ln2_g, ln2_b, 1e-12)
}

/// Sentence embeddings as sentence-transformers makes them: the mean of the token states
/// the attention mask keeps, then L2-normalised (`x / max(|x|, 1e-12)`).
#[fused_graph(dims(D = 32))]
pub fn mean_pool(
    h: Tensor<f32, { [B, S, D] }>,
    attention_mask: Tensor<i64, { [B, S] }>,
) -> Tensor<f32, { [B, 1, D] }> {
    let m = reshape(cast(attention_mask, f32), [B, S, 1]);
    let pooled = sum(h * m, 1) / max(sum(m, 1), 1e-9);
    pooled / max(sqrt(sum(pooled * pooled, -1)), 1e-12)
}

/// Every integer and bool spelling of the DSL: arithmetic with numbers, integer division,
/// min / max, comparisons as operators and as functions, `!` `&` `|` and their names,
/// `where_` with a number, running sums (exclusive, along a non-last axis), a gather along
/// axis 1, `expand`, and casts between the storage types.
#[fused_graph(dims(W = 37, K = 5))]
pub fn int_zoo(
    ids: Tensor<i64, { [S, W] }>,
    small: Tensor<i32, { [S, W] }>,
    flags: Tensor<bool, { [S, W] }>,
    x: Tensor<f32, { [S, W] }>,
    cols: Tensor<i64, { [K] }>,
) -> (
    Tensor<i64, { [S, W] }>,
    Tensor<bool, { [S, W] }>,
    Tensor<f32, { [S, W] }>,
    Tensor<i32, { [S, K] }>,
    Tensor<i64, { [2, S, W] }>,
) {
    let wide = cast(small, i64);
    let arith = (ids * 7 - 3) / 2 + max(ids, wide) - min(-ids, wide) / (wide + 2);
    let counts = cumsum(arith, 0, exclusive) + cumsum(cast(flags, i64), -1);
    let cmp = (ids == wide) | (ids != 0) & !(ids < -3) | le(ids, wide) & gt(wide, ids);
    let logic = and(or(cmp, flags), not(ge(ids, 5))) | eq(cast(x, i32), small);
    let picked = where_(logic, x, -1.5) + where_(flags, cast(ids, f32), x);
    let gathered = gather(small, cols, 1) + cast(cast(slice(x, 1, 0, K), bool), i32);
    let stacked = expand(reshape(counts, [1, S, W]), [2, S, W]);
    (counts, logic, picked, gathered, stacked)
}
