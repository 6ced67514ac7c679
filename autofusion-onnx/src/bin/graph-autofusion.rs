//! `graph-autofusion`: fuse an ONNX model's operators into kernels and write the fused model.
//!
//!     graph-autofusion --input m.onnx --output m_fused.onnx --fusion-rules all --opt-level 3
//!
//! Each fused kernel becomes one node of domain `ai.autofusion` whose model-local function
//! holds the original nodes (stock onnxruntime runs the fused model). Exit status 0 on success,
//! 1 with one `error:` line on any failure.

use autofusion_compiler::codegen::{ascend::Ascend, host::Host, Backend};
use autofusion_compiler::plan::{Rule, RuleSet};
use autofusion_compiler::target::Target;
use autofusion_compiler::{report, Options, Unit, Variant};
use autofusion_onnx::export::{fuse, is_fused};
use autofusion_onnx::load::relocate_external_data;
use clap::Parser;
use prost::Message;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(
    name = "graph-autofusion",
    version,
    about = "Operator fusion for ONNX Transformer models"
)]
struct Args {
    /// The model to fuse.
    #[arg(long)]
    input: PathBuf,
    /// Where to write the fused model.
    #[arg(long)]
    output: PathBuf,
    /// `all`, `none`, or a comma-separated list of rule names.
    #[arg(long, default_value = "all")]
    fusion_rules: String,
    /// 0 (no fusion) to 3 (every rule).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(0..=3))]
    opt_level: u8,
    /// The target the plan and the generated kernels are for: host or ascend910b.
    #[arg(long, default_value = "host")]
    target: String,
    /// Write the generated kernel sources into this directory.
    #[arg(long)]
    emit_dir: Option<PathBuf>,
    /// Write the fusion report (markdown; `.json` for the plan as JSON) to this file.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Print every kernel and every candidate merge with its decision.
    #[arg(long)]
    debug: bool,
}

/// A step of the run, with a progress line when it took over a second.
fn step<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let t0 = Instant::now();
    let out = f();
    let dt = t0.elapsed().as_secs_f64();
    if dt > 1.0 {
        eprintln!("[INFO] {what} took {dt:.1} s");
    }
    out
}

fn rules_of(s: &str) -> Result<RuleSet, String> {
    match s {
        "all" => Ok(RuleSet::all()),
        "none" => Ok(RuleSet::none()),
        list => {
            let mut set = RuleSet::none();
            for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                let r = Rule::parse(name).ok_or_else(|| {
                    let known: Vec<&str> = Rule::ALL.iter().map(|r| r.name()).collect();
                    format!("unknown fusion rule `{name}` (known: all, none, {})", known.join(", "))
                })?;
                set.insert(r);
            }
            Ok(set)
        }
    }
}

fn run(a: &Args) -> Result<(), String> {
    let rules = rules_of(&a.fusion_rules)?;
    let backend: Box<dyn Backend> = match a.target.as_str() {
        "host" => Box::new(Host::new(Target::host())),
        "ascend910b" => Box::new(Ascend::new(Target::ascend910b())),
        t => return Err(format!("unknown --target `{t}` (host, ascend910b)")),
    };
    let model =
        step("reading the model", || autofusion_onnx::load(&a.input)).map_err(|e| e.to_string())?;
    if is_fused(&model.proto) {
        println!(
            "[INFO] {} is already fused by graph-autofusion (it holds `{}` nodes): nothing to change.",
            a.input.display(),
            autofusion_onnx::FUSED_DOMAIN
        );
        let mut proto = model.proto.clone();
        relocate_external_data(&mut proto, &a.input, &a.output).map_err(|e| e.to_string())?;
        std::fs::write(&a.output, proto.encode_to_vec())
            .map_err(|e| format!("cannot write {}: {e}", a.output.display()))?;
        println!("[INFO] Wrote {} unchanged.", a.output.display());
        return Ok(());
    }
    let name = a
        .input
        .file_stem()
        .map(|s| {
            s.to_string_lossy()
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect()
        })
        .unwrap_or_else(|| "model".to_string());
    let imported = step("importing the graph", || autofusion_onnx::import_partial(&model, &name))
        .map_err(|e| e.to_string())?;
    for (node, why) in &imported.left {
        println!("[WARN] Left as it is: `{node}`: {why}");
    }
    let (left_out, merged) = (imported.left.clone(), imported.merged.clone());
    let options = Options { opt_level: a.opt_level, rules, debug: a.debug, ..Options::default() };
    let unit = Unit::from_graph(imported.graph, options)
        .map_err(|e| format!("{}: {e}", a.input.display()))?;
    let built =
        step("planning and generating kernels", || unit.build(backend.as_ref(), Variant::Fused))?;
    let g = &unit.graph;
    let plan = &built.plan;
    let kernel_names: Vec<String> = plan
        .groups
        .iter()
        .enumerate()
        .map(|(k, grp)| autofusion_compiler::codegen::kernel_name(g, k, grp))
        .collect();
    let mut files = Vec::new();
    if let Some(dir) = &a.emit_dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        autofusion_compiler::codegen::write_headers(&dir.join("include"))
            .map_err(|e| format!("cannot write headers into {}: {e}", dir.display()))?;
        let f = dir.join(format!("{name}.{}", built.source.extension));
        std::fs::write(&f, &built.source.code)
            .map_err(|e| format!("cannot write {}: {e}", f.display()))?;
        files.push(f.display().to_string());
    }
    for l in report::summary(g, plan, &files) {
        println!("{l}");
    }
    let fused = fuse(&model.proto, g, plan, &kernel_names, &left_out, &merged);
    for f in &fused.fused {
        println!(
            "[INFO] {}: kernel {} ({}) holds {} nodes: {}",
            f.name,
            f.kernels.join(", "),
            if f.rules.is_empty() { "no rule".to_string() } else { f.rules.join(", ") },
            f.members.len(),
            f.members.join(", ")
        );
    }
    if a.debug {
        for (node, why) in &fused.left {
            println!("[DEBUG] left as it is: {node}: {why}");
        }
        for l in report::report_md(g, plan, &[]).lines() {
            println!("[DEBUG] {l}");
        }
    }
    let n_orig = model.proto.graph.as_ref().map_or(0, |gr| gr.node.len());
    let n_new = fused.model.graph.as_ref().map_or(0, |gr| gr.node.len());
    println!("[INFO] ONNX graph: {n_orig} nodes -> {n_new} nodes ({} fused nodes, {} nodes left as they were).", fused.fused.len(), fused.left.len());
    let mut out = fused.model;
    // External weights stay external: beside the output when it is in another directory.
    relocate_external_data(&mut out, &a.input, &a.output).map_err(|e| e.to_string())?;
    step("writing the fused model", || std::fs::write(&a.output, out.encode_to_vec()))
        .map_err(|e| format!("cannot write {}: {e}", a.output.display()))?;
    println!("[INFO] Wrote {}.", a.output.display());
    if let Some(r) = &a.report {
        let text = if r.extension().is_some_and(|e| e == "json") {
            report::plan_json(g, plan)
        } else {
            let mut md = report::report_md(g, plan, &files);
            md.push_str("\n## ONNX nodes left as they were\n\n");
            for (node, why) in &fused.left {
                md.push_str(&format!("- `{node}`: {why}\n"));
            }
            md
        };
        std::fs::write(r, text).map_err(|e| format!("cannot write {}: {e}", r.display()))?;
    }
    Ok(())
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
