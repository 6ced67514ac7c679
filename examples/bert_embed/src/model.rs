//! The encoder: weights loaded for the graphs of `graphs.rs`, the tokenizer, and embedding
//! sentences in padded batches.

use crate::checkpoint::{Mapped, Reader};
use crate::{file_error, graphs, Config, Error, Result};
use autofusion::{Device, Tensor};
use std::path::Path;

/// How the graphs run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exec {
    /// The fused kernels build.rs compiled (the plan of `opt_level` 3), on a device.
    Fused(Device),
    /// One kernel per op (`opt_level` 0): the unfused baseline.
    Unfused,
    /// The reference interpreter, op by op in f64: the oracle, slow.
    Reference,
}

/// Call graph `$g` of `graphs.rs` the way `$exec` says.
macro_rules! run {
    ($g:ident, $exec:expr, $($arg:expr),+ $(,)?) => {
        match $exec {
            Exec::Fused(device) => graphs::$g::run_on(device, $($arg),+),
            Exec::Unfused => graphs::$g::unfused($($arg),+),
            Exec::Reference => graphs::$g::reference($($arg),+),
        }
    };
}

/// The weights of one encoder layer, in the order and layout `graphs::bert_layer` takes them.
struct Layer([Tensor; 16]);

/// A BERT encoder with its tokenizer, ready to embed sentences.
pub struct Encoder {
    pub config: Config,
    tokenizer: tokenizers::Tokenizer,
    tokenizer_path: std::path::PathBuf,
    /// Word, position and token-type tables, then the embedding LayerNorm's weight and bias.
    embeddings: [Tensor; 5],
    layers: Vec<Layer>,
    /// Sentences are truncated to this many tokens, `[CLS]` and `[SEP]` included.
    pub max_tokens: usize,
}

fn tensor(data: Vec<f32>, shape: &[usize]) -> Result<Tensor> {
    Ok(Tensor::from_f32(shape, data)?)
}

impl Encoder {
    /// Load `dir/config.json`, `dir/model.safetensors` and `dir/tokenizer.json`; sentences are
    /// truncated to `max_tokens` (at most the model's `max_position_embeddings`).
    pub fn load(dir: &Path, max_tokens: usize) -> Result<Encoder> {
        let config = Config::load(dir)?;
        let max_tokens = max_tokens.min(config.max_position_embeddings);
        if max_tokens < 2 {
            return Err(file_error(
                &dir.join("config.json"),
                format!("max tokens {max_tokens}: [CLS] and [SEP] need two"),
            ));
        }
        let tokenizer_path = dir.join("tokenizer.json");
        let tokenizer = load_tokenizer(&tokenizer_path, max_tokens)?;
        let mapped = Mapped::open(dir)?;
        let reader = mapped.reader()?;
        let embeddings = load_embeddings(&reader, &config)?;
        let layers = (0..config.num_hidden_layers)
            .map(|i| load_layer(&reader, &config, i))
            .collect::<Result<Vec<_>>>()?;
        Ok(Encoder { config, tokenizer, tokenizer_path, embeddings, layers, max_tokens })
    }

    /// Token ids and token-type ids of each sentence, truncated to `max_tokens`.
    pub fn tokenize(&self, sentences: &[&str]) -> Result<Vec<(Vec<i64>, Vec<i64>)>> {
        sentences
            .iter()
            .map(|s| {
                let e = self.tokenizer.encode(*s, true).map_err(|e| {
                    file_error(&self.tokenizer_path, format!("cannot tokenize {s:?}: {e}"))
                })?;
                let ids = e.get_ids().iter().map(|&i| i64::from(i)).collect();
                let types = e.get_type_ids().iter().map(|&i| i64::from(i)).collect();
                Ok((ids, types))
            })
            .collect()
    }

    /// Embeddings `[n, hidden]` of `sentences`, in their order, computed `batch` sentences at a
    /// time (sorted by length first, so that a batch pads little, as sentence-transformers does).
    pub fn embed(&self, sentences: &[&str], batch: usize, exec: Exec) -> Result<Vec<Vec<f32>>> {
        let tokens = self.tokenize(sentences)?;
        let mut order: Vec<usize> = (0..tokens.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(tokens[i].0.len()));
        let mut out = vec![Vec::new(); tokens.len()];
        for chunk in order.chunks(batch.max(1)) {
            let batch: Vec<&(Vec<i64>, Vec<i64>)> = chunk.iter().map(|&i| &tokens[i]).collect();
            let rows = self.embed_tokens(&batch, exec)?;
            for (&i, row) in chunk.iter().zip(rows) {
                out[i] = row;
            }
        }
        Ok(out)
    }

    /// Embeddings of one batch of tokenized sentences, padded on the right to the longest.
    pub fn embed_tokens(
        &self,
        batch: &[&(Vec<i64>, Vec<i64>)],
        exec: Exec,
    ) -> Result<Vec<Vec<f32>>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let p = Padded::new(batch);
        let shape = [batch.len(), p.len];
        let ids = Tensor::from_i64(&shape, p.ids)?;
        let types = Tensor::from_i64(&shape, p.types)?;
        let mask = Tensor::from_i64(&shape, p.mask)?;
        let [word, position, token_type, ln_g, ln_b] = &self.embeddings;
        let mut h =
            run!(bert_embeddings, exec, &ids, &types, word, position, token_type, ln_g, ln_b)?;
        for Layer(w) in &self.layers {
            let [w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o, ln1_g, ln1_b, w1, b1, w2, b2, ln2_g, ln2_b] =
                w;
            h = run!(
                bert_layer, exec, &h, &mask, w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o, ln1_g, ln1_b,
                w1, b1, w2, b2, ln2_g, ln2_b
            )?;
        }
        let pooled = run!(mean_pool, exec, &h, &mask)?.to_f32_vec();
        Ok(pooled.chunks_exact(self.config.hidden_size).map(<[f32]>::to_vec).collect())
    }
}

