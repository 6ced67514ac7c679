//! What the autofusion compiler and runtime share, and nothing else: the graph IR (`ir`), dim
//! expressions (`dim`), the kernel ABI (`abi`) and the metadata a generated module embeds
//! (`meta`) with its JSON form (`json`), and the content hash (`hash`). It depends on serde_json only (no derive macros), so a
//! binary that runs fused layers links no parser, planner or code generator.

pub mod abi;
pub mod dim;
pub mod hash;
pub mod ir;
pub mod json;
pub mod meta;
pub mod ops;

pub use ir::{ComputeType, DType};
pub use meta::{AscendKernel, AscendMeta, ModuleMeta, Variant};
