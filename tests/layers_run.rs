//! The layers of tests/layers, compiled by this package's build.rs through the macro, run
//! fused and unfused against the reference at several dynamic shapes; runtime errors.

mod common;
#[path = "layers/mod.rs"]
mod layers;

use autofusion::{DType, Error, Tensor};

const SHAPES: [i64; 4] = [1, 7, 100, 513];

#[test]
fn bert_layer_matches_reference() {
    common::check_module("bert_layer", layers::bert_layer::module().unwrap(), &SHAPES);
    common::check_module(
        "bert_layer unfused",
        layers::bert_layer::unfused_module().unwrap(),
        &SHAPES,
    );
}

#[test]
fn llama_block_matches_reference() {
    common::check_module("llama_block", layers::llama_block::module().unwrap(), &SHAPES);
    common::check_module(
        "llama_block unfused",
        layers::llama_block::unfused_module().unwrap(),
        &SHAPES,
    );
}

#[test]
fn half_precision_layers_match_reference() {
    common::check_module("ffn_f16", layers::ffn_f16::module().unwrap(), &SHAPES);
    common::check_module("add_norm_bf16", layers::add_norm_bf16::module().unwrap(), &SHAPES);
}

#[test]
fn op_zoo_matches_reference() {
    common::check_module("op_zoo", layers::op_zoo::module().unwrap(), &SHAPES);
}

/// The macro-generated functions agree with the module API and return typed tuples.
#[test]
fn generated_functions_return_what_the_signature_says() {
    let g = layers::add_norm_bf16::module().unwrap().graph().clone();
    let ins = common::inputs(&g, &[5], 3);
    let (s, n) = layers::add_norm_bf16(&ins[0], &ins[1], &ins[2]).unwrap();
    assert_eq!((s.dtype(), s.shape()), (DType::BF16, &[5usize, 96][..]));
    assert_eq!((n.dtype(), n.shape()), (DType::F32, &[5usize, 96][..]));
    let (rs, rn) = layers::add_norm_bf16::reference(&ins[0], &ins[1], &ins[2]).unwrap();
    common::assert_close("add_norm_bf16 via fn", &[s, n], &[rs, rn]);
    let (us, _) = layers::add_norm_bf16::unfused(&ins[0], &ins[1], &ins[2]).unwrap();
    assert_eq!(us.shape(), &[5, 96]);
}

#[test]
fn shape_errors_name_the_parameter_and_both_shapes() {
    let g = layers::ffn_f16::module().unwrap().graph().clone();
    let ins = common::inputs(&g, &[4], 1);
    // w1 must be [64, 160].
    let bad = Tensor::zeros(DType::F16, &[64, 161]);
    let e = layers::ffn_f16(&ins[0], &ins[1], &ins[2], &bad, &ins[4], &ins[5]).unwrap_err();
    assert_eq!(
        e,
        Error::Shape {
            graph: "ffn_f16".into(),
            param: "w1".into(),
            expected: "[64, 160]".into(),
            got: vec![64, 161]
        }
    );
    assert_eq!(e.to_string(), "`ffn_f16`: parameter `w1` has shape [64, 161], expected [64, 160]");
    // A parameter whose shape uses S names its binding.
    let bad = Tensor::zeros(DType::F16, &[4, 63]);
    let e = layers::ffn_f16(&bad, &ins[1], &ins[2], &ins[3], &ins[4], &ins[5]).unwrap_err();
    assert!(e.to_string().ends_with("expected [S, 64] with S = 4"), "{e}");
    // Rank.
    let bad = Tensor::zeros(DType::F16, &[4, 64, 1]);
    let e = layers::ffn_f16(&bad, &ins[1], &ins[2], &ins[3], &ins[4], &ins[5]).unwrap_err();
    assert!(e.to_string().contains("parameter `x` has shape [4, 64, 1], expected [S, 64]"), "{e}");
}

#[test]
fn dtype_and_dim_conflicts_are_errors() {
    let g = layers::bert_layer::module().unwrap().graph().clone();
    let ins = common::inputs(&g, &[6], 1);
    let mut args: Vec<&Tensor> = ins.iter().collect();
    let f16x = ins[0].to_dtype(DType::F16).unwrap();
    args[0] = &f16x;
    let e = layers::bert_layer::module().unwrap().run(&args).unwrap_err();
    assert_eq!(e.to_string(), "`bert_layer`: parameter `x` has dtype f16, expected f32");
    // The mask binds S = 7 while x says 6.
    let mask7 = Tensor::zeros(DType::F32, &[1, 7]);
    let mut args: Vec<&Tensor> = ins.iter().collect();
    args[1] = &mask7;
    let e = layers::bert_layer::module().unwrap().run(&args).unwrap_err();
    assert_eq!(
        e.to_string(),
        "`bert_layer`: dim `S` is 6 from parameter `x` but 7 from parameter `mask`"
    );
    let e = layers::bert_layer::module().unwrap().run(&args[..3]).unwrap_err();
    assert_eq!(e.to_string(), "`bert_layer` takes 18 inputs, got 3");
}

#[test]
fn tiling_is_cached_per_shape() {
    let m = layers::llama_block::module().unwrap();
    let a = m.shape_plan(&[33]).unwrap();
    let b = m.shape_plan(&[33]).unwrap();
    assert!(std::sync::Arc::ptr_eq(&a, &b), "the same dims reuse the cached plan");
    let c = m.shape_plan(&[34]).unwrap();
    assert!(!std::sync::Arc::ptr_eq(&a, &c));
    // Liveness lets intermediates share the arena.
    assert!(a.arena_bytes < a.intermediate_bytes, "{} vs {}", a.arena_bytes, a.intermediate_bytes);
}

#[test]
#[cfg(not(feature = "ascend"))]
fn ascend_device_is_a_clear_error_without_the_feature() {
    let e = autofusion::Device::Ascend(0).check().unwrap_err();
    assert!(e.to_string().contains("--features ascend"), "{e}");
    autofusion::Device::Cpu.check().unwrap();
    // The per-graph entry point says the same.
    let x = Tensor::zeros(DType::BF16, &[3, 96]);
    let g = Tensor::zeros(DType::BF16, &[96]);
    let e = layers::add_norm_bf16::run_on(autofusion::Device::Ascend(0), &x, &x, &g).unwrap_err();
    assert!(e.to_string().contains("--features ascend"), "{e}");
    let (h, s) = layers::add_norm_bf16::run_on(autofusion::Device::Cpu, &x, &x, &g).unwrap();
    assert_eq!((h.shape(), s.shape()), (&[3usize, 96][..], &[3usize, 96][..]));
}
