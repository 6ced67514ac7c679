//! Integer and bool tensors on the host: every integer op, comparison, logical op, `where`,
//! running sum and cast, fused at every opt level, equal to the reference interpreter exactly;
//! the documented semantics (truncating division, division by zero, wrapping, saturating
//! float-to-integer casts) checked against values written out by hand; misuse is a type error.

mod common;
#[path = "integer_graphs/mod.rs"]
mod integer_graphs;

use autofusion::{DType, Tensor};
use autofusion_compiler::dim::DimExpr;
use autofusion_compiler::ir::{BinaryOp, Op, ReduceKind, UnaryOp};
use autofusion_compiler::{target::Target, GraphBuilder, Options, Unit, Variant};
use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("integers")
}

#[test]
fn integer_graphs_match_the_reference_exactly_at_every_opt_level() {
    let target = Target::host();
    for graph in [integer_graphs::int_ops(), integer_graphs::hf_masks()] {
        for level in 0..=3u8 {
            let opts = Options { opt_level: level, ..Options::default() };
            let unit = Unit::from_graph(graph.clone(), opts).unwrap();
            let m = common::load(&unit, Variant::Fused, &target, &dir(), &[]).unwrap();
            for s in [1usize, 7, 100] {
                // Magnitudes to 2^20: products reach 2^42 and i32 products wrap.
                let ins = integer_graphs::inputs(m.graph(), s, 1 << 20, s as u64 + 3);
                let refs: Vec<&Tensor> = ins.iter().collect();
                let want = m.reference(&refs).unwrap();
                let got = m.run(&refs).unwrap();
                let what = format!("{} at opt_level {level}, S = {s}", graph.name);
                common::assert_close(&what, &got, &want);
            }
            eprintln!(
                "ok: {} at opt_level {level} ({} kernels)",
                graph.name,
                m.kernel_names().len()
            );
        }
    }
}

/// One output per semantic rule, on inputs chosen to hit its edges.
#[test]
fn division_casts_and_running_sums_follow_the_documented_semantics() {
    let n = DimExpr::constant(6);
    let mut b = GraphBuilder::new("semantics");
    let a = b.param("a", DType::I64, vec![n.clone()]);
    let d = b.param("d", DType::I64, vec![n.clone()]);
    let f = b.param("f", DType::F32, vec![n.clone()]);
    let quot = b.binary(BinaryOp::Div, a, d, "quot").unwrap();
    let narrow = b.cast(a, DType::I32, "narrow").unwrap();
    let to_i64 = b.cast(f, DType::I64, "to_i64").unwrap();
    let to_i32 = b.cast(f, DType::I32, "to_i32").unwrap();
    let to_bool = b.cast(f, DType::Bool, "to_bool").unwrap();
    let incl = b.op(Op::CumSum { axis: 0, exclusive: false }, &[d], "incl").unwrap();
    let excl = b.op(Op::CumSum { axis: 0, exclusive: true }, &[d], "excl").unwrap();
    let lt = b.binary(BinaryOp::Lt, f, f, "lt").unwrap();
    let ge = b.binary(BinaryOp::Ge, a, d, "ge").unwrap();
    for o in [quot, narrow, to_i64, to_i32, to_bool, incl, excl, lt, ge] {
        b.output(o);
    }
    let g = b.finish().unwrap();
    let a = Tensor::from_i64(&[6], vec![-7, 7, 7, i64::MIN, 1 << 31, -(1 << 33) - 5]).unwrap();
    let d = Tensor::from_i64(&[6], vec![2, -2, 0, -1, 3, 1]).unwrap();
    let f = Tensor::from_f32(&[6], vec![-2.7, 2.7, f32::NAN, 3e9, -1e20, -0.0]).unwrap();
    let want: Vec<Vec<i64>> = vec![
        vec![-3, -3, 0, i64::MIN, (1 << 31) / 3, -(1 << 33) - 5],
        vec![-7, 7, 7, 0, -(1 << 31), -5],
        vec![-2, 2, 0, 3_000_000_000, i64::MIN, 0],
        vec![-2, 2, 0, i32::MAX as i64, i32::MIN as i64, 0],
        vec![1, 1, 1, 1, 1, 0],
        vec![2, 0, 0, -1, 2, 3],
        vec![0, 2, 0, 0, -1, 2],
        vec![0, 0, 0, 0, 0, 0],
        vec![0, 1, 1, 0, 1, 0],
    ];
    for level in [0u8, 3] {
        let unit = Unit::from_graph(g.clone(), Options { opt_level: level, ..Options::default() });
        let m = common::load(&unit.unwrap(), Variant::Fused, &Target::host(), &dir(), &[]).unwrap();
        let refs = [&a, &d, &f];
        let got = m.run(&refs).unwrap();
        let reference = m.reference(&refs).unwrap();
        for (k, w) in want.iter().enumerate() {
            let name = &g.node(g.outputs[k]).name;
            assert_eq!(&got[k].to_i64_vec(), w, "{name} (fused, opt_level {level})");
            assert_eq!(&reference[k].to_i64_vec(), w, "{name} (reference)");
        }
        assert_eq!(got[1].dtype(), DType::I32);
        assert_eq!(got[4].dtype(), DType::Bool);
    }
}

