//! Print the plan of the seed layer for a target profile, opt level and sequence length.
//!
//!     cargo run --release --example plan -- --target ascend910b --opt-level 3 --seq 2048
//!
//! `--target host` plans with the calibrated host profile cached by the build (or the host
//! defaults when there is none); `--profile FILE` with a pinned one.

use autofusion_compiler::plan::{describe, plan, Decision};
use autofusion_compiler::target::Target;
use autofusion_compiler::{find_graphs, report, Unit};

fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| default.to_string())
}

fn main() {
    let tname = arg("--target", "host");
    let level: u8 = arg("--opt-level", "3").parse().unwrap_or(3).min(3);
    let seq: i64 = arg("--seq", "128").parse().unwrap_or(128);
    let profile = arg("--profile", "");
    let target = if !profile.is_empty() {
        let text = std::fs::read_to_string(&profile).unwrap_or_else(|e| {
            eprintln!("error: cannot read {profile}: {e}");
            std::process::exit(2)
        });
        serde_json::from_str(&text).unwrap_or_else(|e| {
            eprintln!("error: {profile} is not a target profile: {e}");
            std::process::exit(2)
        })
    } else if tname == "host" {
        let cached = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("target")
            .join(autofusion_compiler::target::HOST_PROFILE_CACHE);
        std::fs::read_to_string(cached)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_else(Target::host)
    } else {
        Target::named(&tname).unwrap_or_else(|| {
            eprintln!("error: unknown --target `{tname}` (host, ascend910b)");
            std::process::exit(2)
        })
    };
    let src = include_str!("seed_layer.rs");
    let file = syn::parse_file(src).expect("the seed layer parses");
    let (f, attr) = find_graphs(&file.items).remove(0);
    let unit = Unit::parse(attr, f).expect("the seed layer is valid");
    let o = &unit.lowered.options;
    let p = plan(&unit.graph, level, o.rules, &[("S".into(), seq)], &target);
    println!("seed layer (d 512, 8 heads), S = {seq}, opt_level {level}, target `{}`", target.name);
    println!("profile: {}", target.sources.join("; "));
    for l in report::summary(&unit.graph, &p, &[]).iter().take(3) {
        println!("{l}");
    }
    println!("pipeline (one launch): {}", if p.pipeline { "yes" } else { "no" });
    for (k, g) in p.groups.iter().enumerate() {
        let rules: Vec<&str> = g.rules.iter().map(|r| r.name()).collect();
        let c = g.cost.as_ref().map(|c| format!("{:9.1} us", c.time_us)).unwrap_or_default();
        println!("  k{k:<3} {c}  [{}] {}", rules.join(", "), describe(&unit.graph, g));
    }
    let rejected =
        p.candidates.iter().filter(|c| matches!(c.decision, Decision::Rejected { .. })).count();
    println!(
        "{} candidates, {rejected} rejected (reasons in plan.json / report.md)",
        p.candidates.len()
    );
}
