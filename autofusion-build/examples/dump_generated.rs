//! Dump every generated source the compiler makes for the repository's graphs, one file each,
//! so that a refactoring can show it changes none of them (`scripts/generated-diff.sh` runs
//! this at two revisions and diffs the trees).
//!
//! What is dumped, for the host (default profile, not calibrated: plans are deterministic) and
//! for Ascend (`ascend910b`), fused and unfused, with the plan as `plan.json`:
//! - every `#[fused_graph]` of `examples/seed_layer.rs` and `tests/layers/mod.rs` at opt levels
//!   0-3 and with each rule alone;
//! - the seed layer at the shapes the `plan` / `traffic` examples use (d 4096, S 2048 hint);
//! - the compiler's random graphs (seeds 0-23) at opt levels 0-3;
//! - the ONNX fixtures of `autofusion-onnx/tests/fixtures` at opt levels 0-3, with the Rust
//!   module `Builder::onnx` writes for them.
//!
//! Usage (from the repository root): `cargo run --release -p autofusion-build --example
//! dump_generated -- OUT_DIR`.

use autofusion_compiler::codegen::{ascend::Ascend, host::Host, Backend};
use autofusion_compiler::plan::Rule;
use autofusion_compiler::target::Target;
use autofusion_compiler::{report, Options, Unit, Variant};
use std::path::{Path, PathBuf};

struct Dumper {
    out: PathBuf,
    backends: Vec<Box<dyn Backend>>,
    files: usize,
}

impl Dumper {
    fn write(&mut self, rel: &str, text: &str) {
        let p = self.out.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        self.files += 1;
    }

    /// Both variants of `unit` on every backend, under `dir/`.
    fn unit(&mut self, dir: &str, unit: &Unit) {
        let backends = std::mem::take(&mut self.backends);
        for b in &backends {
            for v in [Variant::Fused, Variant::Unfused] {
                let stem = format!("{dir}/{}.{}", b.name(), v.name());
                match unit.build(b.as_ref(), v) {
                    Ok(built) => {
                        let ext = built.source.extension;
                        self.write(&format!("{stem}.{ext}"), &built.source.code);
                        self.write(&format!("{stem}.meta.json"), &built.source.meta_json);
                        let plan = report::plan_json(&unit.graph, &built.plan);
                        self.write(&format!("{stem}.plan.json"), &plan);
                    }
                    Err(e) => self.write(&format!("{stem}.error"), &e),
                }
            }
        }
        self.backends = backends;
    }
}

/// Opt levels 0-3 with every rule, then each rule alone at its own level.
fn configs(base: &Options) -> Vec<(String, Options)> {
    let mut v: Vec<(String, Options)> =
        (0..=3u8).map(|o| (format!("opt{o}"), Options { opt_level: o, ..base.clone() })).collect();
    for r in Rule::ALL {
        let (rules, level) = r.alone();
        v.push((format!("rule_{}", r.name()), Options { opt_level: level, rules, ..base.clone() }));
    }
    v
}

fn layer_graphs(d: &mut Dumper) {
    for file in ["examples/seed_layer.rs", "tests/layers/mod.rs"] {
        let src = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file}: {e}"));
        let parsed = syn::parse_file(&src).unwrap();
        for (f, attr) in autofusion_compiler::find_graphs(&parsed.items) {
            let name = f.sig.ident.to_string();
            let base = autofusion_compiler::front::parse_options(attr).unwrap();
            for (label, opts) in configs(&base) {
                let unit = Unit::with_options(opts, f).unwrap();
                d.unit(&format!("layers/{name}/{label}"), &unit);
            }
        }
    }
    // The shapes the plan and traffic examples re-plan the seed layer at.
    let src = std::fs::read_to_string("examples/seed_layer.rs").unwrap();
    let parsed = syn::parse_file(&src).unwrap();
    let (f, _) = autofusion_compiler::find_graphs(&parsed.items)[0];
    for level in [0u8, 3] {
        let attr: proc_macro2::TokenStream =
            format!("dims(D = 4096, H = 32, F = 16384), hints(S = 2048), opt_level = {level}")
                .parse()
                .unwrap();
        let unit = Unit::parse(attr, f).unwrap();
        d.unit(&format!("layers/seed_layer_d4096/opt{level}"), &unit);
    }
}

fn random_graphs(d: &mut Dumper) {
    for seed in 0..24u64 {
        let graph = autofusion_compiler::testing::random_graph(seed, 6 + seed as usize % 6);
        for level in 0..=3u8 {
            let opts = Options { opt_level: level, ..Default::default() };
            let unit = Unit::from_graph(graph.clone(), opts).unwrap();
            d.unit(&format!("random/{seed:02}/opt{level}"), &unit);
        }
    }
}

fn onnx_fixtures(d: &mut Dumper) {
    let dir = Path::new("autofusion-onnx/tests/fixtures");
    let mut models: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
        .collect();
    models.sort();
    for path in models {
        let stem = path.file_stem().unwrap().to_string_lossy().to_string();
        let Ok(model) = autofusion_onnx::load(&path) else { continue };
        let Ok(imported) = autofusion_onnx::import(&model, &stem) else { continue };
        for level in 0..=3u8 {
            let opts = Options { opt_level: level, ..Default::default() };
            let unit = Unit::from_graph(imported.graph.clone(), opts).unwrap();
            d.unit(&format!("onnx/{stem}/opt{level}"), &unit);
        }
        let dir = d.out.join(format!("onnx/{stem}"));
        std::fs::create_dir_all(&dir).unwrap();
        let glue = autofusion_build::onnx_glue_for_dump(&path, &stem, &dir)
            .unwrap_or_else(|e| format!("error: {e}"));
        // Absolute paths differ between checkouts: written relative to the root and the dump.
        let root = std::env::current_dir().unwrap().canonicalize().unwrap();
        let glue = glue
            .replace(&dir.display().to_string(), "$DUMP")
            .replace(&root.display().to_string(), "$ROOT");
        d.write(&format!("onnx/{stem}/module.rs"), &glue);
    }
}

fn main() {
    let out = PathBuf::from(std::env::args().nth(1).expect("usage: dump_generated OUT_DIR"));
    std::fs::create_dir_all(&out).unwrap();
    let out = out.canonicalize().unwrap();
    let _ = std::fs::remove_dir_all(&out);
    let backends: Vec<Box<dyn Backend>> =
        vec![Box::new(Host::new(Target::host())), Box::new(Ascend::new(Target::ascend910b()))];
    let mut d = Dumper { out, backends, files: 0 };
    layer_graphs(&mut d);
    random_graphs(&mut d);
    onnx_fixtures(&mut d);
    println!("{} files written to {}", d.files, d.out.display());
}
