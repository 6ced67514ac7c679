//! Memory a call takes: sizes are checked (overflow and the memory limit) before anything is
//! allocated, an oversize call is an `Err` that leaves the module usable, and what a module
//! holds between calls can be released. Each test loads a module of its own (the limits are
//! per module).

mod common;

use autofusion::{Error, Module, Tensor};
use autofusion_compiler::{target::Target, Unit, Variant};
use std::path::PathBuf;

/// The Llama block of tests/layers at `opt_level`, compiled for this test as `tag`.
fn llama(opt_level: u8, tag: &str) -> Module {
    let (_, item, base) =
        common::layer_graphs().into_iter().find(|(n, ..)| n == "llama_block").unwrap();
    let opts = autofusion_compiler::front::Options { opt_level, ..base };
    let unit = Unit::with_options(opts, &item).unwrap();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("memory").join(tag);
    let built = unit.variant(Variant::Fused, &Target::host());
    common::load_built(&built, &dir, &[]).unwrap()
}

fn run_at(m: &Module, s: i64) -> autofusion::Result<Vec<Tensor>> {
    let ins = common::inputs(m.graph(), &[s], 3);
    let refs: Vec<&Tensor> = ins.iter().collect();
    m.run(&refs)
}

#[test]
fn an_oversize_call_is_an_error_before_any_allocation() {
    // opt_level 0 materialises the [H, S, S] attention scores: 160 GB at S = 100000.
    let m = llama(0, "oversize");
    m.set_memory_limit(8 << 30);
    let e = run_at(&m, 100_000).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, Error::Memory { .. }), "{text}");
    assert!(text.contains("`llama_block` with S = 100000"), "{text}");
    assert!(text.contains("GB for the arena of intermediates"), "{text}");
    assert!(text.contains("memory limit of 8.6 GB"), "{text}");
    assert_eq!(m.held_bytes(), 0, "nothing was allocated for the failed call");
    // The module stays usable.
    common::check_module("after the oversize call", &m, &[7]);
}

#[test]
fn sizes_that_overflow_are_errors() {
    let m = llama(0, "overflow");
    let e = m.shape_plan(&[1 << 40]).unwrap_err().to_string();
    assert!(e.contains("S = 1099511627776") && e.contains("overflow"), "{e}");
}

#[test]
fn the_limit_is_per_module_and_exact() {
    let m = llama(2, "limit");
    let plan = m.shape_plan(&[100]).unwrap();
    let need = plan.footprint.total().unwrap();
    m.set_memory_limit(need - 1);
    let e = run_at(&m, 100).unwrap_err().to_string();
    assert!(e.contains("S = 100") && e.contains("over the memory limit"), "{e}");
    m.set_memory_limit(need);
    run_at(&m, 100).unwrap();
}

#[test]
fn memory_is_released_when_asked() {
    let m = llama(2, "release");
    run_at(&m, 513).unwrap();
    let held = m.held_bytes();
    assert!(held > 0, "arena and packed weights are kept between calls");
    m.release_memory();
    assert_eq!(m.held_bytes(), 0);
    common::check_module("after release_memory", &m, &[7, 513]);
    // An arena over the retain size is freed after the call; packed weights stay.
    m.set_arena_retain(0);
    run_at(&m, 513).unwrap();
    assert_eq!(m.held_bytes(), m.packed_bytes());
}

/// A graph whose weights are bf16 (`w` read plainly, `v` plainly and through a transposed
/// view), at `opt_level`.
fn bf16_weights(opt_level: u8) -> Module {
    let src = format!(
        "#[fused_graph(dims(D = 48, F = 80), opt_level = {opt_level})]
         fn shared_packs(x: Tensor<bf16, {{[S, D]}}>, w: Tensor<bf16, {{[D, F]}}>, v: Tensor<bf16, {{[F, D]}}>)
             -> Tensor<bf16, {{[S, F]}}> {{
             let h = matmul(relu(matmul(x, w)), v);
             matmul(h + x, transpose(v, 0, 1))
         }}"
    );
    let file = syn::parse_file(&src).unwrap();
    let (f, attr) = autofusion_compiler::find_graphs(&file.items).into_iter().next().unwrap();
    let unit =
        Unit::with_options(autofusion_compiler::front::parse_options(attr).unwrap(), f).unwrap();
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("memory").join(format!("bf16-{opt_level}"));
    common::load(&unit, Variant::Fused, &Target::host(), &dir, &[]).unwrap()
}

/// Packed weights are shared by tensor identity across modules, kept in the weight's dtype,
/// held while their tensor lives, and freed with the last module holding them.
#[test]
fn packed_weights_are_shared_and_stay_16_bit() {
    use autofusion::packs::bytes_packed_from;
    let (fused, opt0) = (bf16_weights(2), bf16_weights(0));
    let ins = common::inputs(fused.graph(), &[9], 5);
    let refs: Vec<&Tensor> = ins.iter().collect();
    let (w, v) = (&ins[1], &ins[2]);
    common::assert_close("fused", &fused.run(&refs).unwrap(), &fused.reference(&refs).unwrap());
    assert_eq!(fused.packs_done(), 3, "w, v and v^T are packed");
    // bf16 bits in slivers of 32 columns: K * ceil32(N) * 2 bytes, rounded to 64-byte lines.
    let bytes = |k: usize, n: usize| (k * n.div_ceil(32) * 32 * 2).div_ceil(64) * 64;
    assert_eq!(bytes_packed_from(w), bytes(48, 80));
    assert_eq!(bytes_packed_from(v), bytes(80, 48) + bytes(48, 80), "v and its transpose");
    // The opt_level 0 module over the same tensors packs nothing: it uses the fused module's
    // copies, and computes the same.
    common::assert_close("opt0", &opt0.run(&refs).unwrap(), &opt0.reference(&refs).unwrap());
    assert_eq!(opt0.packs_done(), 0);
    assert_eq!(bytes_packed_from(w), bytes(48, 80), "one copy for both modules");
    // A clone of a weight is the same tensor; another tensor of equal values is not.
    let other_w = Tensor::from_f32_as(&[48, 80], &w.to_f32_vec(), autofusion::DType::BF16).unwrap();
    let mut with_other: Vec<&Tensor> = refs.clone();
    with_other[1] = &other_w;
    opt0.run(&with_other).unwrap();
    assert_eq!(opt0.packs_done(), 1);
    assert_eq!(bytes_packed_from(&other_w), bytes(48, 80));
    // Each live weight keeps its copy (a layer module takes every layer's weights in turn):
    // going back to w packs nothing.
    opt0.run(&refs).unwrap();
    assert_eq!(opt0.packs_done(), 1, "w's copy is still held");
    // Freed with the last holder.
    drop(fused);
    assert_eq!(bytes_packed_from(w), bytes(48, 80), "opt0 holds w's copy too");
    let held = opt0.packed_bytes();
    drop(with_other);
    drop(other_w);
    assert_eq!(opt0.packed_bytes(), held - bytes(48, 80), "other_w's copy went with it");
    assert!(bytes_packed_from(v) > 0, "opt0 still holds v's copies");
    opt0.release_memory();
    assert_eq!(bytes_packed_from(v) + bytes_packed_from(w), 0);
}
