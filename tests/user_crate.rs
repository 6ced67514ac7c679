//! A crate of a user's own (tests/fixtures/user_crate: three layers, a build.rs, autofusion as a
//! path dependency), built by cargo the way a user builds it:
//! - none of autofusion's own example and test graphs are compiled into it;
//! - a build that leaves a graph's code alone compiles nothing of it (no-op, comment change,
//!   one graph changed: only that graph's objects are new);
//! - a DSL mistake is rustc's spanned error, not a failed build script;
//! - an ONNX model built with `Builder::onnx` runs from the crate, its weights read from the
//!   model file (a changed file is an error), agreeing with onnxruntime's stored output.
//!
//! Prints the build times (`cargo test --test user_crate -- --nocapture`). The fixture's
//! target dir is `target/user-crate` and persists, so only the first run compiles the
//! dependencies.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Instant, SystemTime};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A fresh copy of the fixture crate, with the repository root filled into its manifest and
/// this workspace's lock file (so the build resolves offline to the versions tested here).
fn fixture_copy() -> PathBuf {
    let src = root().join("tests/fixtures/user_crate");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("user_crate");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("src")).unwrap();
    let manifest = std::fs::read_to_string(src.join("Cargo.toml.in")).unwrap();
    let root = root().display().to_string();
    std::fs::write(dir.join("Cargo.toml"), manifest.replace("ROOT", &root)).unwrap();
    std::fs::copy(root.clone() + "/Cargo.lock", dir.join("Cargo.lock")).unwrap();
    std::fs::create_dir_all(dir.join("src/bin")).unwrap();
    for f in ["build.rs", "src/lib.rs", "src/layers.rs", "src/bin/run_seed.rs"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    // The ONNX model its build.rs builds with `Builder::onnx`, and what onnxruntime computed.
    let onnx = root.clone() + "/autofusion-onnx/tests/fixtures/seed_d32";
    std::fs::copy(onnx.clone() + ".onnx", dir.join("seed.onnx")).unwrap();
    for f in ["x.bin", "y.bin"] {
        std::fs::copy(format!("{onnx}.{f}"), dir.join(f)).unwrap();
    }
    dir
}

/// `cargo run --bin run_seed` of the fixture with `args`.
fn run_seed(dir: &Path, args: &[&str]) -> Output {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    Command::new(cargo)
        .args(["run", "--offline", "-j2", "-q", "--bin", "run_seed", "--"])
        .args(args)
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target_dir())
        .env("AUTOFUSION_PROFILE", "host")
        .output()
        .unwrap()
}

fn target_dir() -> PathBuf {
    root().join("target/user-crate")
}

/// `cargo build` of the fixture; its output and the seconds it took.
fn cargo_build(dir: &Path) -> (Output, f64) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let start = Instant::now();
    let out = Command::new(cargo)
        .args(["build", "--offline", "-j2"])
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target_dir())
        .env("AUTOFUSION_PROFILE", "host")
        .env_remove("AUTOFUSION_VERBOSE")
        .output()
        .unwrap();
    (out, start.elapsed().as_secs_f64())
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Every file under `dir` whose name ends with `suffix`, with its modification time.
fn files_under(dir: &Path, suffix: &str, into: &mut BTreeMap<PathBuf, SystemTime>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            files_under(&p, suffix, into);
        } else if p.to_string_lossy().ends_with(suffix) {
            into.insert(p.clone(), e.metadata().unwrap().modified().unwrap());
        }
    }
}

/// The kernel objects of the fixture's builds, by path, with their mtimes.
fn kernel_objects() -> BTreeMap<PathBuf, SystemTime> {
    let mut out = BTreeMap::new();
    let build = target_dir().join("debug/build");
    for e in std::fs::read_dir(&build).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with("user-crate-") {
            files_under(&e.path().join("out/autofusion"), ".o", &mut out);
        }
    }
    out
}

/// Objects of graph `name` (its folder) among `objs`.
fn of_graph<'a>(objs: &'a BTreeMap<PathBuf, SystemTime>, name: &str) -> Vec<&'a PathBuf> {
    objs.keys().filter(|p| p.parent().is_some_and(|d| d.ends_with(name))).collect()
}

fn edit(dir: &Path, from: &str, to: &str) {
    let f = dir.join("src/layers.rs");
    let text = std::fs::read_to_string(&f).unwrap();
    assert!(text.contains(from), "fixture text `{from}` missing");
    std::fs::write(&f, text.replacen(from, to, 1)).unwrap();
}

#[test]
fn a_user_crate_builds_incrementally_and_reports_dsl_errors_through_rustc() {
    let dir = fixture_copy();
    let (out, first) = cargo_build(&dir);
    assert!(out.status.success(), "first build failed:\n{}", stderr(&out));
    eprintln!("user crate build: first {first:.1} s");

    // Nothing of autofusion's own: its build script compiled no graph for this crate.
    let mut ours = BTreeMap::new();
    for e in std::fs::read_dir(target_dir().join("debug/build")).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("autofusion-") && !name.starts_with("autofusion-build") {
            files_under(&e.path().join("out"), ".o", &mut ours);
        }
    }
    assert!(ours.is_empty(), "autofusion compiled its own graphs into a user's build: {ours:?}");
    let objs = kernel_objects();
    for g in ["swiglu_ffn", "attention_block", "gelu_mlp", "seed_onnx"] {
        assert_eq!(of_graph(&objs, g).len(), 2, "{g}: a fused and an unfused object: {objs:?}");
    }

    // The ONNX model built with Builder::onnx runs from the crate with its weights read from
    // the model file, and agrees with what onnxruntime computed.
    let out = run_seed(&dir, &["x.bin", "y.bin"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", stderr(&out));
    assert_eq!(text.matches("vs onnxruntime").count(), 3, "{text}");
    eprint!("{text}");
    // A copy of the model with one weight byte changed is refused, naming file and weight.
    let mut bytes = std::fs::read(dir.join("seed.onnx")).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0x55; // inside the weights, which are most of the file
    std::fs::write(dir.join("changed.onnx"), &bytes).unwrap();
    let out = run_seed(&dir, &["x.bin", "y.bin", "changed.onnx"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("changed.onnx: weight `") && err.contains("rebuild"), "{err}");

    let (out, noop) = cargo_build(&dir);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(kernel_objects(), objs, "a no-op build compiles nothing");

    edit(&dir, "/// GELU MLP.", "/// GELU MLP (two layers).");
    let (out, comment) = cargo_build(&dir);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(kernel_objects(), objs, "a comment change compiles no kernel");

    edit(&dir, "matmul(gelu(linear(x, w1, b1)), w2)", "matmul(silu(linear(x, w1, b1)), w2)");
    let (out, one_graph) = cargo_build(&dir);
    assert!(out.status.success(), "{}", stderr(&out));
    let after = kernel_objects();
    for (p, t) in &after {
        let changed = objs.get(p) != Some(t);
        assert_eq!(changed, p.parent().unwrap().ends_with("gelu_mlp"), "{}", p.display());
    }
    eprintln!(
        "user crate build: no-op {noop:.1} s, comment change {comment:.1} s, one graph changed {one_graph:.1} s"
    );

    edit(&dir, "silu(linear(x, w1, b1))", "silu(linear(x, w1, bias))");
    let (out, _) = cargo_build(&dir);
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(!err.contains("failed to run custom build command"), "{err}");
    assert!(err.contains("error: unknown variable `bias`"), "{err}");
    assert!(err.contains("src/layers.rs:"), "the error points at the user's code: {err}");
    assert!(err.contains("graph `gelu_mlp` ("), "one warning names the skipped graph: {err}");
}
