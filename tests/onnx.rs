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

/// A fixture exported by torch.onnx (`autofusion-onnx/tests/fixtures/export_torch.py`): its
/// inputs and torch's output, shapes from the `.json` beside it.
fn torch_fixture(name: &str) -> (Vec<(String, Tensor)>, Tensor) {
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture(&format!("{name}.json"))).unwrap())
            .unwrap();
    let shape = |v: &serde_json::Value| -> Vec<usize> {
        v.as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect()
    };
    let inputs = meta["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let data = f32s(&fixture(&format!("{name}.in{i}.bin")));
            (v[0].as_str().unwrap().to_string(), Tensor::from_f32(&shape(&v[1]), data).unwrap())
        })
        .collect();
    let out = Tensor::from_f32(&shape(&meta["output"]), f32s(&fixture(&format!("{name}.out.bin"))))
        .unwrap();
    (inputs, out)
}

/// Hugging Face's BERT encoder layer (padding mask) and Llama decoder layer (RMSNorm, RoPE
/// from cos / sin inputs, causal mask, SwiGLU), each exported by torch.onnx's TorchScript
/// exporter (opset 17: shape arithmetic in the graph) and its dynamo exporter (opset 18,
/// weights in an external-data file): imported, the sequence length dynamic, every node taken,
/// and at every opt level the fused kernels agree with the reference and with what torch
/// computed.
#[test]
fn torch_exported_bert_and_llama_layers_match_torch() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("onnx_torch");
    // AUTOFUSION_TORCH_FIXTURE=name runs that fixture only (for debugging).
    let only = std::env::var("AUTOFUSION_TORCH_FIXTURE").ok();
    for name in ["bert_layer_ts", "bert_layer_dy", "llama_layer_ts", "llama_layer_dy"] {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let model = autofusion_onnx::load(&fixture(&format!("{name}.onnx"))).unwrap();
        let (inputs, want) = torch_fixture(name);
        for level in 0..=3u8 {
            let imported =
                autofusion_onnx::import(&model, name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(imported.graph.dyn_dims, ["S"], "{name}: the sequence stays dynamic");
            let mut params = Vec::new();
            for p in 0..imported.graph.params.len() {
                let pname = &imported.graph.params[p];
                match imported.weights.iter().find(|(q, _)| *q == p) {
                    Some(_) => {
                        let node = imported.graph.node(imported.graph.param_nodes()[p]);
                        let shape: Vec<usize> =
                            node.shape.iter().map(|e| e.as_const().unwrap() as usize).collect();
                        let bytes = imported.weight_bytes(&model, p).unwrap();
                        params.push(Tensor::from_le_bytes(node.dtype, &shape, &bytes).unwrap());
                    }
                    None => {
                        let (_, t) = inputs.iter().find(|(n, _)| n == pname).unwrap();
                        params.push(t.clone());
                    }
                }
            }
            let opts = Options { opt_level: level, ..Options::default() };
            let unit = Unit::from_graph(imported.graph, opts).unwrap();
            let m = common::load(&unit, Variant::Fused, &Target::host(), &dir, &[]).unwrap();
            let refs: Vec<&Tensor> = params.iter().collect();
            let got = m.run(&refs).unwrap();
            let reference = m.reference(&refs).unwrap();
            let ctx = format!("{name}, opt_level {level}");
            common::assert_close(&format!("{ctx} vs reference"), &got, &reference);
            common::assert_close(&format!("{ctx} vs torch"), &got, std::slice::from_ref(&want));
        }
    }
}

