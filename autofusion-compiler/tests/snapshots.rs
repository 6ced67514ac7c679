//! Snapshot tests of IR dumps, plans and generated code (bless with `UPDATE_EXPECT=1`).

use autofusion_compiler::{find_graphs, plan::describe, report, target::Target, Unit, Variant};
use expect_test::{expect, expect_file, Expect};

fn first_graph(src: &str) -> (syn::ItemFn, proc_macro2::TokenStream) {
    let file = syn::parse_file(src).unwrap();
    let (f, attr) = find_graphs(&file.items).remove(0);
    (f.clone(), attr)
}

fn unit(src: &str) -> Unit {
    let (f, attr) = first_graph(src);
    Unit::parse(attr, &f).unwrap_or_else(|d| panic!("{}", d.render("test", src)))
}

fn seed_src() -> String {
    std::fs::read_to_string("../examples/seed_layer.rs").unwrap()
}

fn seed() -> Unit {
    unit(&seed_src())
}

/// A fixed target, so snapshots do not depend on this machine's caches.
fn target() -> Target {
    use autofusion_compiler::target::Memory;
    Target {
        cores: 2,
        matrix_cores: 2,
        matmul_flops_per_us: 16_000.0,
        vector_flops_per_us: 4_000.0,
        memories: vec![
            Memory { name: "l1".into(), bytes: 32 << 10 },
            Memory { name: "l2".into(), bytes: 1 << 20 },
        ],
        sources: vec!["fixed test profile".into()],
        ..Target::host()
    }
}

const FFN: &str = r#"
#[fused_graph(dims(D = 8, F = 16))]
fn ffn(x: Tensor<f32, {[S, D]}>, g: Tensor<f32, {[D]}>, w1: Tensor<f32, {[D, F]}>, b1: Tensor<f32, {[F]}>, w2: Tensor<f32, {[F, D]}>) -> Tensor<f32, {[S, D]}> {
    let h = rms_norm(x, g, 1e-6);
    x + matmul(silu(linear(h, w1, b1)), w2)
}
"#;

