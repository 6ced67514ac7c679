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

/// Positions computed in the graph from the ids as Hugging Face's RoBERTa does
/// (`create_position_ids_from_input_ids`), and the extended mask, checked by hand; the whole
/// graph against the reference at every test size, fused and unfused.
#[test]
fn token_embeddings_compute_positions_and_masks_as_hugging_face() {
    common::check_module("token_embeddings", layers::token_embeddings::module().unwrap(), &SHAPES);
    common::check_module(
        "token_embeddings unfused",
        layers::token_embeddings::unfused_module().unwrap(),
        &SHAPES,
    );
    let g = layers::token_embeddings::module().unwrap().graph().clone();
    let ins = common::inputs(&g, &[2, 4], 3);
    let ids = Tensor::from_i64(&[2, 4], vec![0, 5, 1, 1, 1, 7, 8, 1]).unwrap();
    let types = Tensor::from_i64(&[2, 4], vec![0, 0, 0, 0, 1, 1, 0, 0]).unwrap();
    let keep = Tensor::from_i64(&[2, 4], vec![1, 1, 0, 0, 1, 1, 1, 1]).unwrap();
    let (h, pos, mask) =
        layers::token_embeddings(&ids, &types, &keep, &ins[3], &ins[4], &ins[5], &ins[6], &ins[7])
            .unwrap();
    // PAD = 1: padding keeps position 1, the others count from 2.
    assert_eq!(pos.to_i64_vec(), vec![2, 3, 1, 1, 1, 2, 3, 1]);
    assert_eq!(mask.shape(), &[2, 1, 1, 4]);
    let min = f32::MIN;
    assert_eq!(mask.to_f32_vec(), vec![0.0, 0.0, min, min, 0.0, 0.0, 0.0, 0.0]);
    let want = layers::token_embeddings::reference(
        &ids, &types, &keep, &ins[3], &ins[4], &ins[5], &ins[6], &ins[7],
    )
    .unwrap();
    common::assert_close("token_embeddings by hand", &[h, pos, mask], &[want.0, want.1, want.2]);
}

/// Ids outside a table are errors naming what holds them: a parameter before any kernel runs,
/// and ids the graph computed (positions past the position table) after the kernel that made them.
#[test]
fn ids_outside_a_table_are_errors_through_the_dsl() {
    let g = layers::token_embeddings::module().unwrap().graph().clone();
    let ins = common::inputs(&g, &[1, 3], 3);
    let ids = Tensor::from_i64(&[1, 3], vec![0, 50, 2]).unwrap();
    let e = layers::token_embeddings(
        &ids, &ins[1], &ins[2], &ins[3], &ins[4], &ins[5], &ins[6], &ins[7],
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "`token_embeddings`: `input_ids` holds 50 at element 1, outside `word`, which has 50 rows (valid: -50 ..= 49)"
    );
    // 520 tokens and no padding: the last positions are 520 and 521, past P = 520 rows.
    let ins = common::inputs(&g, &[1, 520], 3);
    let ids = Tensor::from_i64(&[1, 520], vec![3; 520]).unwrap();
    let e = layers::token_embeddings(
        &ids, &ins[1], &ins[2], &ins[3], &ins[4], &ins[5], &ins[6], &ins[7],
    )
    .unwrap_err();
    match &e {
        Error::Index { graph, index, table, size, .. } => {
            assert_eq!(
                (graph.as_str(), *index, table.as_str(), *size),
                ("token_embeddings", 520, "position", 520),
                "{e}"
            );
        }
        e => panic!("expected an index error, got {e}"),
    }
    // The module stays usable after the error.
    let ins = common::inputs(&g, &[1, 3], 3);
    let refs: Vec<&Tensor> = ins.iter().collect();
    layers::token_embeddings::module().unwrap().run(&refs).unwrap();
}

