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

/// The `.json` beside fixture `name`: its inputs' and outputs' names and shapes.
fn fixture_meta(name: &str) -> serde_json::Value {
    let path = fixture(&format!("{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A shape as the fixtures' `.json` writes it.
fn json_shape(v: &serde_json::Value) -> Vec<usize> {
    v.as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect()
}

/// The parameters of an imported graph: its weights as the model file holds them, and its
/// graph inputs by name from `inputs`.
fn bind_params(
    imported: &autofusion_onnx::import::Imported,
    model: &autofusion_onnx::Model,
    inputs: &[(String, Tensor)],
) -> Vec<Tensor> {
    (0..imported.graph.params.len())
        .map(|p| {
            let pname = &imported.graph.params[p];
            let node = imported.graph.node(imported.graph.param_nodes()[p]);
            match imported.weights.iter().find(|(q, _)| *q == p) {
                Some(_) => {
                    let shape: Vec<usize> =
                        node.shape.iter().map(|e| e.as_const().unwrap() as usize).collect();
                    let bytes = imported.weight_bytes(model, p).unwrap();
                    Tensor::from_le_bytes(node.dtype, &shape, &bytes).unwrap()
                }
                None => {
                    let (_, t) = inputs
                        .iter()
                        .find(|(n, _)| n == pname)
                        .unwrap_or_else(|| panic!("no input `{pname}`"));
                    assert_eq!(node.dtype, t.dtype(), "`{pname}`");
                    t.clone()
                }
            }
        })
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
    let meta = fixture_meta(name);
    let shape = json_shape;
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
            let params = bind_params(&imported, &model, &inputs);
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
    let meta = fixture_meta(name);
    let shape = json_shape;
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
        let params = bind_params(&imported, &model, &inputs);
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

/// A whole-model fixture of `export_torch.py` (`*_model_*`): its int64 inputs by name and
/// torch's outputs, shapes from the `.json` beside it.
fn model_fixture(name: &str) -> (Vec<(String, Tensor)>, Vec<Tensor>) {
    let meta = fixture_meta(name);
    let shape = json_shape;
    let inputs = meta["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, v)| {
            assert_eq!(v[2], "int64");
            let bytes = std::fs::read(fixture(&format!("{name}.in{i}.bin"))).unwrap();
            let t = Tensor::from_le_bytes(autofusion::DType::I64, &shape(&v[1]), &bytes).unwrap();
            (v[0].as_str().unwrap().to_string(), t)
        })
        .collect();
    let outputs = meta["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(k, v)| {
            Tensor::from_f32(&shape(&v[1]), f32s(&fixture(&format!("{name}.out{k}.bin")))).unwrap()
        })
        .collect();
    (inputs, outputs)
}

/// Token ids `[b, s]` below `vocab`, an attention mask padding the last sequence after
/// `s / 2 + 1` tokens, and token types switching to 1 halfway: other shapes than the fixture's.
fn token_inputs(names: &[String], b: usize, s: usize, vocab: i64) -> Vec<(String, Tensor)> {
    let mut rng = autofusion_compiler::testing::Rng::new((b * 100 + s) as u64);
    names
        .iter()
        .map(|n| {
            let v: Vec<i64> = (0..b * s)
                .map(|k| {
                    let (row, col) = (k / s, k % s);
                    match n.as_str() {
                        "input_ids" => (rng.next_u64() % vocab as u64) as i64,
                        "attention_mask" => i64::from(row + 1 < b || col <= s / 2),
                        _ => i64::from(col >= s / 2),
                    }
                })
                .collect();
            (n.clone(), Tensor::from_i64(&[b, s], v).unwrap())
        })
        .collect()
}

/// Hugging Face's BertModel and LlamaForCausalLM (two layers; Llama with grouped-query
/// attention and an untied output), each exported whole by torch.onnx's TorchScript exporter
/// (opset 17) and its dynamo exporter (opset 18) with int64 token ids, attention mask and
/// (BERT) token types, batch and sequence dynamic: imported with every node taken (the masks,
/// positions and index tuples the exporters compute from the inputs included), planned at
/// opt levels 0 and 3, and run by our kernels with torch's outputs (1e-4) and the
/// reference's, at the fixture's shape and at another batch and length.
#[test]
fn hugging_face_model_exports_match_torch() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("onnx_models");
    let only = std::env::var("AUTOFUSION_TORCH_FIXTURE").ok();
    for name in ["bert_model_ts", "bert_model_dy", "llama_model_ts", "llama_model_dy"] {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let model = autofusion_onnx::load(&fixture(&format!("{name}.onnx"))).unwrap();
        let (inputs, want) = model_fixture(name);
        let names: Vec<String> = inputs.iter().map(|(n, _)| n.clone()).collect();
        for level in [0u8, 3] {
            let imported =
                autofusion_onnx::import(&model, name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(
                imported.graph.dyn_dims,
                ["B", "S"],
                "{name}: batch and length stay dynamic"
            );
            let params = bind_params(&imported, &model, &inputs);
            let other = bind_params(&imported, &model, &token_inputs(&names, 3, 13, 99));
            let opts = Options { opt_level: level, ..Options::default() };
            let unit = Unit::from_graph(imported.graph, opts).unwrap();
            let m = common::load(&unit, Variant::Fused, &Target::host(), &dir, &[]).unwrap();
            let ctx = format!("{name}, opt_level {level}");
            let refs: Vec<&Tensor> = params.iter().collect();
            let got = m.run(&refs).unwrap_or_else(|e| panic!("{ctx}: {e}"));
            common::assert_close(&format!("{ctx} vs torch"), &got, &want);
            common::assert_close(
                &format!("{ctx} vs reference"),
                &got,
                &m.reference(&refs).unwrap(),
            );
            let refs: Vec<&Tensor> = other.iter().collect();
            let got = m.run(&refs).unwrap_or_else(|e| panic!("{ctx} at B 3, S 13: {e}"));
            let reference = m.reference(&refs).unwrap();
            common::assert_close(&format!("{ctx} at B 3, S 13 vs reference"), &got, &reference);
            eprintln!("ok: {ctx} ({} kernels)", m.kernel_names().len());
        }
    }
}

include!(concat!(env!("OUT_DIR"), "/autofusion/bert_onnx.rs"));
include!(concat!(env!("OUT_DIR"), "/autofusion/llama_onnx.rs"));

/// The same models built by this package's build.rs with `Builder::onnx` (BERT from the dynamo
/// export, Llama from the TorchScript one): the generated functions take the token tensors by
/// name, read the weights from the model file, and give torch's outputs.
#[test]
fn models_built_with_builder_onnx_give_torchs_outputs() {
    let (inputs, want) = model_fixture("bert_model_dy");
    let t = |k: usize| &inputs[k].1;
    let (hidden, pooled) = bert_onnx::run(t(0), t(1), t(2)).unwrap();
    common::assert_close("bert_onnx vs torch", &[hidden, pooled], &want);
    let (inputs, want) = model_fixture("llama_model_ts");
    let logits = llama_onnx::run(&inputs[0].1, &inputs[1].1).unwrap();
    common::assert_close("llama_onnx vs torch", &[logits], &want);
    // An id outside the vocabulary is an error naming the input, before any kernel runs.
    let bad = Tensor::from_i64(&[1, 3], vec![5, 99, 7]).unwrap();
    let ones = Tensor::from_i64(&[1, 3], vec![1; 3]).unwrap();
    let e = llama_onnx::run(&bad, &ones).unwrap_err().to_string();
    assert!(e.contains("`input_ids` holds 99 at element 1") && e.contains("99 rows"), "{e}");
}
