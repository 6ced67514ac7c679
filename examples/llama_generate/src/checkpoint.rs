//! A Llama-architecture model's weights as f32, in the layouts the graphs take (linear weights
//! `[in, out]`), from a Hugging Face checkpoint directory (`config.json` and
//! `model.safetensors`, or shards listed by `model.safetensors.index.json`, memory-mapped and
//! bounds-checked by the `safetensors` crate) or from a GGUF file (`gguf`, with the Q and K
//! rows GGUF's converter permuted for GGML's RoPE put back in Hugging Face's order, so one
//! graph, rotating halves, serves both). Every tensor's shape is checked against the config.

use crate::config::Config;
use crate::gguf::Gguf;
use crate::{Error, Result};
use safetensors::{Dtype, SafeTensors};
use std::path::{Path, PathBuf};

/// One decoder layer's weights.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    /// `[hidden, heads * head_dim]`.
    pub wq: Vec<f32>,
    /// `[hidden, kv_heads * head_dim]`.
    pub wk: Vec<f32>,
    pub wv: Vec<f32>,
    /// `[heads * head_dim, hidden]`.
    pub wo: Vec<f32>,
    pub mlp_norm: Vec<f32>,
    /// `[hidden, intermediate]`.
    pub w_gate: Vec<f32>,
    pub w_up: Vec<f32>,
    /// `[intermediate, hidden]`.
    pub w_down: Vec<f32>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Weights {
    pub config: Config,
    /// `[vocab, hidden]`.
    pub embed: Vec<f32>,
    pub layers: Vec<LayerWeights>,
    pub final_norm: Vec<f32>,
    /// `[hidden, vocab]`; `None` when tied to `embed`.
    pub output: Option<Vec<f32>>,
}

/// Where a tensor is, by the checkpoint's own names: reads it as f32 row-major with its shape.
trait Source {
    fn read(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)>;
    fn path(&self) -> &Path;
}

impl Weights {
    /// A Hugging Face checkpoint directory.
    pub fn from_hf_dir(dir: &Path) -> Result<Weights> {
        let config = Config::from_hf(&dir.join("config.json"))?;
        let files = shard_files(dir)?;
        let maps = files.iter().map(|f| map(f)).collect::<Result<Vec<_>>>()?;
        let mut tensors = Vec::with_capacity(maps.len());
        for (f, m) in files.iter().zip(&maps) {
            let t = SafeTensors::deserialize(m).map_err(|e| Error::File {
                path: f.clone(),
                what: format!("not a valid safetensors file: {e}"),
            })?;
            tensors.push(t);
        }
        let src = Safetensors { dir, files: &files, tensors };
        let hf = |i: usize, part: &str| format!("model.layers.{i}.{part}.weight");
        load(
            &src,
            config,
            &Names {
                embed: "model.embed_tokens.weight".into(),
                final_norm: "model.norm.weight".into(),
                output: "lm_head.weight".into(),
                layer: &|i, p| {
                    hf(
                        i,
                        match p {
                            Part::AttnNorm => "input_layernorm",
                            Part::Q => "self_attn.q_proj",
                            Part::K => "self_attn.k_proj",
                            Part::V => "self_attn.v_proj",
                            Part::O => "self_attn.o_proj",
                            Part::MlpNorm => "post_attention_layernorm",
                            Part::Gate => "mlp.gate_proj",
                            Part::Up => "mlp.up_proj",
                            Part::Down => "mlp.down_proj",
                        },
                    )
                },
                permuted_qk: false,
            },
        )
    }

    /// A GGUF file of a `llama` model.
    pub fn from_gguf(path: &Path) -> Result<Weights> {
        let g = Gguf::open(path)?;
        let config = Config::from_gguf(&g)?;
        let blk = |i: usize, part: &str| format!("blk.{i}.{part}.weight");
        load(
            &g,
            config,
            &Names {
                embed: "token_embd.weight".into(),
                final_norm: "output_norm.weight".into(),
                output: "output.weight".into(),
                layer: &|i, p| {
                    blk(
                        i,
                        match p {
                            Part::AttnNorm => "attn_norm",
                            Part::Q => "attn_q",
                            Part::K => "attn_k",
                            Part::V => "attn_v",
                            Part::O => "attn_output",
                            Part::MlpNorm => "ffn_norm",
                            Part::Gate => "ffn_gate",
                            Part::Up => "ffn_up",
                            Part::Down => "ffn_down",
                        },
                    )
                },
                permuted_qk: true,
            },
        )
    }
}

#[derive(Clone, Copy)]
enum Part {
    AttnNorm,
    Q,
    K,
    V,
    O,
    MlpNorm,
    Gate,
    Up,
    Down,
}

/// A checkpoint format's tensor names, and whether its Q and K rows are in GGML's order.
struct Names<'a> {
    embed: String,
    final_norm: String,
    output: String,
    layer: &'a dyn Fn(usize, Part) -> String,
    permuted_qk: bool,
}

