#[fused_graph(dims(D = 512, H = 8, F = 2048), opt_level = 2)]
pub fn seed_layer(
    x: Tensor<f32, {[S, D]}>,
    ln1_g: Tensor<f32, {[D]}>,
    ln1_b: Tensor<f32, {[D]}>,
    w_q: Tensor<f32, {[D, D]}>,
    b_q: Tensor<f32, {[D]}>,
    w_k: Tensor<f32, {[D, D]}>,
    b_k: Tensor<f32, {[D]}>,
    w_v: Tensor<f32, {[D, D]}>,
    b_v: Tensor<f32, {[D]}>,
    w_o: Tensor<f32, {[D, D]}>,
    b_o: Tensor<f32, {[D]}>,
    ln2_g: Tensor<f32, {[D]}>,
    ln2_b: Tensor<f32, {[D]}>,
    w1: Tensor<f32, {[D, F]}>,
    b1: Tensor<f32, {[F]}>,
    w2: Tensor<f32, {[F, D]}>,
    b2: Tensor<f32, {[D]}>,
) -> Tensor<f32, {[S, D]}> {
    let h = layer_norm(x, ln1_g, ln1_b, 1e-5);
    let q = split_heads(linear(h, w_q, b_q), H);
    let k = split_heads(linear(h, w_k, b_k), H);
    let v = split_heads(linear(h, w_v, b_v), H);
    let scores = matmul(q, transpose(k, -2, -1)) * (1.0 / sqrt(D / H));
    let p = softmax(scores, -1);
    let a = merge_heads(matmul(p, v));
    let x1 = x + linear(a, w_o, b_o);
    let h2 = layer_norm(x1, ln2_g, ln2_b, 1e-5);
    let f = silu(linear(h2, w1, b1));
    x1 + linear(f, w2, b2)
}
