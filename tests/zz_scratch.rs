mod common;
use autofusion::Tensor;
use autofusion_compiler::{find_graphs, target::Target, Unit, Variant};
#[test]
#[ignore]
fn scratch_model_vs_measured() {
    let t: Target = serde_json::from_str(&std::fs::read_to_string("target/autofusion/host-profile-v4.json").unwrap()).unwrap();
    let src = std::fs::read_to_string("examples/seed_layer.rs").unwrap();
    let file = syn::parse_file(&src).unwrap();
    let (f, a) = find_graphs(&file.items).remove(0);
    let mut o = autofusion_compiler::front::parse_options(a).unwrap();
    let s = 128;
    o.hints = vec![("S".into(), s)];
    for lvl in [0u8, 3] {
        o.opt_level = lvl;
        let u = Unit::with_options(o.clone(), f).unwrap();
        let b = u.variant(Variant::Fused, &t);
        let sym = format!("af_scratch_{lvl}");
        let built = u.generate(Variant::Fused, b.plan.clone(), &sym);
        let m = autofusion_runtime::jit::load_built(&built, &sym, std::path::Path::new("target/scratch"), &["-O3"]).unwrap();
        let ins = common::inputs(m.graph(), &[s], 1);
        let refs: Vec<&Tensor> = ins.iter().collect();
        let times = m.time_kernels(&refs, 9).unwrap();
        for (gr, tm) in b.plan.groups.iter().zip(&times) {
            let c = gr.cost.as_ref().unwrap();
            println!("{:>10.1} {:>10.1}  mem {:>8.1} comp {:>8.1} bytes {:>10.0} {:?} {}", c.time_us, tm, c.mem_us, c.compute_us, c.bytes, gr.kind, autofusion_compiler::plan::describe(&u.graph, gr));
        }
    }
}