/// The batched encoder with a mask computed from `attention_mask`: against the reference at
/// every test size, and a padded sequence gives the rows it gives alone, unpadded.
#[test]
fn a_padded_batch_gives_each_sequence_what_it_gives_alone() {
    common::check_module("encoder_batched", layers::encoder_batched::module().unwrap(), &SHAPES);
    common::check_module(
        "encoder_batched unfused",
        layers::encoder_batched::unfused_module().unwrap(),
        &SHAPES,
    );
    let m = layers::encoder_batched::module().unwrap();
    let g = m.graph().clone();
    let (lens, s) = ([9usize, 4, 1], 9usize);
    let ins = common::inputs(&g, &common_dims(&g, lens.len(), s), 11);
    let keep: Vec<i64> = lens.iter().flat_map(|&l| (0..s).map(move |j| (j < l) as i64)).collect();
    let mask = Tensor::from_i64(&[lens.len(), s], keep).unwrap();
    let mut args: Vec<&Tensor> = ins.iter().collect();
    args[1] = &mask;
    let batch = m.run(&args).unwrap().remove(0).to_f32_vec();
    let x = ins[0].to_f32_vec();
    let d = 32;
    for (b, &l) in lens.iter().enumerate() {
        let alone = Tensor::from_f32(&[1, l, d], x[b * s * d..(b * s + l) * d].to_vec()).unwrap();
        let ones = Tensor::from_i64(&[1, l], vec![1; l]).unwrap();
        let mut args1: Vec<&Tensor> = ins.iter().collect();
        args1[0] = &alone;
        args1[1] = &ones;
        let want = m.run(&args1).unwrap().remove(0).to_f32_vec();
        let got = &batch[b * s * d..(b * s + l) * d];
        let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(err <= 1e-5, "sequence {b} (length {l}) differs by {err:e} padded to {s}");
    }
}

fn common_dims(g: &autofusion_compiler::ir::Graph, b: usize, s: usize) -> Vec<i64> {
    g.dyn_dims.iter().map(|d| if d == "B" { b as i64 } else { s as i64 }).collect()
}

/// Mean pooling over the kept tokens and L2 normalisation, against values computed here.
#[test]
fn mean_pooling_averages_the_kept_tokens_and_normalises() {
    common::check_module("mean_pool", layers::mean_pool::module().unwrap(), &SHAPES);
    let (b, s, d) = (2usize, 5usize, 32usize);
    let h = Tensor::randn(&[b, s, d], 1.0, 7);
    let keep = [1i64, 1, 1, 0, 0, 1, 1, 1, 1, 1];
    let mask = Tensor::from_i64(&[b, s], keep.to_vec()).unwrap();
    let got = layers::mean_pool(&h, &mask).unwrap().to_f32_vec();
    let hv = h.to_f32_vec();
    for i in 0..b {
        let n = keep[i * s..(i + 1) * s].iter().sum::<i64>() as f32;
        let mean: Vec<f32> = (0..d)
            .map(|c| {
                (0..s).map(|j| hv[(i * s + j) * d + c] * keep[i * s + j] as f32).sum::<f32>() / n
            })
            .collect();
        let norm = mean.iter().map(|v| v * v).sum::<f32>().sqrt();
        for c in 0..d {
            let (g, w) = (got[i * d + c], mean[c] / norm);
            assert!((g - w).abs() <= 1e-5, "sentence {i}, column {c}: {g} vs {w}");
        }
    }
}

/// Every integer spelling of the DSL on random integers (negative, zero, equal pairs), fused
/// and unfused, bit for bit against the reference.
#[test]
fn integer_spellings_of_the_dsl_match_the_reference() {
    use autofusion_compiler::testing::Rng;
    for m in [layers::int_zoo::module().unwrap(), layers::int_zoo::unfused_module().unwrap()] {
        for s in [1usize, 7, 100] {
            let mut rng = Rng::new(s as u64);
            let mut ints = |n: usize, lo: i64, hi: i64| -> Vec<i64> {
                (0..n).map(|_| lo + (rng.next_u64() % (hi - lo + 1) as u64) as i64).collect()
            };
            let w = 37;
            let ids = Tensor::from_i64(&[s, w], ints(s * w, -20, 20)).unwrap();
            let small: Vec<i32> = ints(s * w, -6, 6).into_iter().map(|v| v as i32).collect();
            let small = Tensor::from_i32(&[s, w], small).unwrap();
            let flags: Vec<bool> = ints(s * w, 0, 1).into_iter().map(|v| v == 1).collect();
            let flags = Tensor::from_bool(&[s, w], &flags).unwrap();
            let x: Vec<f32> = ints(s * w, -8, 8).iter().map(|&v| v as f32 * 0.75).collect();
            let x = Tensor::from_f32(&[s, w], x).unwrap();
            let cols = Tensor::from_i64(&[5], ints(5, -(w as i64), w as i64 - 1)).unwrap();
            let args = [&ids, &small, &flags, &x, &cols];
            let want = m.reference(&args).unwrap();
            let got = m.run(&args).unwrap();
            common::assert_close(&format!("int_zoo at S = {s}"), &got, &want);
        }
    }
}