fn load(src: &dyn Source, config: Config, names: &Names) -> Result<Weights> {
    let c = &config;
    let (d, q, kv, f, v) =
        (c.hidden, c.heads * c.head_dim, c.kv_heads * c.head_dim, c.intermediate, c.vocab);
    let read = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
        let (got, data) = src.read(name)?;
        if got != shape {
            return Err(Error::Tensor {
                path: src.path().to_path_buf(),
                tensor: name.into(),
                what: format!("shape {got:?}, the config says {shape:?}"),
            });
        }
        Ok(data)
    };
    // Linear weights are stored `[out, in]`; the graphs take `[in, out]`.
    let linear = |name: &str, out: usize, inp: usize, heads: Option<usize>| -> Result<Vec<f32>> {
        let mut w = read(name, &[out, inp])?;
        if let Some(h) = heads.filter(|_| names.permuted_qk) {
            w = unpermute_rows(&w, out, inp, h);
        }
        Ok(transpose(&w, out, inp))
    };
    let mut layers = Vec::with_capacity(c.layers);
    for i in 0..c.layers {
        let n = |p| (names.layer)(i, p);
        layers.push(LayerWeights {
            attn_norm: read(&n(Part::AttnNorm), &[d])?,
            wq: linear(&n(Part::Q), q, d, Some(c.heads))?,
            wk: linear(&n(Part::K), kv, d, Some(c.kv_heads))?,
            wv: linear(&n(Part::V), kv, d, None)?,
            wo: linear(&n(Part::O), d, q, None)?,
            mlp_norm: read(&n(Part::MlpNorm), &[d])?,
            w_gate: linear(&n(Part::Gate), f, d, None)?,
            w_up: linear(&n(Part::Up), f, d, None)?,
            w_down: linear(&n(Part::Down), d, f, None)?,
        });
    }
    let output = if c.tied { None } else { Some(linear(&names.output, v, d, None)?) };
    Ok(Weights {
        embed: read(&names.embed, &[v, d])?,
        layers,
        final_norm: read(&names.final_norm, &[d])?,
        output,
        config,
    })
}

/// `w` (`[rows, cols]`) transposed.
fn transpose(w: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0; w.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = w[r * cols + c];
        }
    }
    t
}

/// Undo the row permutation GGUF's converter applies to Q and K (`[heads * dh, cols]`): within
/// each head, GGUF row `2 j + t` is Hugging Face row `t * dh / 2 + j`.
fn unpermute_rows(w: &[f32], rows: usize, cols: usize, heads: usize) -> Vec<f32> {
    let dh = rows / heads;
    let half = dh / 2;
    let mut out = vec![0.0; w.len()];
    for h in 0..heads {
        for j in 0..half {
            for t in 0..2 {
                let (from, to) = (h * dh + 2 * j + t, h * dh + t * half + j);
                out[to * cols..(to + 1) * cols].copy_from_slice(&w[from * cols..(from + 1) * cols]);
            }
        }
    }
    out
}

impl<B: AsRef<[u8]>> Source for Gguf<B> {
    fn read(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        self.f32(name)
    }
    fn path(&self) -> &Path {
        Gguf::path(self)
    }
}

/// The checkpoint's files: `model.safetensors`, or the shards its index lists.
fn shard_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    let err = |what: String| Error::File { path: index.clone(), what };
    let text = std::fs::read_to_string(&index).map_err(|e| {
        err(format!("cannot read ({e}), and there is no model.safetensors in {}", dir.display()))
    })?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| err(format!("not JSON: {e}")))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| err("no `weight_map` object".into()))?;
    let mut files = std::collections::BTreeSet::new();
    for (tensor, file) in map {
        let f =
            file.as_str().ok_or_else(|| err(format!("`{tensor}`: file {file} is not a string")))?;
        // A shard is a file name in the directory, never a path out of it.
        if f.contains('/') || f.contains('\\') || f.starts_with('.') {
            return Err(err(format!(
                "`{tensor}`: shard `{f}` is not a file name in the directory"
            )));
        }
        files.insert(dir.join(f));
    }
    Ok(files.into_iter().collect())
}

fn map(path: &Path) -> Result<memmap2::Mmap> {
    let err = |what: String| Error::File { path: path.to_path_buf(), what };
    let file = std::fs::File::open(path).map_err(|e| err(format!("cannot open: {e}")))?;
    // SAFETY: read only, and only while the model loads (the weights are copied out).
    unsafe { memmap2::Mmap::map(&file) }.map_err(|e| err(format!("cannot map: {e}")))
}

/// The shards of a Hugging Face checkpoint, parsed.
struct Safetensors<'a> {
    dir: &'a Path,
    files: &'a [PathBuf],
    tensors: Vec<SafeTensors<'a>>,
}

impl Source for Safetensors<'_> {
    fn read(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let found = self
            .tensors
            .iter()
            .zip(self.files)
            .find_map(|(t, f)| t.tensor(name).ok().map(|v| (v, f)));
        let (view, file) = found.ok_or_else(|| Error::Tensor {
            path: self.dir.to_path_buf(),
            tensor: name.into(),
            what: "in no safetensors file of the checkpoint".into(),
        })?;
        let err = |what: String| Error::Tensor { path: file.clone(), tensor: name.into(), what };
        let data = view.data();
        let values: Vec<f32> = match view.dtype() {
            Dtype::F32 => {
                data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
            }
            Dtype::F16 => data
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::BF16 => data
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            other => {
                return Err(err(format!("dtype {other:?}: this loader reads F32, F16 and BF16")))
            }
        };
        Ok((view.shape().to_vec(), values))
    }
    fn path(&self) -> &Path {
        self.dir
    }
}
