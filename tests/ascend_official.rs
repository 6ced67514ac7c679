//! Generated Ascend C against the official Ascend C and AscendCL headers: every layer graph at
//! every opt level and with each rule alone, fused and unfused, and the random graphs, each
//! file type-checked by `ascend-check/check.sh` with `STRICT=1` (`-Wall -Werror`) in the
//! asc-devkit's CPU-debug configuration for dav-2201. `ascend-sim` agrees with our own reading
//! of the API; these headers are the judge of names, namespaces, signatures, template
//! arguments and deprecations.
//!
//! The checker lives outside the repository (39 MB of pinned vendor headers): the test uses
//! `AUTOFUSION_ASCEND_CHECK` (the path of `check.sh`; then it must exist), else
//! `../shared/ascend-check/check.sh` next to the repository, else it says it did not run (and
//! fails when `AUTOFUSION_REQUIRE_ASCEND_CHECK` is set, as CI sets it).
//!
//! A file takes about 3.6 s to check when g++ parses the devkit's headers itself, about 1.3 s
//! with the precompiled header below, so by default
//! the set is: every layer graph at every opt level (opt_level 0 is one kernel per op, what
//! the unfused variant generates too), each rule alone on the seed layer, the integer and
//! batched graphs of `tests/integer_graphs` and `tests/batched_graphs` and the decoder with KV
//! caches of `tests/decoder_graphs` at opt_level 0 and 3,
//! and six random graphs at opt_level 3 (about 50 files, 61 s on 2 cores).
//! `AUTOFUSION_ASCEND_CHECK_ALL=1` checks every plan the Ascend tests build, fused and unfused
//! (each rule alone on every layer graph, all random graphs at opt_level 2 and 3: about 170
//! files; 14 minutes on 2 cores before the precompiled header).

#[path = "batched_graphs/mod.rs"]
mod batched_graphs;
mod common;
#[path = "decoder_graphs/mod.rs"]
mod decoder_graphs;
#[path = "integer_graphs/mod.rs"]
mod integer_graphs;

use autofusion_compiler::codegen::ascend::Ascend;
use autofusion_compiler::front::Options;
use autofusion_compiler::{target::Target, Unit, Variant};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

fn check_script() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("AUTOFUSION_ASCEND_CHECK") {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "AUTOFUSION_ASCEND_CHECK={} is not a file", p.display());
        return Some(p);
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/ascend-check/check.sh");
    p.is_file().then_some(p)
}

