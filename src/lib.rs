//! # autofusion
//!
//! Build-time operator fusion for Transformer inference. Write a layer once in a small tensor
//! DSL inside an ordinary Rust function; `cargo build` plans the fusion, generates C kernels
//! for the host (Ascend C comes with the `ascend` feature), compiles and links them; calling
//! the function runs the fused kernels, with tiling chosen for the actual shapes.
//!
//! ```ignore
//! use autofusion::prelude::*;
//!
//! #[fused_graph(dims(D = 512, F = 2048), opt_level = 2)]
//! pub fn ffn(x: Tensor<f32, {[S, D]}>, w1: Tensor<f32, {[D, F]}>, b1: Tensor<f32, {[F]}>,
//!            w2: Tensor<f32, {[F, D]}>, b2: Tensor<f32, {[D]}>) -> Tensor<f32, {[S, D]}> {
//!     x + linear(silu(linear(x, w1, b1)), w2, b2)
//! }
//!
//! // build.rs: autofusion_build::Builder::new().file("src/layers.rs").compile("layers");
//! let y = ffn(&x, &w1, &b1, &w2, &b2)?;              // fused kernels
//! let r = ffn::reference(&x, &w1, &b1, &w2, &b2)?;   // the unfused reference, op by op
//! ```
//!
//! Shapes are written `Tensor<dtype, {[dims]}>` (rustc parses the signature before the
//! attribute runs, and `[S, D]` alone is not a type; the braces make it a const argument).
//! Dims bound in `dims(...)` are static; other names (`S`) are dynamic and bound per call.
//!
//! | option | meaning |
//! |---|---|
//! | `dims(D = 1024, ...)` | static dims |
//! | `hints(S = 512, ...)` | planning estimates of dynamic dims (default 128) |
//! | `opt_level = 0..=3` | 0: one kernel per op; 1: elementwise and reduction fusion; 2: + matmul prologue/epilogue; 3: + flash attention and pipeline |
//! | `rules = all \| none \| [name, ...]` | fusion rules allowed (`all` = every default rule) |
//! | `debug = true` | compile this graph's kernels with `-O0 -g` |

#![deny(missing_docs)]

pub use autofusion_macros::fused_graph;
pub use autofusion_runtime::{
    tolerance, DType, Decoder, Device, Error, Module, Result, Runner, Session, Tensor,
};

/// A fused graph's Ascend module bound to an NPU, as a `Runner` of a `Decoder`'s sessions.
#[cfg(feature = "ascend")]
pub use autofusion_runtime::session::OnDevice;

/// Packed weights, shared by every module of the process (`packs::live_bytes`,
/// `packs::bytes_packed_from`).
pub use autofusion_runtime::packs;

/// The CPU model and the micro-kernel level the generated code picks on it, for reports.
pub use autofusion_runtime::machine;

/// Sessions timed side by side (prefill and decode tokens/s), in the lines the `llama` bench
/// and `llama_generate --bench` print.
pub use autofusion_runtime::session_bench;

/// Writing f32 arrays as NumPy `.npy` files (embeddings, logits), for scripts to compare.
pub use autofusion_runtime::npy;

/// The number of threads the host kernels run on (`AUTOFUSION_THREADS`, else the CPUs this
/// process may use), for reports.
pub fn threads() -> usize {
    autofusion_runtime::pool::pool().threads()
}

/// Everything a layer file needs.
pub mod prelude {
    pub use crate::{fused_graph, DType, Device, Error, Result, Tensor};
}

#[doc(hidden)]
pub use autofusion_runtime::__private;
