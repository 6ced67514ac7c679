//! The seed layer: a pre-LayerNorm Transformer block (d 512, 8 heads, dynamic sequence
//! length), run fused, unfused (opt_level 0) and in the reference interpreter at S = 128.
//!
//!     cargo run --release --example seed_layer [-- --seq 128 --iters 20]

use autofusion::prelude::*;
use std::time::Instant;

#[fused_graph(dims(D = 512, H = 8, F = 2048), opt_level = 3)]
pub fn seed_layer(
    x: Tensor<f32, { [S, D] }>,
    ln1_g: Tensor<f32, { [D] }>,
    ln1_b: Tensor<f32, { [D] }>,
    w_q: Tensor<f32, { [D, D] }>,
    b_q: Tensor<f32, { [D] }>,
    w_k: Tensor<f32, { [D, D] }>,
    b_k: Tensor<f32, { [D] }>,
    w_v: Tensor<f32, { [D, D] }>,
    b_v: Tensor<f32, { [D] }>,
    w_o: Tensor<f32, { [D, D] }>,
    b_o: Tensor<f32, { [D] }>,
    ln2_g: Tensor<f32, { [D] }>,
    ln2_b: Tensor<f32, { [D] }>,
    w1: Tensor<f32, { [D, F] }>,
    b1: Tensor<f32, { [F] }>,
    w2: Tensor<f32, { [F, D] }>,
    b2: Tensor<f32, { [D] }>,
) -> Tensor<f32, { [S, D] }> {
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> Result<()> {
    let (d, f, seq, iters) = (512, 2048, arg("--seq", 128), arg("--iters", 20).max(1));
    // Weights ~ N(0, 0.02), gammas ~ 1 + N(0, 0.02), x ~ N(0, 1) (as the peers' script).
    let w = |shape: &[usize], seed: u64| Tensor::randn(shape, 0.02, seed);
    let gamma = |seed: u64| {
        let t = Tensor::randn(&[d], 0.02, seed);
        Tensor::from_f32(&[d], t.to_f32_vec().iter().map(|v| v + 1.0).collect()).unwrap()
    };
    let p = [
        Tensor::randn(&[seq, d], 1.0, 1),
        gamma(2),
        w(&[d], 3),
        w(&[d, d], 4),
        w(&[d], 5),
        w(&[d, d], 6),
        w(&[d], 7),
        w(&[d, d], 8),
        w(&[d], 9),
        w(&[d, d], 10),
        w(&[d], 11),
        gamma(12),
        w(&[d], 13),
        w(&[d, f], 14),
        w(&[f], 15),
        w(&[f, d], 16),
        w(&[d], 17),
    ];
    let run = |which: u8| -> Result<Tensor> {
        let [x, g1, b1n, wq, bq, wk, bk, wv, bv, wo, bo, g2, b2n, w1, b1, w2, b2] = &p;
        match which {
            0 => seed_layer(x, g1, b1n, wq, bq, wk, bk, wv, bv, wo, bo, g2, b2n, w1, b1, w2, b2),
            1 => seed_layer::unfused(
                x, g1, b1n, wq, bq, wk, bk, wv, bv, wo, bo, g2, b2n, w1, b1, w2, b2,
            ),
            _ => seed_layer::reference(
                x, g1, b1n, wq, bq, wk, bk, wv, bv, wo, bo, g2, b2n, w1, b1, w2, b2,
            ),
        }
    };
    let module = seed_layer::module()?;
    println!(
        "seed layer: d {d}, 8 heads, ffn {f}, S = {seq}, f32, {} threads",
        autofusion_runtime::pool::pool().threads()
    );
    for line in &module.meta().summary {
        println!("{line}");
    }
    println!(
        "plan (opt_level 3): {} ops -> {} kernels",
        module.op_count(),
        module.kernel_names().len()
    );
    for (name, ops) in module.kernel_names() {
        println!("  {name:<24} {ops}");
    }
    let fused = run(0)?;
    let unfused = run(1)?;
    let reference = run(2)?;
    let (rtol, atol) = autofusion::tolerance(DType::F32);
    let e_fused = fused.max_abs_diff(&reference)?;
    let e_unfused = unfused.max_abs_diff(&reference)?;
    let ok = fused.allclose(&reference, rtol, atol)? && unfused.allclose(&reference, rtol, atol)?;
    println!("max |fused - reference| = {e_fused:.2e}, max |unfused - reference| = {e_unfused:.2e} (f32 tolerance rtol {rtol:e}, atol {atol:e}): {}", if ok { "agree" } else { "DISAGREE" });
    // Interleave fused and unfused runs so both see the same machine state.
    let (mut tf, mut tu) = (Vec::new(), Vec::new());
    for _ in 0..iters {
        let t0 = Instant::now();
        run(0)?;
        tf.push(t0.elapsed().as_secs_f64() * 1e3);
        let t0 = Instant::now();
        run(1)?;
        tu.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    let (mf, mu) = (median(tf), median(tu));
    let flop = 2.0 * seq as f64 * (4.0 * (d * d) as f64 + 2.0 * (d * f) as f64)
        + 4.0 * (seq * seq * d) as f64;
    println!("median over {iters} runs: fused {mf:.3} ms ({:.1} GFLOP/s), unfused {mu:.3} ms ({:.1} GFLOP/s), speedup {:.2}x",
        flop / mf / 1e6, flop / mu / 1e6, mu / mf);
    if std::env::args().any(|a| a == "--kernels") {
        let [x, g1, b1n, wq, bq, wk, bk, wv, bv, wo, bo, g2, b2n, w1, b1, w2, b2] = &p;
        let args = [x, g1, b1n, wq, bq, wk, bk, wv, bv, wo, bo, g2, b2n, w1, b1, w2, b2];
        for (label, m) in [("fused", module), ("unfused", seed_layer::unfused_module()?)] {
            let t = m.time_kernels(&args, iters)?;
            println!("{label}: per-kernel medians (us), sum {:.0}", t.iter().sum::<f64>());
            for ((name, _), us) in m.kernel_names().iter().zip(&t) {
                println!("  {name:<24} {us:>9.1}");
            }
        }
    }
    let plan = module.shape_plan(&[seq as i64])?;
    println!(
        "arena {:.2} MB for {:.2} MB of intermediates",
        plan.arena_bytes as f64 / 1e6,
        plan.intermediate_bytes as f64 / 1e6
    );
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}
