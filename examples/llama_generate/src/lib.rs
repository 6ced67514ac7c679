//! Text generation with Llama-architecture checkpoints on fused kernels: the GGUF reader
//! (`gguf`: header, metadata, tensor infos and data, F32 / F16 / BF16 / Q8_0 / Q4_0 / Q4_1
//! tensors dequantised to f32, every size checked against the file before it is used); the
//! model's sizes (`config`), weights (`checkpoint`) and tokenizer (`tokenizer`) from Hugging
//! Face files or GGUF; the graphs (`graphs`) and the loaded model (`model`); token choice
//! (`sample`). The command is `src/main.rs`.

pub mod checkpoint;
pub mod config;
pub mod gguf;
pub mod graphs;
pub mod model;
pub mod sample;
pub mod tokenizer;

pub use checkpoint::{LayerWeights, Weights};
pub use config::Config;
pub use model::{Exec, Model};
pub use tokenizer::{TextStream, Tokenizer};

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

/// The weights and tokenizer of a checkpoint: a Hugging Face directory (`config.json`,
/// `model.safetensors` or its shards, `tokenizer.json`) or a GGUF file.
pub fn load(path: &std::path::Path) -> Result<(Weights, Tokenizer)> {
    if path.is_dir() {
        Ok((Weights::from_hf_dir(path)?, Tokenizer::from_hf_dir(path)?))
    } else {
        let weights = Weights::from_gguf(path)?;
        let tokenizer = Tokenizer::from_gguf(&gguf::Gguf::open(path)?)?;
        Ok((weights, tokenizer))
    }
}
