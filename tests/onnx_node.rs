//! The onnx package's backend node tests (generated from the pip package by
//! `autofusion-onnx/tests/node/gen_node_tests.py`) for every op the importer takes: each model
//! is imported, planned at opt_level 3, generated, compiled and run on the host, and its
//! outputs compared with the test's expected outputs at the dtype's tolerance (integers and
//! bools exactly). Integer and bool graph inputs are fed as tensors, except those only read
//! where ONNX wants shapes or axes (`SHAPE_INPUTS`), which become constants from the test's own
//! data, as a model carrying them as initializers would have them.
//!
//! Not run, and counted by reason: element types outside f32 / f16 / bf16 / i64 / i32 / bool,
//! opsets outside the importer's, models that fold to a constant, and the limits listed in
//! `LIMITS` (README, "ONNX models"). Anything else the importer or the compiler refuses is a
//! failure. Needs python3 with onnx (CI installs it and sets AUTOFUSION_REQUIRE_ONNX_PY=1);
//! without it the test says it did not run.

mod common;

use autofusion::Tensor;
use autofusion_compiler::{target::Target, Options, Unit, Variant};
use autofusion_onnx::proto::{data_type, ModelProto, TensorProto};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The ops of `autofusion_onnx::import` (README, "ONNX models").
const OPS: &[&str] = &[
    "MatMul",
    "Gemm",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Pow",
    "Max",
    "Min",
    "Neg",
    "Exp",
    "Log",
    "Sqrt",
    "Reciprocal",
    "Tanh",
    "Sigmoid",
    "Relu",
    "Erf",
    "Sin",
    "Cos",
    "Gelu",
    "Softmax",
    "LayerNormalization",
    "ReduceMean",
    "ReduceSum",
    "ReduceMax",
    "Cast",
    "Identity",
    "Transpose",
    "Reshape",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Concat",
    "Slice",
    "Shape",
    "Gather",
    "GatherND",
    "Constant",
    "Split",
    "Size",
    "ConstantOfShape",
    "Range",
    "Equal",
    "Less",
    "LessOrEqual",
    "Greater",
    "GreaterOrEqual",
    "Not",
    "And",
    "Or",
    "Xor",
    "Where",
    "Expand",
    "CumSum",
];

/// Inputs that ONNX reads as shapes, axes or bounds: (op, input index). A graph input read
/// only there becomes a constant.
const SHAPE_INPUTS: &[(&str, usize)] = &[
    ("Reshape", 1),
    ("Expand", 1),
    ("Slice", 1),
    ("Slice", 2),
    ("Slice", 3),
    ("Slice", 4),
    ("Squeeze", 1),
    ("Unsqueeze", 1),
    ("Split", 1),
    ("CumSum", 1),
    ("ReduceMean", 1),
    ("ReduceSum", 1),
    ("ReduceMax", 1),
    ("ConstantOfShape", 0),
    ("Range", 0),
    ("Range", 1),
    ("Range", 2),
];

/// What the importer does not take of a listed op, by test name (substring) and reason; each
/// is in the README's list of limits.
const LIMITS: &[(&str, &str)] = &[
    ("window_expanded", "Range whose length is computed from input values"),
    ("window_symmetric_expanded", "Range whose length is computed from input values"),
    ("test_pow_types_int", "Pow of integer bases"),
    (
        "test_flexattention_causal_mask_expanded",
        "constant integer tensors other than fills and progressions read as tensors",
    ),
    (
        "test_flexattention_relative_positional_expanded",
        "constant float tensors of a Constant node read by elementwise ops",
    ),
];

fn generate() -> Option<PathBuf> {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("onnx_node_tests");
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("autofusion-onnx/tests/node/gen_node_tests.py");
    let _ = std::fs::remove_dir_all(&out);
    let st = Command::new("python3").arg(&script).arg(&out).args(OPS).output();
    match st {
        Ok(o) if o.status.success() => Some(out),
        other => {
            let why = match other {
                Ok(o) => {
                    String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("").to_string()
                }
                Err(e) => e.to_string(),
            };
            assert!(
                std::env::var("AUTOFUSION_REQUIRE_ONNX_PY").is_err(),
                "AUTOFUSION_REQUIRE_ONNX_PY is set but the node tests could not be generated: {why}"
            );
            eprintln!("NOT RUN: cannot generate the onnx node tests ({why}); pip install -r peers/requirements.txt");
            None
        }
    }
}

