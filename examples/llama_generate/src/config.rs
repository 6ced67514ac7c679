//! A Llama-architecture model's sizes, from Hugging Face's `config.json` or from a GGUF file's
//! `llama.*` metadata, checked to describe a model the graphs can run.

use crate::gguf::Gguf;
use crate::{Error, Result};
use serde_json::Value;
use std::path::Path;

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub vocab: usize,
    pub rope_theta: f64,
    pub rms_eps: f64,
    /// The output projection is the embedding table.
    pub tied: bool,
    pub max_positions: usize,
}

impl Config {
    /// The sizes in a line, for reports: `30 layers, hidden 576, heads 9/3 KV of 64, ...`.
    pub fn describe(&self) -> String {
        format!(
            "{} layers, hidden {}, heads {}/{} KV of {}, intermediate {}, vocab {}{}",
            self.layers,
            self.hidden,
            self.heads,
            self.kv_heads,
            self.head_dim,
            self.intermediate,
            self.vocab,
            if self.tied { ", tied" } else { "" }
        )
    }

    /// `config.json` of a Hugging Face Llama-architecture checkpoint (`LlamaForCausalLM`,
    /// Mistral, Qwen2 without biases, SmolLM, ...). Theta is read at the top level or, as
    /// transformers 5 writes it, in `rope_parameters`; scaled RoPE variants are refused.
    pub fn from_hf(path: &Path) -> Result<Config> {
        let err = |what: String| Error::File { path: path.to_path_buf(), what };
        let text = std::fs::read_to_string(path).map_err(|e| err(format!("cannot read: {e}")))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| err(format!("not JSON: {e}")))?;
        let key_err = |key: &str, what: String| Error::Metadata {
            path: path.to_path_buf(),
            key: key.into(),
            what,
        };
        let size = |key: &str| -> Result<Option<usize>> {
            match v.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(x) => x
                    .as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .map(Some)
                    .ok_or_else(|| key_err(key, format!("{x} is not a non-negative integer"))),
            }
        };
        let need = |key: &str| size(key)?.ok_or_else(|| key_err(key, "missing".into()));
        let number = |key: &str, x: &Value| {
            x.as_f64().ok_or_else(|| key_err(key, format!("{x} is not a number")))
        };
        let rope = v.get("rope_parameters").or_else(|| v.get("rope_scaling"));
        if let Some(kind) = rope.and_then(|r| r.get("rope_type").or_else(|| r.get("type"))) {
            if kind != "default" {
                return Err(key_err(
                    "rope_parameters",
                    format!("RoPE type {kind}: only the default (unscaled) RoPE is supported"),
                ));
            }
        }
        let rope_theta = match (v.get("rope_theta"), rope.and_then(|r| r.get("rope_theta"))) {
            (Some(x), _) => number("rope_theta", x)?,
            (None, Some(x)) => number("rope_parameters.rope_theta", x)?,
            (None, None) => 10000.0,
        };
        let rms_eps = match v.get("rms_norm_eps") {
            Some(x) => number("rms_norm_eps", x)?,
            None => 1e-6,
        };
        let (hidden, heads) = (need("hidden_size")?, need("num_attention_heads")?);
        let c = Config {
            hidden,
            heads,
            kv_heads: size("num_key_value_heads")?.unwrap_or(heads),
            head_dim: size("head_dim")?.unwrap_or(hidden.checked_div(heads).unwrap_or(0)),
            intermediate: need("intermediate_size")?,
            layers: need("num_hidden_layers")?,
            vocab: need("vocab_size")?,
            rope_theta,
            rms_eps,
            tied: v.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(false),
            max_positions: size("max_position_embeddings")?.unwrap_or(2048),
        };
        c.check().map_err(err)?;
        Ok(c)
    }

    /// The `llama.*` metadata of a GGUF file (tied when it has no `output.weight`).
    pub fn from_gguf<B: AsRef<[u8]>>(g: &Gguf<B>) -> Result<Config> {
        let arch = g.str("general.architecture")?;
        if arch != "llama" {
            return Err(Error::Metadata {
                path: g.path().to_path_buf(),
                key: "general.architecture".into(),
                what: format!("`{arch}`: this loader reads `llama`"),
            });
        }
        let (hidden, heads) =
            (g.usize("llama.embedding_length")?, g.usize("llama.attention.head_count")?);
        let kv_heads = match g.metadata.get("llama.attention.head_count_kv") {
            Some(_) => g.usize("llama.attention.head_count_kv")?,
            None => heads,
        };
        let head_dim = match g.metadata.get("llama.attention.key_length") {
            Some(_) => g.usize("llama.attention.key_length")?,
            None => hidden.checked_div(heads).unwrap_or(0),
        };
        let vocab = match g.metadata.get("llama.vocab_size") {
            Some(_) => g.usize("llama.vocab_size")?,
            None => g.tensor_info("token_embd.weight")?.shape()[0],
        };
        let c = Config {
            hidden,
            heads,
            kv_heads,
            head_dim,
            intermediate: g.usize("llama.feed_forward_length")?,
            layers: g.usize("llama.block_count")?,
            vocab,
            rope_theta: match g.metadata.get("llama.rope.freq_base") {
                Some(_) => g.f64("llama.rope.freq_base")?,
                None => 10000.0,
            },
            rms_eps: g.f64("llama.attention.layer_norm_rms_epsilon")?,
            tied: !g.tensors.iter().any(|t| t.name == "output.weight"),
            max_positions: match g.metadata.get("llama.context_length") {
                Some(_) => g.usize("llama.context_length")?,
                None => 2048,
            },
        };
        c.check().map_err(|what| Error::File { path: g.path().to_path_buf(), what })?;
        Ok(c)
    }

    /// Sizes the graphs can run: every one positive, query heads a multiple of KV heads, an
    /// even head dim (RoPE rotates halves), and no size past what an index can hold.
    fn check(&self) -> std::result::Result<(), String> {
        let sizes = [
            ("hidden", self.hidden),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("head_dim", self.head_dim),
            ("intermediate", self.intermediate),
            ("layers", self.layers),
            ("vocab", self.vocab),
        ];
        for (name, v) in sizes {
            if v == 0 || v > 1 << 24 {
                return Err(format!("{name} = {v}: want 1 ..= 2^24"));
            }
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(format!(
                "{} query heads over {} KV heads: not a whole group each",
                self.heads, self.kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(format!("head_dim = {}: RoPE needs an even head size", self.head_dim));
        }
        if !(self.rope_theta > 0.0 && self.rms_eps >= 0.0) {
            return Err(format!(
                "rope theta {} and RMS eps {}: want theta > 0, eps >= 0",
                self.rope_theta, self.rms_eps
            ));
        }
        Ok(())
    }
}
