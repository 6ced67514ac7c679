//! The `graph-autofusion` command on the seed-layer fixture: its log, the fused model (decoded
//! again, idempotent on its own output), one-line errors, and, with Python's onnx and
//! onnxruntime, `onnx.checker` and onnxruntime's outputs on the fused model against the
//! original. CI installs them and sets AUTOFUSION_REQUIRE_ONNX_PY=1 so that part must run.

mod common;

use autofusion_onnx::export::is_fused;
use autofusion_onnx::proto::*;
use common::{node, value, weight};
use prost::Message;
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn tmp(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cli");
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_graph-autofusion")).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `python3 -c script args..` when Python has onnx and onnxruntime; `None` (said on stderr)
/// when it has not and CI did not ask for it.
fn python(script: &str, args: &[&Path]) -> Option<String> {
    let has = Command::new("python3")
        .args(["-c", "import onnx, onnxruntime, numpy"])
        .status()
        .is_ok_and(|s| s.success());
    if !has {
        assert!(
            std::env::var("AUTOFUSION_REQUIRE_ONNX_PY").is_err(),
            "AUTOFUSION_REQUIRE_ONNX_PY is set but python3 cannot import onnx, onnxruntime and numpy"
        );
        eprintln!(
            "NOT RUN: python3 has no onnx / onnxruntime (pip install -r peers/requirements.txt)"
        );
        return None;
    }
    let out = Command::new("python3").arg("-c").arg(script).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "python failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(stdout)
}

const CHECK: &str = r#"
import sys, numpy as np, onnx, onnxruntime as ort
orig, fused = sys.argv[1], sys.argv[2]
m = onnx.load(fused)
onnx.checker.check_model(m, full_check=True)
feeds = {}
rng = np.random.default_rng(1)
for i in onnx.load(orig).graph.input:
    dims = [d.dim_value if d.dim_value else 7 for d in i.type.tensor_type.shape.dim]
    et = i.type.tensor_type.elem_type
    if et in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
        # ids and masks: 0 and 1 are valid for any table and as a mask
        feeds[i.name] = rng.integers(0, 2, dims).astype(np.int64 if et == onnx.TensorProto.INT64 else np.int32)
    else:
        feeds[i.name] = rng.standard_normal(dims).astype(np.float32)
run = lambda p: ort.InferenceSession(p, providers=["CPUExecutionProvider"]).run(None, feeds)
diff = max(float(np.abs(a - b).max()) for a, b in zip(run(orig), run(fused)))
print(f"checker ok, {len(m.functions)} functions, max abs diff {diff}")
assert diff <= 1e-5, diff
"#;

#[test]
fn fuses_the_seed_layer_and_onnxruntime_runs_the_result() {
    let input = fixture("seed_d32.onnx");
    let (output, report, emit) = (tmp("seed_fused.onnx"), tmp("seed_report.md"), tmp("emit"));
    let (code, out, err) = run(&[
        "--input",
        input.to_str().unwrap(),
        "--output",
        output.to_str().unwrap(),
        "--fusion-rules",
        "all",
        "--opt-level",
        "3",
        "--emit-dir",
        emit.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    for want in [
        "[INFO] Graph `seed_d32`: found 45 operators",
        "[INFO] Estimated benefit:",
        "[INFO] Fused 45 operators into",
        "[INFO] Generated fused operator code:",
        "(flash_attention, layout_store) holds 6 nodes: qk, scores, p, pv, pv_t, a",
        "[INFO] ONNX graph: 31 nodes -> ",
    ] {
        assert!(out.contains(want), "missing `{want}` in:\n{out}");
    }
    assert!(emit.join("seed_d32.c").exists() && emit.join("include/autofusion/host.h").exists());
    assert!(std::fs::read_to_string(&report).unwrap().contains("## ONNX nodes left as they were"));
    let fused = autofusion_onnx::load(&output).unwrap();
    assert!(is_fused(&fused.proto));
    assert_eq!(fused.proto.functions.len(), out.matches("[INFO] Fused_").count());
    // Its own output: nothing to change, said so, bytes unchanged.
    let again = tmp("seed_again.onnx");
    let (code, out2, _) =
        run(&["--input", output.to_str().unwrap(), "--output", again.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(out2.contains("already fused"), "{out2}");
    assert_eq!(std::fs::read(&output).unwrap(), std::fs::read(&again).unwrap());
    if let Some(o) = python(CHECK, &[&input, &output]) {
        eprintln!("python: {o}");
    }
}

#[test]
fn every_opt_level_and_target_gives_a_model_onnxruntime_runs() {
    let input = fixture("seed_d32.onnx");
    for (level, target, rules) in [
        ("0", "host", "all"),
        ("2", "ascend910b", "all"),
        ("3", "host", "none"),
        ("3", "host", "linear_epilogue,flash_attention"),
    ] {
        let output = tmp(&format!("seed_{level}_{target}.onnx"));
        let (code, out, err) = run(&[
            "--input",
            input.to_str().unwrap(),
            "--output",
            output.to_str().unwrap(),
            "--opt-level",
            level,
            "--target",
            target,
            "--fusion-rules",
            rules,
        ]);
        assert_eq!(code, 0, "{out}\n{err}");
        let m = autofusion_onnx::load(&output).unwrap();
        let fused_nodes = out.matches("[INFO] Fused_").count();
        assert_eq!(m.proto.functions.len(), fused_nodes);
        if level == "0" || rules == "none" {
            assert_eq!(fused_nodes, 0, "nothing fuses at opt_level 0 or without rules:\n{out}");
        } else {
            assert!(fused_nodes > 0, "{out}");
        }
        python(CHECK, &[&input, &output]);
    }
}

/// The BERT and Llama layers exported by both of torch.onnx's exporters (`fixtures/
/// export_torch.py`): every node imported (nothing left as it was for want of an op), and the
/// fused model passes the checker and runs in onnxruntime with the original's outputs.
#[test]
fn torch_exported_layers_fuse_and_run_in_onnxruntime() {
    for name in ["bert_layer_ts", "bert_layer_dy", "llama_layer_ts", "llama_layer_dy"] {
        let input = fixture(&format!("{name}.onnx"));
        let output = tmp(&format!("{name}_fused.onnx"));
        let (code, out, err) =
            run(&["--input", input.to_str().unwrap(), "--output", output.to_str().unwrap()]);
        assert_eq!(code, 0, "{name}:\n{out}\n{err}");
        assert!(!out.contains("[WARN] Left as it is"), "{name}: an op was not imported:\n{out}");
        assert!(out.matches("[INFO] Fused_").count() >= 5, "{name}:\n{out}");
        // No --emit-dir: the summary says where the code is rather than naming no file.
        assert!(out.contains("code: kept in memory (not written to a file)"), "{name}:\n{out}");
        python(CHECK, &[&input, &output]);
    }
}

/// A model with int64 inputs (`input_ids`, `attention_mask`: `fixtures/make_int_fixtures.py`):
/// every node imported (Gather, GatherND, CumSum, Equal, Where on computed tensors), and the
/// fused model runs in onnxruntime with the original's outputs.
#[test]
fn a_model_with_int64_ids_fuses_and_runs_in_onnxruntime() {
    let input = fixture("embed_ids.onnx");
    let output = tmp("embed_ids_fused.onnx");
    let (code, out, err) =
        run(&["--input", input.to_str().unwrap(), "--output", output.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(!out.contains("[WARN] Left as it is"), "an op was not imported:\n{out}");
    assert!(out.matches("[INFO] Fused_").count() >= 3, "{out}");
    python(CHECK, &[&input, &output]);
}

/// Runs a fused whole-model fixture (`export_torch.py`'s `*_model_*`) in onnxruntime on the
/// fixture's inputs and compares with what torch computed (1e-4).
const TORCH_CHECK: &str = r#"
import json, sys, numpy as np, onnxruntime as ort
fused, base = sys.argv[1], sys.argv[2]
meta = json.load(open(base + ".json"))
feeds = {n: np.fromfile(f"{base}.in{i}.bin", dtype="<i8").reshape(s)
         for i, (n, s, _) in enumerate(meta["inputs"])}
got = ort.InferenceSession(fused, providers=["CPUExecutionProvider"]).run(None, feeds)
for k, ((n, s), g) in enumerate(zip(meta["outputs"], got)):
    want = np.fromfile(f"{base}.out{k}.bin", dtype="<f4").reshape(s)
    err = float(np.abs(g - want).max())
    print(f"{n}: max abs diff from torch {err}")
    assert err <= 1e-4, (n, err)
"#;

/// Hugging Face's BertModel and LlamaForCausalLM exported whole by both torch.onnx exporters
/// (int64 token ids, attention mask, token types; batch and length dynamic): every node
/// imported, most of them fused, and the fused model runs in onnxruntime with torch's outputs
/// and the original model's.
#[test]
fn hugging_face_model_exports_fuse_and_run_in_onnxruntime_with_torchs_outputs() {
    for name in ["bert_model_ts", "bert_model_dy", "llama_model_ts", "llama_model_dy"] {
        let input = fixture(&format!("{name}.onnx"));
        let output = tmp(&format!("{name}_fused.onnx"));
        let (code, out, err) =
            run(&["--input", input.to_str().unwrap(), "--output", output.to_str().unwrap()]);
        assert_eq!(code, 0, "{name}:\n{out}\n{err}");
        assert!(!out.contains("[WARN] Left as it is"), "{name}: an op was not imported:\n{out}");
        assert!(out.matches("[INFO] Fused_").count() >= 15, "{name}:\n{out}");
        python(CHECK, &[&input, &output]);
        if let Some(o) = python(TORCH_CHECK, &[&output, &fixture(name)]) {
            eprintln!("{name}: {o}");
        }
    }
}

#[test]
fn bad_input_is_one_error_line_and_a_nonzero_exit() {
    let input = fixture("seed_d32.onnx");
    let garbage = tmp("garbage.onnx");
    std::fs::write(&garbage, b"\x0a\xff\xff\xff\xff\x0fnot a model").unwrap();
    let truncated = tmp("truncated.onnx");
    std::fs::write(&truncated, &std::fs::read(&input).unwrap()[..1000]).unwrap();
    let out = tmp("x.onnx");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["--input".into(), "/nonexistent/m.onnx".into()], "cannot read it"),
        (vec!["--input".into(), garbage.display().to_string()], "is not an ONNX model"),
        (vec!["--input".into(), truncated.display().to_string()], "is not an ONNX model"),
        (
            vec![
                "--input".into(),
                input.display().to_string(),
                "--fusion-rules".into(),
                "fast".into(),
            ],
            "unknown fusion rule `fast`",
        ),
        (
            vec!["--input".into(), input.display().to_string(), "--target".into(), "gpu".into()],
            "unknown --target `gpu`",
        ),
    ];
    for (mut args, want) in cases {
        args.extend(["--output".to_string(), out.display().to_string()]);
        let refs: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        let (code, stdout, stderr) = run(&refs);
        assert_eq!(code, 1, "{args:?}: {stdout}{stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one line: {stderr}");
        assert!(lines[0].starts_with("error: ") && lines[0].contains(want), "{stderr}");
    }
    // clap's own usage errors exit non-zero too.
    let (code, _, _) = run(&[
        "--input",
        input.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
        "--opt-level",
        "7",
    ]);
    assert_ne!(code, 0);
}

/// x: f32[S, 8] -> MatMul w1 -> Add b1 -> Atan (not taken by the importer) -> MatMul w2 -> Add
/// b2 -> Relu -> y; `typed`: the model records Atan's output type (`value_info`).
fn with_atan(typed: bool) -> ModelProto {
    let bias = |name: &str, n: i64| {
        let mut t = weight(name, 1, n);
        t.dims = vec![n];
        t
    };
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto { domain: String::new(), version: 17 }],
        graph: Some(GraphProto {
            name: "g".into(),
            node: vec![
                node("MatMul", &["x", "w1"], "h1"),
                node("Add", &["h1", "b1"], "h"),
                node("Atan", &["h"], "e"),
                node("MatMul", &["e", "w2"], "f1"),
                node("Add", &["f1", "b2"], "f"),
                node("Relu", &["f"], "y"),
            ],
            initializer: vec![
                weight("w1", 8, 16),
                bias("b1", 16),
                weight("w2", 16, 8),
                bias("b2", 8),
            ],
            input: vec![value("x", data_type::FLOAT, &["S", "8"])],
            output: vec![value("y", data_type::FLOAT, &["S", "8"])],
            value_info: if typed {
                vec![value("e", data_type::FLOAT, &["S", "16"])]
            } else {
                vec![]
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn an_unsupported_op_is_left_as_it_is_and_the_rest_fused() {
    for typed in [true, false] {
        let input = tmp(&format!("atan_{typed}.onnx"));
        std::fs::write(&input, with_atan(typed).encode_to_vec()).unwrap();
        let (output, report) =
            (tmp(&format!("atan_{typed}_fused.onnx")), tmp(&format!("atan_{typed}.md")));
        let (code, out, err) = run(&[
            "--input",
            input.to_str().unwrap(),
            "--output",
            output.to_str().unwrap(),
            "--report",
            report.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{out}\n{err}");
        assert!(
            out.contains("[WARN] Left as it is: `e`: Atan (17): op `Atan` is not supported"),
            "{out}"
        );
        let m = autofusion_onnx::load(&output).unwrap();
        let fused: Vec<Vec<String>> = m
            .proto
            .functions
            .iter()
            .map(|f| f.node.iter().map(|n| n.name.clone()).collect())
            .collect();
        let md = std::fs::read_to_string(&report).unwrap();
        assert!(md.contains("- `e`: not imported: Atan (17)"), "{md}");
        if typed {
            // Both sides of Atan are fused; Atan stays as it was between them.
            assert_eq!(fused, [vec!["h1", "h"], vec!["f1", "f", "y"]], "{out}");
        } else {
            // Atan's output has no recorded type: what reads it is left as it is too.
            assert_eq!(fused, [vec!["h1", "h"]], "{out}");
            assert!(md.contains("- `f1`: not imported: MatMul (17): reads `e`"), "{md}");
        }
        python(CHECK, &[&input, &output]);
    }
}

#[test]
fn gelu_written_with_erf_is_fused_with_its_linear_layer() {
    let input = fixture("mlp_gelu.onnx");
    let output = tmp("mlp_gelu_fused.onnx");
    let (code, out, err) =
        run(&["--input", input.to_str().unwrap(), "--output", output.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}\n{err}");
    let m = autofusion_onnx::load(&output).unwrap();
    let held: Vec<Vec<String>> =
        m.proto.functions.iter().map(|f| f.node.iter().map(|n| n.name.clone()).collect()).collect();
    assert_eq!(
        held,
        [
            vec!["h1", "h", "g_div", "g_erf", "g_add", "g_mul", "g"],
            vec!["f1", "f", "k_mul", "k_erf", "k_add", "k_half", "y"]
        ],
        "{out}"
    );
    python(CHECK, &[&input, &output]);
}