/// The test data set's tensors, in file order (`input_0.pb`, ...).
fn data_set(dir: &Path, kind: &str) -> Vec<TensorProto> {
    let mut out = Vec::new();
    for j in 0.. {
        let p = dir.join(format!("{kind}_{j}.pb"));
        if !p.exists() {
            break;
        }
        out.push(autofusion_onnx::load::read_tensor(&p).unwrap());
    }
    out
}

/// A test tensor as ours: floats widened and stored as their type, integers and bools as
/// they are; `None` for any other element type.
fn to_tensor(t: &TensorProto) -> Option<Tensor> {
    let int = match t.data_type {
        data_type::INT64 => Some(autofusion::DType::I64),
        data_type::INT32 => Some(autofusion::DType::I32),
        data_type::BOOL => Some(autofusion::DType::Bool),
        _ => None,
    };
    if let Some(dtype) = int {
        let shape: Vec<usize> =
            t.dims.iter().map(|d| usize::try_from(*d).ok()).collect::<Option<_>>()?;
        let n: usize = shape.iter().product();
        let bytes = autofusion_onnx::load::tensor_bytes(t, Path::new("."), dtype.size(), n).ok()?;
        return Tensor::from_le_bytes(dtype, &shape, &bytes).ok();
    }
    let f = autofusion_onnx::load::tensor_f32(t, Path::new(".")).ok()??;
    let (shape, v) = (f.shape, f.data);
    let dtype = match f.data_type {
        data_type::FLOAT16 => autofusion::DType::F16,
        data_type::BFLOAT16 => autofusion::DType::BF16,
        _ => autofusion::DType::F32,
    };
    Tensor::from_f32_as(&shape, &v, dtype).ok()
}

enum Outcome {
    Pass,
    Unsupported(String),
    Fail(String),
}

/// Why the importer refused a model: an element type or an opset it does not take, or a model
/// that computes nothing at run time, are not run; anything else is a failure.
fn import_refused(msg: &str, context: &str) -> Outcome {
    let not_run = msg.contains("element type")
        || msg.contains("Cast to type")
        || (msg.starts_with("opset ") && msg.ends_with("is not supported"))
        || msg.contains("is a constant: nothing to compute");
    if not_run {
        Outcome::Unsupported(format!("import: {msg}"))
    } else {
        Outcome::Fail(format!("import: {msg} ({context})"))
    }
}