/// An embedding layer with int64 `input_ids` and `attention_mask` inputs, written the way
/// exporters write Hugging Face encoders' first nodes (`make_int_fixtures.py`): position ids
/// from CumSum of the mask, Gather of word and position tables, LayerNormalization, padded rows
/// zeroed by Equal / Where, the extended additive mask, a scalar Gather and a GatherND of
/// computed index pairs. At every opt level our kernels agree with the reference and with
/// onnxruntime's outputs.
#[test]
fn an_embedding_model_with_int64_ids_matches_onnxruntime() {
    let name = "embed_ids";
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("onnx_ints");
    let model = autofusion_onnx::load(&fixture(&format!("{name}.onnx"))).unwrap();
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture(&format!("{name}.json"))).unwrap())
            .unwrap();
    let shape = |v: &serde_json::Value| -> Vec<usize> {
        v.as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect()
    };
    let inputs: Vec<(String, Tensor)> = meta["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let bytes = std::fs::read(fixture(&format!("{name}.in{i}.bin"))).unwrap();
            let t = Tensor::from_le_bytes(autofusion::DType::I64, &shape(&v[1]), &bytes).unwrap();
            (v[0].as_str().unwrap().to_string(), t)
        })
        .collect();
    let want: Vec<Tensor> = meta["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(k, s)| {
            Tensor::from_f32(&shape(s), f32s(&fixture(&format!("{name}.out{k}.bin")))).unwrap()
        })
        .collect();
    for level in 0..=3u8 {
        let imported = autofusion_onnx::import(&model, name).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(imported.graph.dyn_dims, ["S"]);
        let mut params = Vec::new();
        for p in 0..imported.graph.params.len() {
            let pname = &imported.graph.params[p];
            let node = imported.graph.node(imported.graph.param_nodes()[p]);
            match imported.weights.iter().find(|(q, _)| *q == p) {
                Some(_) => {
                    let shape: Vec<usize> =
                        node.shape.iter().map(|e| e.as_const().unwrap() as usize).collect();
                    let bytes = imported.weight_bytes(&model, p).unwrap();
                    params.push(Tensor::from_le_bytes(node.dtype, &shape, &bytes).unwrap());
                }
                None => {
                    assert_eq!(node.dtype, autofusion::DType::I64, "`{pname}` is an int64 input");
                    params.push(inputs.iter().find(|(n, _)| n == pname).unwrap().1.clone());
                }
            }
        }
        let opts = Options { opt_level: level, ..Options::default() };
        let unit = Unit::from_graph(imported.graph, opts).unwrap();
        let m = common::load(&unit, Variant::Fused, &Target::host(), &dir, &[]).unwrap();
        let refs: Vec<&Tensor> = params.iter().collect();
        let got = m.run(&refs).unwrap();
        let ctx = format!("{name}, opt_level {level}");
        common::assert_close(&format!("{ctx} vs reference"), &got, &m.reference(&refs).unwrap());
        common::assert_close(&format!("{ctx} vs onnxruntime"), &got, &want);
        eprintln!("ok: {ctx} ({} kernels)", m.kernel_names().len());
    }
}

/// `x[0]` of a dynamic sequence (a scalar Gather, imported as a slice) at S = 0: an error
/// naming the slice when the call binds S, not a read past the end.
#[test]
fn a_constant_index_past_a_dynamic_end_is_an_error_at_the_call() {
    let model = autofusion_onnx::load(&fixture("embed_ids.onnx")).unwrap();
    let imported = autofusion_onnx::import(&model, "embed_ids").unwrap();
    let unit = Unit::from_graph(imported.graph, Options::default()).unwrap();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("onnx_ints");
    let m = common::load(&unit, Variant::Fused, &Target::host(), &dir, &[]).unwrap();
    let g = m.graph().clone();
    let params: Vec<Tensor> = g
        .param_nodes()
        .iter()
        .map(|id| {
            let n = g.node(*id);
            let shape: Vec<usize> =
                n.shape.iter().map(|d| d.as_const().map_or(0, |c| c as usize)).collect();
            Tensor::zeros(n.dtype, &shape)
        })
        .collect();
    let refs: Vec<&Tensor> = params.iter().collect();
    let e = m.run(&refs).unwrap_err().to_string();
    assert!(e.contains("[0, 1) of axis 0") && e.contains("S = 0"), "{e}");
}
