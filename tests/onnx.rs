//! ONNX models through the whole flow on the host: imported (`autofusion-onnx`), planned at
//! every opt level, generated, compiled and run on the model's own weights, against the
//! reference interpreter and against the output onnxruntime computed when the fixture was made
//! (`autofusion-onnx/tests/fixtures/make_fixtures.py`).

mod common;

use autofusion::Tensor;
use autofusion_compiler::{target::Target, Options, Unit, Variant};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("autofusion-onnx/tests/fixtures").join(name)
}

fn f32s(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Fixture `name` ([s, d] in and out) through import, every opt level and our kernels, against
/// the reference and onnxruntime's stored output. Returns the kernel count at opt_level 3.
fn run_fixture(name: &str, s: usize, d: usize) -> usize {
    let path = fixture(&format!("{name}.onnx"));
    let model = autofusion_onnx::load(&path).unwrap();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("onnx");
    let target = Target::host();
    let x = Tensor::from_f32(&[s, d], f32s(&fixture(&format!("{name}.x.bin")))).unwrap();
    let want = Tensor::from_f32(&[s, d], f32s(&fixture(&format!("{name}.y.bin")))).unwrap();
    let mut kernels = 0;
    for level in 0..=3u8 {
        let imported = autofusion_onnx::import(&model, name).unwrap();
        assert_eq!(imported.graph.dyn_dims, ["S"], "the model's dim_param stays dynamic");
        // Parameters: x, then the weights as the model file holds them.
        let mut params = vec![x.clone()];
        for (p, _) in &imported.weights {
            let node = imported.graph.node(imported.graph.param_nodes()[*p]);
            let shape: Vec<usize> =
                node.shape.iter().map(|e| e.as_const().unwrap() as usize).collect();
            let bytes = imported.weight_bytes(&model, *p).unwrap();
            let data = bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()));
            params.push(Tensor::from_f32(&shape, data.collect()).unwrap());
        }
        assert_eq!(params.len(), imported.graph.params.len());
        let unit =
            Unit::from_graph(imported.graph, Options { opt_level: level, ..Options::default() })
                .unwrap();
        let m = common::load(&unit, Variant::Fused, &target, &dir, &[]).unwrap();
        let refs: Vec<&Tensor> = params.iter().collect();
        let got = m.run(&refs).unwrap();
        let reference = m.reference(&refs).unwrap();
        common::assert_close(&format!("{name}, opt_level {level} vs reference"), &got, &reference);
        // onnxruntime's f32 output: the same tolerance as against the reference.
        common::assert_close(
            &format!("{name}, opt_level {level} vs onnxruntime"),
            &got,
            std::slice::from_ref(&want),
        );
        kernels = m.kernel_names().len();
    }
    kernels
}

#[test]
fn seed_layer_from_onnx_matches_onnxruntime_at_every_opt_level() {
    let kernels = run_fixture("seed_d32", 5, 32);
    assert!(kernels < 12, "fused at opt_level 3: {kernels} kernels");
}

/// GELU written out with Erf in both of torch's forms is imported as one GELU rather than
/// Erf and four elementwise ops;
/// each linear layer and its GELU are one kernel.
#[test]
fn gelu_written_with_erf_runs_as_gelu() {
    let model = autofusion_onnx::load(&fixture("mlp_gelu.onnx")).unwrap();
    let imported = autofusion_onnx::import(&model, "mlp_gelu").unwrap();
    assert_eq!(imported.merged.len(), 2, "both GELU chains found");
    let gelus = imported.graph.nodes.iter().filter(|n| n.op.name() == "gelu").count();
    assert_eq!(gelus, 2);
    assert_eq!(run_fixture("mlp_gelu", 5, 16), 2);
}

/// Split, and reshape targets computed the way torch.onnx writes them (Shape, Gather, Concat,
/// Equal / Where / ConstantOfShape, Range, CumSum, a constant mask through Not / And / Cast),
/// folded at import with S staying symbolic.
#[test]
fn exporter_shape_arithmetic_and_split_fold_at_import() {
    let model = autofusion_onnx::load(&fixture("shape_ops.onnx")).unwrap();
    let imported = autofusion_onnx::import(&model, "shape_ops").unwrap();
    let slices = imported.graph.nodes.iter().filter(|n| n.op.name() == "slice").count();
    assert_eq!(slices, 3, "Split is three views of the projection");
    run_fixture("shape_ops", 5, 8);
}