/// Every distinct generated file: source text -> what it is (the first plan that made it).
/// `all`: every plan the Ascend tests build, else the default set (see the module docs).
fn generated_files(all: bool) -> BTreeMap<String, String> {
    let target = Target::ascend910b();
    let backend = Ascend::new(target);
    let mut files = BTreeMap::new();
    let mut seen = std::collections::BTreeSet::new();
    let variants: &[Variant] =
        if all { &[Variant::Unfused, Variant::Fused] } else { &[Variant::Fused] };
    let mut add = |what: String, unit: &Unit| {
        for &v in variants {
            let built = unit.build(&backend, v).unwrap_or_else(|e| panic!("{what}: {e}"));
            // Plans that generate the same kernels (up to names) are checked once.
            let key = format!("{} {v:?} {}", unit.graph.dump(), common::plan_key(&built.plan));
            if seen.insert(key) {
                files.entry(built.source.code).or_insert_with(|| format!("{what}, {v:?}"));
            }
        }
    };
    for (name, item, base) in common::layer_graphs() {
        let every_rule = all || name == "seed_layer";
        for (label, level, rules) in common::ascend_configs() {
            if !every_rule && label.contains("rules") {
                continue;
            }
            let opts = Options { opt_level: level, rules, ..base.clone() };
            add(format!("{name}, {label}"), &Unit::with_options(opts, &item).unwrap());
        }
    }
    // bert_embed's graphs, every size a dynamic dim (hidden, heads, head size, vocabulary...).
    for (name, item, base) in common::graphs_of("examples/bert_embed/src/graphs.rs") {
        for level in [0u8, 3] {
            let opts = Options { opt_level: level, ..base.clone() };
            add(
                format!("bert_embed {name} at opt_level {level}"),
                &Unit::with_options(opts, &item).unwrap(),
            );
        }
    }
    // Whole Hugging Face models as torch.onnx exports them (export_torch.py), imported.
    let fixtures =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("autofusion-onnx/tests/fixtures");
    let exported = ["bert_model_dy", "llama_model_ts"].map(|name| {
        let model = autofusion_onnx::load(&fixtures.join(format!("{name}.onnx"))).unwrap();
        autofusion_onnx::import(&model, name).unwrap().graph
    });
    let graphs = [
        integer_graphs::int_ops(),
        integer_graphs::hf_masks(),
        integer_graphs::embeddings(),
        batched_graphs::attention(true, false),
        batched_graphs::encoder_layer(),
        decoder_graphs::decoder_layer(decoder_graphs::SMALL),
    ]
    .into_iter()
    .chain(decoder_graphs::cache_layouts())
    .chain(exported);
    for graph in graphs {
        for level in [0u8, 3] {
            let opts = autofusion_compiler::Options { opt_level: level, ..Default::default() };
            add(
                format!("{} at opt_level {level}", graph.name),
                &Unit::from_graph(graph.clone(), opts).unwrap(),
            );
        }
    }
    for (seed, level, _, unit) in common::random_units() {
        if all || (seed < 6 && level == 3) {
            add(format!("random graph {seed} at opt_level {level}"), &unit);
        }
    }
    // The decoder planned with launches priced dear: each RMSNorm (statistics included) in
    // the projections that read it, staged by the vector cores.
    let dear = Target { launch_us: 50.0, inline_below_elems: 0, ..Target::ascend910b() };
    let opts = autofusion_compiler::Options { opt_level: 3, ..Default::default() };
    let unit =
        Unit::from_graph(decoder_graphs::decoder_layer(decoder_graphs::SMALL), opts).unwrap();
    let built = unit.build(&Ascend::new(dear.clone()), Variant::Fused).unwrap();
    files.entry(built.source.code).or_insert_with(|| "decoder_kv, launches priced dear".into());
    // A horizontal kernel of two Matmul objects whose parts stage their normed A.
    let mut rules = autofusion_compiler::plan::RuleSet::all();
    rules.insert(autofusion_compiler::plan::Rule::QkvHorizontal);
    let opts = autofusion_compiler::Options { opt_level: 3, rules, ..Default::default() };
    let unit = Unit::from_graph(decoder_graphs::mixed_projections(), opts).unwrap();
    let built = unit.build(&Ascend::new(dear.clone()), Variant::Fused).unwrap();
    assert!(built.source.code.contains("mm1.End();"), "no horizontal kernel of two objects");
    files.entry(built.source.code).or_insert_with(|| "mixed projections, horizontal".into());
    // RoPE and the cache writes in the projections' epilogues (head by head, the rotation's
    // partner read from the C tile), alone and as parts of a horizontal kernel.
    let six = decoder_graphs::Sizes { d: 24, h: 6, kvh: 3, dh: 6, f: 40 };
    for horizontal in [false, true] {
        let mut rules = autofusion_compiler::plan::RuleSet::all();
        if horizontal {
            rules.insert(autofusion_compiler::plan::Rule::QkvHorizontal);
        }
        let opts = autofusion_compiler::Options { opt_level: 3, rules, ..Default::default() };
        let unit = Unit::from_graph(decoder_graphs::decoder_layer(six), opts).unwrap();
        let built = unit.build(&Ascend::new(dear.clone()), Variant::Fused).unwrap();
        assert!(built.source.code.contains("hh = n0 / W"), "no epilogue walking heads");
        let what = format!("decoder_kv dh 6, RoPE in the epilogues, horizontal {horizontal}");
        files.entry(built.source.code).or_insert_with(|| what);
    }
    files
}

/// The include every generated Ascend C file starts with.
const FIRST_INCLUDE: &str = "#include \"kernel_operator.h\"";

