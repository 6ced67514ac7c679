//! The three graphs a BERT sentence encoder runs: the embeddings, one encoder layer (called once
//! per layer with that layer's weights) and the pooling. Every size is a dynamic dim bound from
//! the tensors passed (batch B, length S, hidden H * DH, heads H, head size DH, intermediate F,
//! vocabulary V, positions P, token types T), so one build runs BERT checkpoints of any size;
//! the tiling is chosen per call for the actual shapes. The planner runs at `opt_level = 3`
//! (flash attention, one pipelined launch) and estimates the dims with `hints`: a BERT-base-like
//! encoder at a batch of 8 sentences of 64 tokens (estimates only: any size runs).

use autofusion::fused_graph;

/// BERT's embeddings: the word, absolute position and token-type rows summed and normalised.
/// Positions count 0 .. S - 1 along every row (BERT's are absolute: padding on the right does
/// not shift them); an id or a position outside its table is an error naming the table.
#[fused_graph(opt_level = 3, hints(B = 8, S = 64, D = 384, V = 30522, P = 512, T = 2))]
pub fn bert_embeddings(
    input_ids: Tensor<i64, { [B, S] }>,
    token_type_ids: Tensor<i64, { [B, S] }>,
    word: Tensor<f32, { [V, D] }>,
    position: Tensor<f32, { [P, D] }>,
    token_type: Tensor<f32, { [T, D] }>,
    ln_g: Tensor<f32, { [D] }>,
    ln_b: Tensor<f32, { [D] }>,
) -> Tensor<f32, { [B, S, D] }> {
    let positions = cumsum(input_ids * 0 + 1, 1, exclusive);
    let e =
        gather(word, input_ids) + gather(position, positions) + gather(token_type, token_type_ids);
    layer_norm(e, ln_g, ln_b, 1e-12)
}

/// One post-LayerNorm BERT encoder layer over a padded batch. The key mask is Hugging Face's
/// extended mask, `(1 - attention_mask) * f32::MIN` over `[B, 1, 1, S]`, computed here from the
/// int64 mask. The query bias comes in as `[H, DH]`: that is what binds the head count and size.
/// The attention scale 1 / sqrt(DH) is folded into the query weight and bias at load, since a
/// scale here must be a number, not a dim.
#[fused_graph(opt_level = 3, hints(B = 8, S = 64, H = 12, DH = 32, F = 1536))]
pub fn bert_layer(
    x: Tensor<f32, { [B, S, H * DH] }>,
    attention_mask: Tensor<i64, { [B, S] }>,
    w_q: Tensor<f32, { [H * DH, H * DH] }>,
    b_q: Tensor<f32, { [H, DH] }>,
    w_k: Tensor<f32, { [H * DH, H * DH] }>,
    b_k: Tensor<f32, { [H * DH] }>,
    w_v: Tensor<f32, { [H * DH, H * DH] }>,
    b_v: Tensor<f32, { [H * DH] }>,
    w_o: Tensor<f32, { [H * DH, H * DH] }>,
    b_o: Tensor<f32, { [H * DH] }>,
    ln1_g: Tensor<f32, { [H * DH] }>,
    ln1_b: Tensor<f32, { [H * DH] }>,
    w1: Tensor<f32, { [H * DH, F] }>,
    b1: Tensor<f32, { [F] }>,
    w2: Tensor<f32, { [F, H * DH] }>,
    b2: Tensor<f32, { [H * DH] }>,
    ln2_g: Tensor<f32, { [H * DH] }>,
    ln2_b: Tensor<f32, { [H * DH] }>,
) -> Tensor<f32, { [B, S, H * DH] }> {
    let mask = reshape((1.0 - cast(attention_mask, f32)) * -3.4028234663852886e38, [B, 1, 1, S]);
    let q = split_heads(linear(x, w_q, reshape(b_q, [H * DH])), H);
    let k = split_heads(linear(x, w_k, b_k), H);
    let v = split_heads(linear(x, w_v, b_v), H);
    let a = merge_heads(attention(q, k, v, 1.0, mask));
    let x1 = layer_norm(x + linear(a, w_o, b_o), ln1_g, ln1_b, 1e-12);
    let f = gelu(linear(x1, w1, b1));
    layer_norm(x1 + linear(f, w2, b2), ln2_g, ln2_b, 1e-12)
}

/// Sentence embeddings as sentence-transformers makes them (Pooling with mean tokens, then
/// Normalize): the mean of the states the attention mask keeps, L2-normalised.
#[fused_graph(opt_level = 3, hints(B = 8, S = 64, D = 384))]
pub fn mean_pool(
    h: Tensor<f32, { [B, S, D] }>,
    attention_mask: Tensor<i64, { [B, S] }>,
) -> Tensor<f32, { [B, D] }> {
    let m = reshape(cast(attention_mask, f32), [B, S, 1]);
    let pooled = reshape(sum(h * m, 1) / max(sum(m, 1), 1e-9), [B, D]);
    pooled / max(sqrt(sum(pooled * pooled, -1)), 1e-12)
}
