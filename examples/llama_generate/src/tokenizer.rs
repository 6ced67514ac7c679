//! The model's tokenizer. From a Hugging Face directory it is `tokenizer.json` read by the
//! `tokenizers` crate (the library transformers' fast tokenizers are). From a GGUF file it is
//! rebuilt from the `tokenizer.ggml.*` metadata as the `tokenizer.json` the file was converted
//! from held (byte-level BPE over the stored tokens and merges, the pre-tokenizer that
//! `tokenizer.ggml.pre` names, control tokens as special added tokens) and read by the same
//! crate, so one code path tokenizes both. `TextStream` turns generated ids into text as they
//! come, holding back a character whose bytes are split over tokens.

use crate::gguf::{Gguf, Value};
use crate::{Error, Result};
use serde_json::{json, Value as Json};
use std::path::{Path, PathBuf};

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// Put in front of every encoded text by `encode` (GGUF's `add_bos_token`); a
    /// `tokenizer.json` adds its own through its post-processor.
    bos: Option<u32>,
    /// Ids that end a generation.
    eos: Vec<u32>,
    /// The file it came from, for errors.
    path: PathBuf,
}

/// The splits of Llama 3's and Qwen2's `tokenizer.json` (llama.cpp spells the case-insensitive
/// group out; the meaning is the same).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GGUF token types (llama.cpp's `llama_token_type`) that become added tokens.
const TOKEN_TYPE_CONTROL: i128 = 3;
const TOKEN_TYPE_USER_DEFINED: i128 = 4;

impl Tokenizer {
    /// `tokenizer.json` of a Hugging Face checkpoint directory; the end-of-sequence ids from
    /// `generation_config.json`, else `config.json`.
    pub fn from_hf_dir(dir: &Path) -> Result<Tokenizer> {
        let path = dir.join("tokenizer.json");
        let inner = tokenizers::Tokenizer::from_file(&path).map_err(|e| Error::File {
            path: path.clone(),
            what: format!("cannot load the tokenizer: {e}"),
        })?;
        let mut eos = Vec::new();
        for name in ["generation_config.json", "config.json"] {
            eos = eos_ids(&dir.join(name))?;
            if !eos.is_empty() {
                break;
            }
        }
        Ok(Tokenizer { inner, bos: None, eos, path })
    }