/// The builder's error for one misuse of an integer or bool value.
fn misuse(what: &str) -> String {
    let mut b = GraphBuilder::new("misuse");
    let s = || vec![DimExpr::constant(4), DimExpr::constant(4)];
    let i = b.param("i", DType::I64, s());
    let t = b.param("t", DType::Bool, s());
    let e = match what {
        "matmul of i64" => b.matmul(i, i, "y"),
        "exp of i64" => b.unary(UnaryOp::Exp, i, "y"),
        "add of bools" => b.binary(BinaryOp::Add, t, t, "y"),
        "and of i64" => b.binary(BinaryOp::And, i, i, "y"),
        "where on an i64 condition" => b.op(Op::Where, &[i, i, i], "y"),
        "reduce of i64" => b.op(Op::Reduce { kind: ReduceKind::Sum, axis: 1 }, &[i], "y"),
        "cumsum of bools" => b.op(Op::CumSum { axis: 1, exclusive: false }, &[t], "y"),
        _ => unreachable!("no case {what}"),
    };
    e.unwrap_err().to_string()
}

#[test]
fn integer_misuse_is_a_type_error_naming_the_op() {
    for what in [
        "matmul of i64",
        "exp of i64",
        "add of bools",
        "and of i64",
        "where on an i64 condition",
        "reduce of i64",
        "cumsum of bools",
    ] {
        let e = misuse(what);
        eprintln!("{what}: {e}");
        assert!(e.contains("node `y`"), "{what}: the error names the node: {e}");
        assert!(e.contains("i64") || e.contains("bool"), "{what}: the error names the type: {e}");
        assert!(e.contains("help: "), "{what}: the error says what to do: {e}");
    }
}

#[test]
fn tensors_hold_integers_and_bools_and_convert_as_casts_do() {
    let t = Tensor::from_i64(&[2, 2], vec![1, -2, 1 << 40, 0]).unwrap();
    assert_eq!(t.dtype(), DType::I64);
    assert_eq!(t.to_i64_vec(), vec![1, -2, 1 << 40, 0]);
    assert_eq!(t.as_i64().unwrap(), &[1, -2, 1 << 40, 0]);
    assert_eq!(t.to_dtype(DType::I32).unwrap().to_i64_vec(), vec![1, -2, 0, 0]);
    assert_eq!(t.to_dtype(DType::Bool).unwrap().to_bool_vec(), vec![true, true, true, false]);
    let f = Tensor::from_f32(&[3], vec![-1.5, 2.5, f32::NAN]).unwrap();
    assert_eq!(f.to_dtype(DType::I64).unwrap().to_i64_vec(), vec![-1, 2, 0]);
    let m = Tensor::from_bool(&[3], &[true, false, true]).unwrap();
    assert_eq!(m.to_f32_vec(), vec![1.0, 0.0, 1.0]);
    let bytes = Tensor::from_le_bytes(DType::Bool, &[3], &[0, 7, 1]).unwrap();
    assert_eq!(bytes.to_bool_vec(), vec![false, true, true]);
    assert!(Tensor::from_i64(&[3], vec![1, 2]).is_err());
    let a = Tensor::from_i64(&[1], vec![(1 << 40) + 1]).unwrap();
    let b = Tensor::from_i64(&[1], vec![1 << 40]).unwrap();
    assert_eq!(a.max_abs_diff(&b).unwrap(), 1.0, "integers compare exactly beyond 2^24");
    assert!(!a.allclose(&b, 0.0, 0.0).unwrap());
}

