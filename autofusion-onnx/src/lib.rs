//! ONNX in and out for autofusion: models read into the compiler's IR through the public
//! `GraphBuilder` (a peer of the `#[fused_graph]` front end), and fused models written back with
//! each fused kernel as one node of domain `ai.autofusion` whose model-local function holds
//! the original nodes, so stock onnxruntime still runs them.
//!
//! The protobuf messages are declared with `prost`'s derive (`proto.rs`): no `protoc` at build
//! time. Files are memory-mapped; inline tensor data are slices of the mapping.

pub mod export;
pub mod import;
pub mod load;
pub mod patterns;
pub mod proto;

pub use import::{import, import_partial, Imported};
pub use load::{load, Model};

use std::fmt;
use std::path::Path;

/// An error reading, importing or writing a model: where (the file, or the node with its op,
/// opset and input shapes), what is wrong, and what to do about it.
#[derive(Clone, Debug, PartialEq)]
pub struct OnnxError {
    pub context: String,
    pub msg: String,
    pub help: Option<String>,
}

impl OnnxError {
    pub(crate) fn file(path: &Path, msg: String) -> OnnxError {
        OnnxError { context: path.display().to_string(), msg, help: None }
    }
    pub(crate) fn model(msg: String) -> OnnxError {
        OnnxError { context: "model".into(), msg, help: None }
    }
    pub(crate) fn help(mut self, help: impl Into<String>) -> OnnxError {
        self.help = Some(help.into());
        self
    }
}

impl fmt::Display for OnnxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.context, self.msg)?;
        if let Some(h) = &self.help {
            write!(f, " (help: {h})")?;
        }
        Ok(())
    }
}

impl std::error::Error for OnnxError {}

/// The domain of fused nodes and of their functions.
pub const FUSED_DOMAIN: &str = "ai.autofusion";
