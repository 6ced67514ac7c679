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