#[test]
fn gathers_match_the_reference_and_an_embedding_layer_is_one_kernel() {
    let target = Target::host();
    let graph = integer_graphs::embeddings();
    for level in 0..=3u8 {
        let opts = Options { opt_level: level, ..Options::default() };
        let unit = Unit::from_graph(graph.clone(), opts).unwrap();
        let m = common::load(&unit, Variant::Fused, &target, &dir(), &[]).unwrap();
        for s in [1usize, 7, 100] {
            let ins = integer_graphs::embedding_inputs(m.graph(), s, s as u64);
            let refs: Vec<&Tensor> = ins.iter().collect();
            let want = m.reference(&refs).unwrap();
            let got = m.run(&refs).unwrap();
            common::assert_close(&format!("embeddings at opt_level {level}, S = {s}"), &got, &want);
        }
        let plan = unit.variant(Variant::Fused, &target).plan;
        let emb = plan
            .groups
            .iter()
            .find(|grp| grp.nodes.iter().any(|n| unit.graph.node(*n).name == "tok"))
            .unwrap();
        let names: Vec<&str> =
            emb.nodes.iter().map(|n| unit.graph.node(*n).name.as_str()).collect();
        eprintln!(
            "opt_level {level}: {} kernels; the embedding kernel holds {names:?}",
            plan.groups.len()
        );
        if level >= 2 {
            for part in ["tok", "pos", "type", "embeddings"] {
                assert!(
                    names.contains(&part),
                    "opt_level {level}: `{part}` in the embedding kernel: {names:?}"
                );
            }
        }
    }
}

#[test]
fn an_id_outside_its_table_is_an_error_naming_it_before_any_read() {
    let graph = integer_graphs::embeddings();
    let unit = Unit::from_graph(graph, Options::default()).unwrap();
    let m = common::load(&unit, Variant::Fused, &Target::host(), &dir(), &[]).unwrap();
    for bad in [integer_graphs::VOCAB, -integer_graphs::VOCAB - 1, i64::MAX] {
        let mut ins = integer_graphs::embedding_inputs(m.graph(), 5, 1);
        let mut ids = ins[0].to_i64_vec();
        ids[3] = bad;
        ins[0] = Tensor::from_i64(&[5], ids).unwrap();
        let refs: Vec<&Tensor> = ins.iter().collect();
        for e in [m.run(&refs).unwrap_err(), m.reference(&refs).unwrap_err()] {
            let e = e.to_string();
            for part in [
                "`embeddings`",
                "`input_ids`",
                &bad.to_string(),
                "element 3",
                "`word_embeddings`",
                "50 rows",
            ] {
                assert!(e.contains(part), "`{part}` in: {e}");
            }
        }
    }
}

/// Ids a kernel computes (here `input_ids + shift`) are checked when that kernel is done,
/// before the gather reads them: an error naming them, at every opt level.
#[test]
fn computed_ids_outside_the_table_are_an_error_too() {
    let g = integer_graphs::shifted_lookup();
    let table = Tensor::randn(&[10, 8], 1.0, 3);
    let ids = Tensor::from_i64(&[4], vec![1, 2, 3, 4]).unwrap();
    for level in 0..=3u8 {
        let unit = Unit::from_graph(g.clone(), Options { opt_level: level, ..Options::default() });
        let m = common::load(&unit.unwrap(), Variant::Fused, &Target::host(), &dir(), &[]).unwrap();
        let ok = Tensor::from_i64(&[4], vec![0, 5, -1, -14]).unwrap();
        let refs = [&ids, &ok, &table];
        common::assert_close(
            &format!("opt_level {level}"),
            &m.run(&refs).unwrap(),
            &m.reference(&refs).unwrap(),
        );
        let bad = Tensor::from_i64(&[4], vec![0, 5, 7, 0]).unwrap();
        let e = m.run(&[&ids, &bad, &table]).unwrap_err().to_string();
        for part in ["`shifted_lookup`", "`shifted`", "10 at element 2", "`table`", "10 rows"] {
            assert!(e.contains(part), "opt_level {level}: `{part}` in: {e}");
        }
    }
}