#[test]
fn ir_dump_before_and_after_canonicalize() {
    let u = unit(FFN);
    expect![[r#"
        graph ffn(x, g, w1, b1, w2) dyn[S]
          %0 = param[#0]() : f32[S, 8]  // x
          %1 = param[#1]() : f32[8]  // g
          %2 = param[#2]() : f32[8, 16]  // w1
          %3 = param[#3]() : f32[16]  // b1
          %4 = param[#4]() : f32[16, 8]  // w2
          %5 = rms_norm[eps=1e-6](%0, %1) : f32[S, 8]  // h
          %6 = linear(%5, %2, %3) : f32[S, 16]  // return
          %7 = silu(%6) : f32[S, 16]  // return
          %8 = matmul(%7, %4) : f32[S, 8]  // return
          %9 = add(%0, %8) : f32[S, 8]  // return
          return %9
    "#]]
    .assert_eq(&u.lowered.graph.dump());
    expect![[r#"
        graph ffn(x, g, w1, b1, w2) dyn[S]
          %0 = param[#0]() : f32[S, 8]  // x
          %1 = param[#1]() : f32[8]  // g
          %2 = param[#2]() : f32[8, 16]  // w1
          %3 = param[#3]() : f32[16]  // b1
          %4 = param[#4]() : f32[16, 8]  // w2
          %5 = mul(%0, %0) : f32[S, 8]  // h.sq
          %6 = reduce_mean[axis=1](%5) : f32[S, 1]  // h.ms
          %7 = const[1e-6]() : f32[]  // 1e-6
          %8 = add(%6, %7) : f32[S, 1]  // h.ms_eps
          %9 = rsqrt(%8) : f32[S, 1]  // h.rrms
          %10 = mul(%0, %9) : f32[S, 8]  // h.normed
          %11 = mul(%10, %1) : f32[S, 8]  // h
          %12 = matmul(%11, %2) : f32[S, 16]  // return.mm
          %13 = add(%12, %3) : f32[S, 16]  // return
          %14 = silu(%13) : f32[S, 16]  // return
          %15 = matmul(%14, %4) : f32[S, 8]  // return
          %16 = add(%0, %15) : f32[S, 8]  // return
          return %16
    "#]]
    .assert_eq(&u.graph.dump());
}

fn check_plan(level: u8, want: Expect) {
    let (item, attr) = first_graph(&seed_src());
    let mut o = autofusion_compiler::front::parse_options(attr).unwrap();
    o.opt_level = level;
    let u = Unit::with_options(o, &item).unwrap();
    let b = u.variant(Variant::Fused, &target());
    let lines: Vec<String> = b
        .plan
        .groups
        .iter()
        .enumerate()
        .map(|(k, g)| {
            let rules: Vec<&str> = g.rules.iter().map(|r| r.name()).collect();
            format!("k{k} [{}] {}", rules.join(","), describe(&u.graph, g))
        })
        .collect();
    want.assert_eq(&(lines.join("\n") + "\n"));
}

#[test]
fn seed_layer_plans_per_opt_level() {
    check_plan(
        1,
        expect![[r#"
            k0 [elementwise_chain,reduce_epilogue] h: reduce_mean sub mul reduce_mean add rsqrt sub mul mul add
            k1 [] q: matmul
            k2 [] q: add
            k3 [] k: matmul
            k4 [] k: add
            k5 [] v: matmul
            k6 [] v: add
            k7 [] scores: matmul
            k8 [elementwise_chain,reduce_epilogue] scores: mul; p: reduce_max sub exp reduce_sum div
            k9 [] a: matmul
            k10 [] a: copy(a)
            k11 [] x1: matmul
            k12 [elementwise_chain,reduce_epilogue,add_norm] x1: add add; h2: reduce_mean sub mul reduce_mean add rsqrt sub mul mul add
            k13 [] f: matmul
            k14 [elementwise_chain] f: add silu
            k15 [] return: matmul
            k16 [elementwise_chain] return: add add
        "#]],
    );
    check_plan(
        3,
        expect![[r#"
            k0 [elementwise_chain,reduce_epilogue] h: reduce_mean sub mul reduce_mean add rsqrt sub mul mul add
            k1 [linear_epilogue] q: matmul add
            k2 [linear_epilogue] k: matmul add
            k3 [linear_epilogue] v: matmul add
            k4 [flash_attention,layout_store] scores: matmul mul; p: reduce_max sub exp reduce_sum div; a: matmul copy(a)
            k5 [elementwise_chain,linear_epilogue] x1: matmul add add
            k6 [elementwise_chain,reduce_epilogue] h2: reduce_mean sub mul reduce_mean add rsqrt sub mul mul add
            k7 [elementwise_chain,linear_epilogue] f: matmul add silu
            k8 [linear_epilogue] return: matmul add add
        "#]],
    );
    check_plan(
        2,
        expect![[r#"
            k0 [elementwise_chain,reduce_epilogue] h: reduce_mean sub mul reduce_mean add rsqrt sub mul mul add
            k1 [linear_epilogue] q: matmul add
            k2 [linear_epilogue] k: matmul add
            k3 [linear_epilogue] v: matmul add
            k4 [linear_epilogue] scores: matmul mul
            k5 [elementwise_chain,reduce_epilogue] p: reduce_max sub exp reduce_sum div
            k6 [] a: matmul
            k7 [] a: copy(a)
            k8 [elementwise_chain,linear_epilogue] x1: matmul add add
            k9 [elementwise_chain,reduce_epilogue] h2: reduce_mean sub mul reduce_mean add rsqrt sub mul mul add
            k10 [elementwise_chain,linear_epilogue] f: matmul add silu
            k11 [linear_epilogue] return: matmul add add
        "#]],
    );
}

#[test]
fn generated_c_snapshot() {
    let u = unit(FFN);
    let b = u.variant(Variant::Fused, &target());
    expect_file!["snapshots/ffn_fused.c"].assert_eq(&b.source.code);
}

#[test]
fn plans_and_code_are_deterministic() {
    let (a, b) = (seed(), seed());
    assert_eq!(a.hash, b.hash);
    for v in [Variant::Fused, Variant::Unfused] {
        let (x, y) = (a.variant(v, &target()), b.variant(v, &target()));
        assert_eq!(report::plan_json(&a.graph, &x.plan), report::plan_json(&b.graph, &y.plan));
        assert_eq!(x.source.code, y.source.code);
    }
}

#[test]
fn the_report_explains_every_candidate() {
    let u = seed();
    let b = u.variant(Variant::Fused, &target());
    let j: serde_json::Value = serde_json::from_str(&report::plan_json(&u.graph, &b.plan)).unwrap();
    let cands = j["candidates"].as_array().unwrap();
    assert!(!cands.is_empty());
    for c in cands {
        match c["decision"].as_str().unwrap() {
            "accepted" => assert!(c["step"].as_u64().unwrap() >= 1),
            // The reason is a fixed code; the detail is what explains this rejection.
            "rejected" => assert!(!c["detail"].as_str().unwrap().trim().is_empty(), "{c}"),
            d => panic!("decision {d}"),
        }
    }
    let md = report::report_md(&u.graph, &b.plan, &report::summary(&u.graph, &b.plan, &[]));
    assert!(md.contains("| k0 |") && md.contains("## Candidates"));
}

#[test]
fn planning_a_fused_plan_again_changes_nothing() {
    let src = std::fs::read_to_string("../tests/layers/mod.rs").unwrap();
    let file = syn::parse_file(&src).unwrap();
    let mut graphs: Vec<Unit> =
        find_graphs(&file.items).into_iter().map(|(f, a)| Unit::parse(a, f).unwrap()).collect();
    graphs.push(seed());
    for u in graphs {
        for level in 1..=3 {
            let o = &u.lowered.options;
            let first =
                autofusion_compiler::plan::plan(&u.graph, level, o.rules, &o.hints, &target());
            let again = autofusion_compiler::plan::plan_from(
                &u.graph,
                level,
                o.rules,
                &o.hints,
                &target(),
                Some(&first.groups),
            );
            let nodes = |p: &autofusion_compiler::plan::Plan| {
                p.groups.iter().map(|g| g.nodes.clone()).collect::<Vec<_>>()
            };
            assert_eq!(nodes(&first), nodes(&again), "{} at opt_level {level}", u.name());
            assert_eq!(first.pipeline, again.pipeline);
            let merges = again
                .candidates
                .iter()
                .filter(|c| c.rule != Some(autofusion_compiler::plan::Rule::Pipeline));
            assert!(
                merges.clone().all(|c| !matches!(
                    c.decision,
                    autofusion_compiler::plan::Decision::Accepted { .. }
                )),
                "{}: no merge left",
                u.name()
            );
        }
    }
}

/// The seed layer at d 4096, S 2048, f16 on `ascend910b` (the `traffic` example's case): the
/// kernels, each matmul's tile order, and the traffic with and without L2 between kernels.
#[test]
fn seed_layer_on_ascend_at_d4096() {
    let src = seed_src()
        .replace("dims(D = 512, H = 8, F = 2048)", "dims(D = 4096, H = 32, F = 16384)")
        .replace("Tensor<f32,", "Tensor<f16,");
    let u = unit(&src);
    let g = &u.graph;
    let hints = [("S".to_string(), 2048)];
    let target = Target::ascend910b();
    let p = autofusion_compiler::plan::plan(g, 3, u.lowered.options.rules, &hints, &target);
    let mut lines: Vec<String> = p
        .groups
        .iter()
        .map(|gr| {
            let order = match gr.cost.as_ref().map(|c| &c.tiling) {
                Some(autofusion_compiler::cost::Tiling::MatMul { n_major: true, .. }) => {
                    " (column panels)"
                }
                Some(autofusion_compiler::cost::Tiling::MatMul { .. }) => " (row panels)",
                _ => "",
            };
            format!("{}{order}", describe(g, gr))
        })
        .collect();
    let gb = |b: f64| format!("{:.2} GB", b / 1e9);
    lines.push(format!(
        "boundary {}, off-chip with L2 {} ({} if writes reach HBM), unfused {}",
        gb(p.bytes),
        gb(p.offchip.bytes),
        gb(p.offchip.writes_reach_memory()),
        gb(p.unfused_offchip.bytes)
    ));
    expect![[r#"
        h: reduce_mean sub mul reduce_mean add rsqrt sub mul mul add
        q: matmul add (column panels)
        k: matmul add (column panels)
        v: matmul add (column panels)
        scores: matmul mul; p: reduce_max sub exp reduce_sum div; a: matmul copy(a)
        x1: matmul add add (column panels)
        h2: reduce_mean sub mul reduce_mean add rsqrt sub mul mul add
        f: matmul add silu (column panels)
        return: matmul add add (column panels)
        boundary 0.87 GB, off-chip with L2 0.57 GB (0.70 GB if writes reach HBM), unfused 4.03 GB
    "#]]
    .assert_eq(&(lines.join("\n") + "\n"));
}
