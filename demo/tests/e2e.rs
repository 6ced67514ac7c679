//! End to end, as a user: the crate's build.rs compiled the layer; call it, compare it with
//! the reference and the unfused build at several sequence lengths.

use autofusion::{tolerance, DType, Tensor};
use autofusion_demo::layers::gpt2_block;

fn params(s: usize) -> Vec<Tensor> {
    let d = 64;
    let shapes: [&[usize]; 13] = [
        &[s, d],
        &[d],
        &[d],
        &[d, 3 * d],
        &[3 * d],
        &[d, d],
        &[d],
        &[d],
        &[d],
        &[d, 4 * d],
        &[4 * d],
        &[4 * d, d],
        &[d],
    ];
    shapes
        .iter()
        .enumerate()
        .map(|(i, sh)| Tensor::randn(sh, if i == 0 { 1.0 } else { 0.1 }, 40 + i as u64))
        .collect()
}

#[test]
fn gpt2_block_fused_matches_reference_and_unfused() {
    let (rtol, atol) = tolerance(DType::F32);
    for s in [1, 5, 64, 129] {
        let p = params(s);
        let [x, g1, b1, wqkv, bqkv, wp, bp, g2, b2, wf, bf, wo, bo] = &p[..] else {
            unreachable!()
        };
        let y = gpt2_block(x, g1, b1, wqkv, bqkv, wp, bp, g2, b2, wf, bf, wo, bo).unwrap();
        let r =
            gpt2_block::reference(x, g1, b1, wqkv, bqkv, wp, bp, g2, b2, wf, bf, wo, bo).unwrap();
        let u = gpt2_block::unfused(x, g1, b1, wqkv, bqkv, wp, bp, g2, b2, wf, bf, wo, bo).unwrap();
        assert_eq!(y.shape(), &[s, 64]);
        assert!(
            y.allclose(&r, rtol, atol).unwrap(),
            "S = {s}: fused differs by {}",
            y.max_abs_diff(&r).unwrap()
        );
        assert!(
            u.allclose(&r, rtol, atol).unwrap(),
            "S = {s}: unfused differs by {}",
            u.max_abs_diff(&r).unwrap()
        );
    }
    // The fused build really is fused.
    let (fused, unfused) = (gpt2_block::module().unwrap(), gpt2_block::unfused_module().unwrap());
    assert!(fused.kernel_names().len() < unfused.kernel_names().len() / 2);
}

#[test]
fn build_output_is_in_out_dir() {
    let dir = std::path::Path::new(env!("OUT_DIR")).join("autofusion/gpt2_block");
    for f in ["fused.c", "unfused.c", "plan.json", "report.md", "before.dot", "after.dot"] {
        assert!(dir.join(f).exists(), "{f} missing in {}", dir.display());
    }
    let plan = std::fs::read_to_string(dir.join("plan.json")).unwrap();
    assert!(plan.contains(&"\"graph\": \"gpt2_block\"".to_string()));
    assert_eq!(env!("AUTOFUSION_GRAPH_GPT2_BLOCK"), gpt2_block::HASH);
}