    /// The tokenizer a GGUF file stores (`tokenizer.ggml.model` "gpt2": byte-level BPE).
    pub fn from_gguf<B: AsRef<[u8]>>(g: &Gguf<B>) -> Result<Tokenizer> {
        let meta_err = |key: &str, what: String| Error::Metadata {
            path: g.path().to_path_buf(),
            key: key.into(),
            what,
        };
        let model = g.str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            let hint = if model == "llama" {
                " (SentencePiece, as Llama 1/2 and Mistral store it)"
            } else {
                ""
            };
            return Err(meta_err(
                "tokenizer.ggml.model",
                format!("`{model}`{hint}: only byte-level BPE (`gpt2`) tokenizers are supported"),
            ));
        }
        let tokens = strings(g, "tokenizer.ggml.tokens")?;
        let merges = strings(g, "tokenizer.ggml.merges")?;
        let types = match g.metadata.get("tokenizer.ggml.token_type") {
            Some(_) => integers(g, "tokenizer.ggml.token_type")?,
            None => vec![1; tokens.len()],
        };
        if types.len() != tokens.len() {
            return Err(meta_err(
                "tokenizer.ggml.token_type",
                format!("{} types for {} tokens", types.len(), tokens.len()),
            ));
        }
        let pre = match g.metadata.get("tokenizer.ggml.pre") {
            Some(_) => g.str("tokenizer.ggml.pre")?,
            None => "default",
        };
        let (pre_tokenizer, ignore_merges) = pre_tokenizer(pre).ok_or_else(|| {
            meta_err(
                "tokenizer.ggml.pre",
                format!(
                    "pre-tokenizer `{pre}` is not known; known: default, gpt-2, smollm, \
                         starcoder, llama-bpe, qwen2 and their aliases"
                ),
            )
        })?;
        let id = |key: &str| -> Result<Option<u32>> {
            if !g.metadata.contains_key(key) {
                return Ok(None);
            }
            let v = g.usize(key)?;
            match u32::try_from(v).ok().filter(|&v| (v as usize) < tokens.len()) {
                Some(v) => Ok(Some(v)),
                None => {
                    Err(meta_err(key, format!("id {v} is outside the {} tokens", tokens.len())))
                }
            }
        };
        let bos = id("tokenizer.ggml.bos_token_id")?;
        let add_bos = match g.metadata.get("tokenizer.ggml.add_bos_token") {
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                return Err(meta_err(
                    "tokenizer.ggml.add_bos_token",
                    format!("{v:?} is not a bool"),
                ))
            }
            // Hugging Face's byte-level BPE tokenizers add no BOS unless they say so.
            None => false,
        };
        if add_bos && bos.is_none() {
            return Err(meta_err(
                "tokenizer.ggml.bos_token_id",
                "missing, and add_bos_token is true".into(),
            ));
        }
        let eos: Vec<u32> =
            [id("tokenizer.ggml.eos_token_id")?, id("tokenizer.ggml.eot_token_id")?]
                .into_iter()
                .flatten()
                .collect();
        let json = tokenizer_json(&tokens, &types, &merges, pre_tokenizer, ignore_merges)
            .map_err(|(key, what)| meta_err(key, what))?;
        let inner = <tokenizers::Tokenizer as std::str::FromStr>::from_str(&json.to_string())
            .map_err(|e| Error::File {
                path: g.path().to_path_buf(),
                what: format!("the tokenizer.ggml.* metadata make no valid tokenizer: {e}"),
            })?;
        Ok(Tokenizer { inner, bos: bos.filter(|_| add_bos), eos, path: g.path().to_path_buf() })
    }

    /// The ids of `text`, with the special tokens the tokenizer adds (a BOS, if it adds one).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc =
            self.inner.encode(text, true).map_err(|e| self.err(format!("cannot encode: {e}")))?;
        Ok(self.bos.into_iter().chain(enc.get_ids().iter().copied()).collect())
    }

    /// The text of `ids`, special tokens left out.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, true).map_err(|e| self.err(format!("cannot decode {ids:?}: {e}")))
    }

    /// Whether `id` ends a generation.
    pub fn is_eos(&self, id: u32) -> bool {
        self.eos.contains(&id)
    }

    /// The ids that end a generation.
    pub fn eos(&self) -> &[u32] {
        &self.eos
    }

    /// Tokens in the vocabulary, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id of a token written as the vocabulary has it (`<|im_start|>`).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    fn err(&self, what: String) -> Error {
        Error::File { path: self.path.clone(), what }
    }
}

/// The pre-tokenizer llama.cpp applies for `tokenizer.ggml.pre` (llama-vocab.cpp's regex
/// lists), as the `tokenizer.json` the converter read declares it, and whether that file's BPE
/// takes a word found whole in the vocabulary without merging (Llama 3's `ignore_merges`).
fn pre_tokenizer(pre: &str) -> Option<(Json, bool)> {
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let split = |regex: &str| json!({"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false});
    let sequence = |parts: Vec<Json>| json!({"type": "Sequence", "pretokenizers": parts});
    Some(match pre {
        // GPT-2's split, which the ByteLevel pre-tokenizer applies itself.
        "default" | "gpt-2" | "gpt2" | "mpt" | "olmo" | "jais" => (byte_level(true), false),
        // Every digit on its own, then GPT-2's split.
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => {
            (
                sequence(vec![
                    json!({"type": "Digits", "individual_digits": true}),
                    byte_level(true),
                ]),
                false,
            )
        }
        "llama-bpe" | "llama3" | "llama-v3" | "smaug-bpe" | "dbrx" => {
            (sequence(vec![split(LLAMA3_SPLIT), byte_level(false)]), true)
        }
        "qwen2" | "stablelm2" => (sequence(vec![split(QWEN2_SPLIT), byte_level(false)]), false),
        _ => return None,
    })
}

/// The `tokenizer.json` of a byte-level BPE: `tokens` by id, each `merges` entry two tokens
/// joined by one space, control and user-defined tokens added whole (control ones special).
fn tokenizer_json(
    tokens: &[String],
    types: &[i128],
    merges: &[String],
    pre_tokenizer: Json,
    ignore_merges: bool,
) -> std::result::Result<Json, (&'static str, String)> {
    let vocab: serde_json::Map<String, Json> =
        tokens.iter().enumerate().map(|(i, t)| (t.clone(), json!(i))).collect();
    let merges = merges
        .iter()
        .enumerate()
        .map(|(i, m)| match m.split_once(' ') {
            Some((a, b)) if vocab.contains_key(a) && vocab.contains_key(b) => Ok(json!([a, b])),
            _ => Err((
                "tokenizer.ggml.merges",
                format!("merge {i} `{m}` is not two tokens of the vocabulary joined by a space"),
            )),
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let added: Vec<Json> = tokens
        .iter()
        .zip(types)
        .enumerate()
        .filter(|(_, (_, &ty))| ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED)
        .map(|(id, (t, &ty))| {
            json!({"id": id, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": ty == TOKEN_TYPE_CONTROL})
        })
        .collect();
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true});
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges
        }
    }))
}

