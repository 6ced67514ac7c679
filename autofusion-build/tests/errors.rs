//! Errors found by build.rs are rendered with file:line:col, what and a hint, and `compile()`
//! exits with status 1 without a panic; front-end errors are left to the macro (rustc) unless
//! asked for.

use autofusion_build::FrontEndErrors;
use std::path::PathBuf;
use std::process::Command;

const BAD: &str = r#"use autofusion::prelude::*;

#[fused_graph(dims(D = 8), opt_level = 9)]
pub fn layer(x: Tensor<f32, {[S, D]}>, w: Tensor<f32, {[D, D]}>) -> Tensor<f32, {[S, D]}> {
    let hidden = matmul(x, w);
    silu(hiden)
}
"#;

fn fixture(name: &str, src: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("layers.rs");
    std::fs::write(&f, src).unwrap();
    f
}

#[test]
fn errors_are_rendered_with_locations() {
    let f = fixture("bad_graph", BAD);
    let e = autofusion_build::Builder::new()
        .file(&f)
        .out_dir(f.parent().unwrap())
        .front_end_errors(FrontEndErrors::Rendered)
        .try_compile("x")
        .unwrap_err();
    let shown = f.display().to_string();
    assert!(
        e.rendered.contains(&format!("error: bad value for `opt_level`: `9`\n  --> {shown}:3:40")),
        "{e}"
    );
    assert!(
        e.rendered.contains(&format!("error: unknown variable `hiden`\n  --> {shown}:6:10")),
        "{e}"
    );
    assert!(e.rendered.contains("6 |     silu(hiden)\n  |          ^^^^^"), "{e}");
    assert!(e.rendered.contains("= help: a variable with a similar name exists: `hidden`"), "{e}");
}

#[test]
fn missing_files_and_duplicate_names_are_errors() {
    let e = autofusion_build::Builder::new()
        .file("no/such/file.rs")
        .out_dir(env!("CARGO_TARGET_TMPDIR"))
        .try_compile("x")
        .unwrap_err();
    assert!(e.rendered.starts_with("error: cannot read `no/such/file.rs`"), "{e}");
    let g = "#[fused_graph(dims(D = 4))]\nfn twin(x: Tensor<f32, {[S, D]}>) -> Tensor<f32, {[S, D]}> { silu(x) }\n";
    let a = fixture("twin_a", g);
    let b = fixture("twin_b", g);
    let e = autofusion_build::Builder::new()
        .file(&a)
        .file(&b)
        .out_dir(a.parent().unwrap())
        .try_compile("x")
        .unwrap_err();
    assert!(e.rendered.contains("two fused graphs are named `twin`"), "{e}");
}

/// Re-entered by `compile_exits_with_status_1` in a child process.
#[test]
fn child_compile_bad_graph() {
    if std::env::var("AUTOFUSION_BUILD_TEST_CHILD").is_err() {
        return;
    }
    let f = fixture("bad_graph_child", BAD);
    autofusion_build::Builder::new()
        .file(&f)
        .out_dir(f.parent().unwrap())
        .front_end_errors(FrontEndErrors::Rendered)
        .compile("x");
    unreachable!("compile() returns only on success");
}

/// Re-entered by `front_end_errors_are_deferred_to_the_macro` in a child process.
#[test]
fn child_compile_deferred() {
    if std::env::var("AUTOFUSION_BUILD_TEST_DEFERRED").is_err() {
        return;
    }
    let f = fixture("deferred", &format!("{BAD}\n{GOOD}"));
    let out = autofusion_build::Builder::new()
        .file(&f)
        .out_dir(f.parent().unwrap())
        .try_compile("deferred")
        .unwrap();
    let names: Vec<&str> = out.graphs.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, ["verbose_graph"], "the bad graph is skipped, the good one built");
}

/// By default a graph with DSL errors is skipped with one warning, for the macro to report,
/// and the build succeeds.
#[test]
fn front_end_errors_are_deferred_to_the_macro() {
    let out =
        build_script_child("child_compile_deferred", &[("AUTOFUSION_BUILD_TEST_DEFERRED", "1")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let warning = "cargo:warning=autofusion: graph `layer` (";
    assert!(stdout.contains(warning) && stdout.contains("has errors; not built"), "{stdout}");
    assert!(!stdout.contains("unknown variable"), "the errors themselves are rustc's: {stdout}");
}

/// Run the test `name` of this binary in a child process with the environment cargo gives a
/// build script (cc reads it), plus `envs`.
fn build_script_child(name: &str, envs: &[(&str, &str)]) -> std::process::Output {
    let vv = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
        .arg("-vV")
        .output()
        .unwrap();
    let vv = String::from_utf8_lossy(&vv.stdout);
    let host = vv.lines().find_map(|l| l.strip_prefix("host: ")).unwrap().to_string();
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .envs(envs.iter().copied())
        .env("AUTOFUSION_PROFILE", "host")
        .env("TARGET", &host)
        .env("HOST", &host)
        .env("OPT_LEVEL", "0")
        .env("DEBUG", "false")
        .output()
        .unwrap()
}

#[test]
fn compile_exits_with_status_1() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_compile_bad_graph", "--nocapture", "--test-threads=1"])
        .env("AUTOFUSION_BUILD_TEST_CHILD", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("error: unknown variable `hiden`"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

const GOOD: &str = "#[fused_graph(dims(D = 4))]\nfn verbose_graph(x: Tensor<f32, {[S, D]}>) -> Tensor<f32, {[S, D]}> { silu(x) + x }\n";

/// Re-entered by `verbose_prints_the_summary_as_cargo_warnings` in a child process.
#[test]
fn child_compile_verbose() {
    if std::env::var("AUTOFUSION_BUILD_TEST_VERBOSE").is_err() {
        return;
    }
    let f = fixture("verbose_graph", GOOD);
    let out = autofusion_build::Builder::new()
        .file(&f)
        .out_dir(f.parent().unwrap())
        .try_compile("verbose_test")
        .unwrap();
    assert_eq!(out.graphs.len(), 1);
}

#[test]
fn verbose_prints_the_summary_as_cargo_warnings() {
    let out = build_script_child(
        "child_compile_verbose",
        &[("AUTOFUSION_BUILD_TEST_VERBOSE", "1"), ("AUTOFUSION_VERBOSE", "1")],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.contains("cargo:warning=[INFO] Graph `verbose_graph`: found 2 operators"),
        "{stdout}"
    );
    assert!(stdout.contains("cargo:warning=[INFO] Fused 2 operators into 1 kernels"), "{stdout}");
    assert!(stdout.contains("cargo:rustc-env=AUTOFUSION_GRAPH_VERBOSE_GRAPH="), "{stdout}");
    // The report says which rules can apply, and why there is no SVG when there is none.
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("verbose_graph/autofusion/verbose_graph");
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(report.contains("rules that apply at it: elementwise_chain"), "{report}");
    assert!(!report.contains("flash_attention"), "a rule of opt_level 3 at opt_level 2: {report}");
    let svg = dir.join("after.svg").exists();
    assert_eq!(svg, !report.contains("No SVG of the graphs was made"), "{report}");
}
