//! Text generation with Llama-architecture checkpoints on fused kernels. So far: the GGUF
//! reader (`gguf`): header, metadata, tensor infos and data, F32 / F16 / BF16 / Q8_0 / Q4_0
//! tensors dequantised to f32, every size checked against the file before it is used; the
//! model's sizes (`config`) and weights (`checkpoint`) from Hugging Face files or GGUF.

pub mod checkpoint;
pub mod config;
pub mod gguf;
pub mod graphs;
pub mod model;

pub use checkpoint::{LayerWeights, Weights};
pub use config::Config;
pub use model::{Exec, Model};

/// What can go wrong reading a model; each names the file and, where there is one, the
/// tensor or metadata key.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {what}")]
    File { path: std::path::PathBuf, what: String },
    #[error("{path}: tensor `{tensor}`: {what}")]
    Tensor { path: std::path::PathBuf, tensor: String, what: String },
    #[error("{path}: metadata `{key}`: {what}")]
    Metadata { path: std::path::PathBuf, key: String, what: String },
    #[error(transparent)]
    Run(#[from] autofusion::Error),
}

pub type Result<T> = std::result::Result<T, Error>;