/// Metadata `key` as an array of strings.
fn strings<B: AsRef<[u8]>>(g: &Gguf<B>, key: &str) -> Result<Vec<String>> {
    array(g, key, |v| match v {
        Value::String(s) => Some(s.clone()),
        _ => None,
    })
}

/// Metadata `key` as an array of integers.
fn integers<B: AsRef<[u8]>>(g: &Gguf<B>, key: &str) -> Result<Vec<i128>> {
    array(g, key, Value::as_i128)
}

fn array<B: AsRef<[u8]>, T>(
    g: &Gguf<B>,
    key: &str,
    item: impl Fn(&Value) -> Option<T>,
) -> Result<Vec<T>> {
    let err =
        |what: String| Error::Metadata { path: g.path().to_path_buf(), key: key.into(), what };
    match g.get(key)? {
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                item(v).ok_or_else(|| err(format!("item {i} is {v:?}, not of the array's kind")))
            })
            .collect(),
        v => Err(err(format!("{v:?} is not an array"))),
    }
}

/// `eos_token_id` of a Hugging Face JSON file (a number or a list of them); none if the file
/// or the key is absent.
fn eos_ids(path: &Path) -> Result<Vec<u32>> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(Vec::new());
    };
    let v: Json = serde_json::from_str(&text)
        .map_err(|e| Error::File { path: path.to_path_buf(), what: format!("not JSON: {e}") })?;
    let bad = |x: &Json| Error::Metadata {
        path: path.to_path_buf(),
        key: "eos_token_id".into(),
        what: format!("{x} is not a token id or a list of them"),
    };
    let id = |x: &Json| x.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| bad(x));
    match v.get("eos_token_id") {
        None | Some(Json::Null) => Ok(Vec::new()),
        Some(Json::Array(xs)) => xs.iter().map(id).collect(),
        Some(x) => Ok(vec![id(x)?]),
    }
}

/// Generated ids to text as they come: each `push` returns the text the new id completes.
/// Decoding the whole sequence each time keeps what byte-level BPE and merges across tokens
/// produce; text ending in an incomplete UTF-8 character (U+FFFD) waits for the next id.
pub struct TextStream<'a> {
    tokenizer: &'a Tokenizer,
    ids: Vec<u32>,
    /// Bytes of the decoded text already returned.
    emitted: usize,
}

impl<'a> TextStream<'a> {
    pub fn new(tokenizer: &'a Tokenizer) -> TextStream<'a> {
        TextStream { tokenizer, ids: Vec::new(), emitted: 0 }
    }

    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        let text = self.tokenizer.decode(&self.ids)?;
        if text.ends_with('\u{fffd}') {
            return Ok(String::new());
        }
        let new = text.get(self.emitted..).unwrap_or("").to_string();
        self.emitted = text.len().max(self.emitted);
        Ok(new)
    }
}