/// A batch of tokenized sentences padded on the right to the longest: ids, token types and
/// the attention mask, each `[batch, len]` row-major (padding: id 0, type 0, mask 0).
pub struct Padded {
    pub len: usize,
    pub ids: Vec<i64>,
    pub types: Vec<i64>,
    pub mask: Vec<i64>,
}

impl Padded {
    pub fn new(batch: &[&(Vec<i64>, Vec<i64>)]) -> Padded {
        let len = batch.iter().map(|t| t.0.len()).max().unwrap_or(0);
        let n = batch.len() * len;
        let (mut ids, mut types, mut mask) = (vec![0; n], vec![0; n], vec![0; n]);
        for (r, (i, t)) in batch.iter().map(|t| (&t.0, &t.1)).enumerate() {
            ids[r * len..r * len + i.len()].copy_from_slice(i);
            types[r * len..r * len + t.len()].copy_from_slice(t);
            mask[r * len..r * len + i.len()].fill(1);
        }
        Padded { len, ids, types, mask }
    }
}

fn load_tokenizer(path: &Path, max_tokens: usize) -> Result<tokenizers::Tokenizer> {
    let mut t = tokenizers::Tokenizer::from_file(path).map_err(|e| Error::File {
        path: path.to_path_buf(),
        what: format!("cannot load the tokenizer: {e}"),
        hint: (!path.exists()).then(|| crate::FETCH_HINT.into()),
    })?;
    // The file's own truncation and padding (all-MiniLM-L6-v2's say 128 and a fixed pad) are
    // replaced: sentences are cut at `max_tokens` and batches padded here, to their longest.
    let truncation = tokenizers::TruncationParams { max_length: max_tokens, ..Default::default() };
    t.with_truncation(Some(truncation))
        .map_err(|e| file_error(path, format!("cannot truncate at {max_tokens}: {e}")))?;
    t.with_padding(None);
    Ok(t)
}

fn load_embeddings(r: &Reader, c: &Config) -> Result<[Tensor; 5]> {
    let d = c.hidden_size;
    let table = |name: &str, rows: usize| {
        tensor(r.f32(&format!("embeddings.{name}.weight"), &[rows, d])?, &[rows, d])
    };
    let norm = |name: &str| tensor(r.f32(&format!("embeddings.LayerNorm.{name}"), &[d])?, &[d]);
    Ok([
        table("word_embeddings", c.vocab_size)?,
        table("position_embeddings", c.max_position_embeddings)?,
        table("token_type_embeddings", c.type_vocab_size)?,
        norm("weight")?,
        norm("bias")?,
    ])
}

fn load_layer(r: &Reader, c: &Config, i: usize) -> Result<Layer> {
    let (d, f, heads) = (c.hidden_size, c.intermediate_size, c.num_attention_heads);
    let p = format!("encoder.layer.{i}.");
    // softmax(q k^T / sqrt(dh)): the scale goes into the query projection (see graphs.rs).
    let scale = 1.0 / (c.head_size() as f32).sqrt();
    let linear = |name: &str, inputs: usize, outputs: usize, scale: f32| -> Result<[Tensor; 2]> {
        let w = r.linear_weight(&format!("{p}{name}.weight"), inputs, outputs, scale)?;
        let b = r.f32(&format!("{p}{name}.bias"), &[outputs])?;
        Ok([
            tensor(w, &[inputs, outputs])?,
            tensor(b.iter().map(|v| v * scale).collect(), &[outputs])?,
        ])
    };
    let norm = |name: &str| -> Result<[Tensor; 2]> {
        let g = r.f32(&format!("{p}{name}.LayerNorm.weight"), &[d])?;
        let b = r.f32(&format!("{p}{name}.LayerNorm.bias"), &[d])?;
        Ok([tensor(g, &[d])?, tensor(b, &[d])?])
    };
    let [w_q, b_q] = linear("attention.self.query", d, d, scale)?;
    let b_q = b_q.reshape(&[heads, c.head_size()])?;
    let [w_k, b_k] = linear("attention.self.key", d, d, 1.0)?;
    let [w_v, b_v] = linear("attention.self.value", d, d, 1.0)?;
    let [w_o, b_o] = linear("attention.output.dense", d, d, 1.0)?;
    let [ln1_g, ln1_b] = norm("attention.output")?;
    let [w1, b1] = linear("intermediate.dense", d, f, 1.0)?;
    let [w2, b2] = linear("output.dense", f, d, 1.0)?;
    let [ln2_g, ln2_b] = norm("output")?;
    Ok(Layer([w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o, ln1_g, ln1_b, w1, b1, w2, b2, ln2_g, ln2_b]))
}