/// The official headers every file includes, parsed once into a GCC precompiled header that
/// each check reads with `-include` (about 1.3 s a file instead of 3.6 s). The headers are
/// the same files with the same macros as `check.sh` gives g++ (mirrored here): the checks
/// are unchanged, and if the two ever disagree GCC ignores the precompiled header (it checks
/// the macros it was built with) and parses the headers as before. `None` when it does not
/// build (g++'s message on stderr): every file is then checked without it.
fn precompiled_header(script: &Path, dir: &Path) -> Option<PathBuf> {
    let here = script.parent()?;
    let d = here.join("devkit");
    let header = dir.join("official.h");
    let text = format!("#include \"cpu_debug_launch.h\"\n{FIRST_INCLUDE}\n");
    std::fs::write(&header, text).ok()?;
    let mut cmd = Command::new("g++");
    cmd.args(["-std=c++17", "-x", "c++-header", "-Wall", "-Werror"]);
    cmd.args(["-DASCENDC_CPU_DEBUG=1", "-DASCENDC_DEBUG=1", "-DASCENDC_DUMP=0"]);
    cmd.args(["-D__NPU_ARCH__=2201", "-D__DAV_C220__", "-D__disable_kernel_type_autoinfer__="]);
    cmd.arg("-D_GLIBCXX_USE_CXX11_ABI=0");
    let sys = [here.join("stubs"), here.join("gen"), d.clone()].into_iter().chain(
        [
            "include",
            "include/basic_api",
            "include/adv_api",
            "include/utils",
            "impl",
            "impl/basic_api",
            "impl/adv_api",
            "impl/utils",
        ]
        .map(|s| d.join(s)),
    );
    for p in sys.chain([here.join("runtime/include/external")]) {
        cmd.arg("-isystem").arg(p);
    }
    let out = cmd.arg(&header).arg("-o").arg(dir.join("official.h.gch")).output().ok()?;
    if !out.status.success() {
        eprintln!(
            "the official headers did not precompile (each file parses them itself):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    Some(header)
}

#[test]
fn generated_ascend_c_compiles_against_the_official_headers() {
    let Some(script) = check_script() else {
        // CI asks for the check: there, a missing checker is a failure, not a pass.
        assert!(
            std::env::var("AUTOFUSION_REQUIRE_ASCEND_CHECK").is_err(),
            "AUTOFUSION_REQUIRE_ASCEND_CHECK is set but no ascend-check was found (set AUTOFUSION_ASCEND_CHECK to its check.sh)"
        );
        eprintln!("NOT RUN: no ascend-check (set AUTOFUSION_ASCEND_CHECK to its check.sh)");
        return;
    };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ascend_official");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    autofusion_compiler::codegen::write_headers(&dir.join("include")).unwrap();
    let all = std::env::var("AUTOFUSION_ASCEND_CHECK_ALL").is_ok_and(|v| v == "1");
    let files: Vec<(PathBuf, String)> = generated_files(all)
        .into_iter()
        .enumerate()
        .map(|(i, (code, what))| {
            let f = dir.join(format!("f{i:03}.asc"));
            std::fs::write(&f, format!("/* {what} */\n{code}")).unwrap();
            (f, what)
        })
        .collect();
    let include = format!("-I{}", dir.join("include").display());
    let pch = precompiled_header(&script, &dir);
    let queue = Mutex::new(files.iter());
    let failures = Mutex::new(Vec::new());
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let Some((f, what)) = queue.lock().unwrap().next() else { break };
                let mut cmd = Command::new("bash");
                cmd.arg(&script).arg(f).arg(&include);
                // The cached parse stands for the file's own first include only.
                let code = std::fs::read_to_string(f).unwrap();
                if let Some(h) = pch.as_ref().filter(|_| code.contains(FIRST_INCLUDE)) {
                    cmd.arg("-include").arg(h);
                }
                let out = cmd.env("STRICT", "1").output().expect("bash runs");
                if !out.status.success() {
                    let err = String::from_utf8_lossy(&out.stderr);
                    let head: Vec<&str> = err.lines().take(12).collect();
                    failures.lock().unwrap().push(format!(
                        "{what} ({}):\n{}",
                        f.display(),
                        head.join("\n")
                    ));
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    eprintln!(
        "{} distinct generated files checked against the official headers, {} failed",
        files.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