/// One node test: integer inputs read as shapes folded in as constants, the rest run on the
/// fused host build and on the reference interpreter.
fn run_one(dir: &Path, target: &Target, out_dir: &Path) -> Outcome {
    let ds = dir.join("test_data_set_0");
    if ds.join("skip").exists() {
        return Outcome::Unsupported("inputs or outputs that are not tensors".into());
    }
    let mut model = match autofusion_onnx::load(&dir.join("model.onnx")) {
        Ok(m) => m,
        Err(e) => return Outcome::Fail(format!("the model does not load: {e}")),
    };
    let proto: &mut ModelProto = &mut model.proto;
    let (inputs, outputs) = (data_set(&ds, "input"), data_set(&ds, "output"));
    // Integer inputs read only as shapes or axes -> initializers with the test's values.
    let g = proto.graph.as_mut().unwrap();
    let mut feeds: Vec<(String, Tensor)> = Vec::new();
    let names: Vec<String> = g.input.iter().map(|i| i.name.clone()).collect();
    for (j, name) in names.iter().enumerate() {
        let Some(t) = inputs.get(j) else { return Outcome::Fail("missing input data".into()) };
        let readers = g.node.iter().flat_map(|n| {
            n.input
                .iter()
                .enumerate()
                .filter(|(_, x)| *x == name)
                .map(|(k, _)| (n.op_type.as_str(), k))
        });
        let shape_only =
            readers.clone().count() > 0 && readers.into_iter().all(|r| SHAPE_INPUTS.contains(&r));
        if shape_only {
            let mut t = t.clone();
            t.name = name.clone();
            g.initializer.push(t);
            g.input.retain(|i| &i.name != name);
        } else {
            match to_tensor(t) {
                Some(x) => feeds.push((name.clone(), x)),
                None => {
                    return Outcome::Unsupported(format!("input of element type {}", t.data_type))
                }
            }
        }
    }
    let imported = match autofusion_onnx::import(&model, "node_test") {
        Ok(i) => i,
        Err(e) => return import_refused(&e.msg, &e.context),
    };
    let weights = imported.weights.clone();
    let unit = match Unit::from_graph(
        imported.graph.clone(),
        Options { opt_level: 3, ..Options::default() },
    ) {
        Ok(u) => u,
        Err(e) => return Outcome::Fail(format!("compiler: {e}")),
    };
    if unit.graph.kernel_op_count() == 0 {
        return Outcome::Unsupported(
            "no op left to run (the model folds to a constant or a view)".into(),
        );
    }
    let want: Vec<Tensor> = match outputs.iter().map(to_tensor).collect::<Option<_>>() {
        Some(w) => w,
        None => return Outcome::Unsupported("an output of another element type".into()),
    };
    // -O1: these kernels are tiny and only their values are checked; it halves compile time.
    let m = match common::load(&unit, Variant::Fused, target, out_dir, &["-O1"]) {
        Ok(m) => m,
        Err(e) => return Outcome::Fail(format!("build: {e}")),
    };
    // Weights (float constants of several elements) are read from the model, as any are.
    for (p, wname) in &weights {
        let node = unit.graph.node(unit.graph.param_nodes()[*p]);
        let shape: Vec<usize> = node.shape.iter().map(|e| e.as_const().unwrap() as usize).collect();
        let bytes = match imported.weight_bytes(&model, *p) {
            Ok(b) => b,
            Err(e) => return Outcome::Fail(format!("weight `{wname}`: {e}")),
        };
        feeds.push((wname.clone(), Tensor::from_le_bytes(node.dtype, &shape, &bytes).unwrap()));
    }
    let mut params: Vec<&Tensor> = Vec::new();
    for p in &unit.graph.params {
        match feeds.iter().find(|(n, _)| n == p) {
            Some((_, t)) => params.push(t),
            None => {
                return Outcome::Fail(format!("parameter `{p}` is neither an input nor a weight"))
            }
        }
    }
    for (what, got) in [("fused", m.run(&params)), ("reference", m.reference(&params))] {
        let got = match got {
            Ok(g) => g,
            Err(e) => return Outcome::Fail(format!("{what}: {e}")),
        };
        if got.len() != want.len() {
            return Outcome::Fail(format!("{what}: {} outputs, want {}", got.len(), want.len()));
        }
        for (k, (a, b)) in got.iter().zip(&want).enumerate() {
            let b = b.to_dtype(a.dtype()).unwrap();
            let (rtol, atol) = autofusion::tolerance(b.dtype());
            let ok = a.shape() == b.shape() && a.allclose(&b, rtol, atol).unwrap_or(false);
            if !ok {
                let (x, y) = (a.to_f32_vec(), b.to_f32_vec());
                let first = x.iter().zip(&y).position(|(p, q)| p.to_bits() != q.to_bits());
                return Outcome::Fail(format!(
                    "{what}: output {k} {:?} vs expected {:?}: max abs diff {:?}, first \
                     difference at {first:?}: {:?} vs {:?}",
                    a.shape(),
                    b.shape(),
                    a.max_abs_diff(&b).ok(),
                    first.map(|i| x[i]),
                    first.map(|i| y[i]),
                ));
            }
        }
    }
    Outcome::Pass
}

#[test]
fn onnx_backend_node_tests_of_supported_ops() {
    let Some(root) = generate() else { return };
    let target = Target::host();
    let out_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("onnx_node_build");
    // AUTOFUSION_NODE_TEST=substring runs the matching tests only (for debugging).
    let only = std::env::var("AUTOFUSION_NODE_TEST").ok();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| only.as_ref().is_none_or(|o| p.to_string_lossy().contains(o.as_str())))
        .collect();
    dirs.sort();
    let (mut pass, mut fails) = (0, Vec::new());
    let mut unsupported: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for d in &dirs {
        let name = d.file_name().unwrap().to_string_lossy().into_owned();
        if let Some((_, why)) = LIMITS.iter().find(|(t, _)| name.contains(t)) {
            unsupported.entry(format!("a listed limit: {why}")).or_default().push(name);
            continue;
        }
        match run_one(d, &target, &out_dir) {
            Outcome::Pass => pass += 1,
            Outcome::Unsupported(why) => unsupported.entry(why).or_default().push(name),
            Outcome::Fail(why) => fails.push(format!("{name}: {why}")),
        }
    }
    let n_unsup: usize = unsupported.values().map(Vec::len).sum();
    eprintln!(
        "onnx node tests: {} of the supported ops' tests, {pass} pass, {} fail, {n_unsup} not run:",
        dirs.len(),
        fails.len()
    );
    for (why, names) in &unsupported {
        eprintln!("  not run ({}): {why}: {}", names.len(), names.join(" "));
    }
    assert!(fails.is_empty(), "{} node tests fail:\n{}", fails.len(), fails.join("\n"));
    assert!(only.is_some() || pass >= 100, "only {pass} node tests ran");
}
