//! `config.json` of a BERT-family checkpoint: the sizes the graphs are bound to at run time,
//! and the settings these graphs do not take as parameters, checked to be the ones compiled.

use crate::{file_error, Error, Result};
use std::path::Path;

/// The sizes of a BERT encoder, as Hugging Face's `BertConfig` names them.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct Config {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub vocab_size: usize,
    pub max_position_embeddings: usize,
    #[serde(default = "two")]
    pub type_vocab_size: usize,
    #[serde(default)]
    pub pad_token_id: i64,
    #[serde(default = "eps")]
    pub layer_norm_eps: f64,
    #[serde(default = "gelu")]
    pub hidden_act: String,
    #[serde(default = "absolute")]
    pub position_embedding_type: String,
}

fn two() -> usize {
    2
}
fn eps() -> f64 {
    1e-12
}
fn gelu() -> String {
    "gelu".into()
}
fn absolute() -> String {
    "absolute".into()
}

/// The layer norm epsilon `graphs.rs` is compiled with (a number in the graph, not a dim).
pub const COMPILED_EPS: f64 = 1e-12;

impl Config {
    /// Read and check `dir/config.json`.
    pub fn load(dir: &Path) -> Result<Config> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::File {
            path: path.clone(),
            what: format!("cannot read: {e}"),
            hint: Some(crate::FETCH_HINT.into()),
        })?;
        let c: Config = serde_json::from_str(&text)
            .map_err(|e| file_error(&path, format!("not a BERT config: {e}")))?;
        c.check().map_err(|what| file_error(&path, what))?;
        Ok(c)
    }

    /// The head size, `hidden_size / num_attention_heads`.
    pub fn head_size(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    fn check(&self) -> std::result::Result<(), String> {
        let sizes = [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("intermediate_size", self.intermediate_size),
            ("vocab_size", self.vocab_size),
            ("max_position_embeddings", self.max_position_embeddings),
            ("type_vocab_size", self.type_vocab_size),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{name} is 0"));
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if self.hidden_act != "gelu" {
            return Err(format!(
                "hidden_act `{}`: these graphs compute BERT's exact (erf) `gelu` only",
                self.hidden_act
            ));
        }
        if self.position_embedding_type != "absolute" {
            return Err(format!(
                "position_embedding_type `{}`: these graphs add absolute position embeddings only",
                self.position_embedding_type
            ));
        }
        if (self.layer_norm_eps - COMPILED_EPS).abs() > COMPILED_EPS * 1e-3 {
            return Err(format!(
                "layer_norm_eps {}: src/graphs.rs is compiled with {COMPILED_EPS} (change it there and rebuild)",
                self.layer_norm_eps
            ));
        }
        Ok(())
    }
}
