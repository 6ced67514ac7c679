//! Weights from `model.safetensors`: the file is memory-mapped, its header parsed and every
//! tensor's extent checked against the file by the `safetensors` crate; each tensor the model
//! reads is then checked for its expected shape and converted once to f32 in the layout the
//! graphs take (linear weights transposed to `[in, out]`).

use crate::{file_error, Error, Result};
use safetensors::{Dtype, SafeTensors};
use std::path::{Path, PathBuf};

/// A mapped checkpoint file. The map lives only while the model loads: the weights are copied
/// out into tensors, so a file replaced on disk later does not change a loaded model.
pub struct Mapped {
    path: PathBuf,
    map: memmap2::Mmap,
}

impl Mapped {
    pub fn open(dir: &Path) -> Result<Mapped> {
        let path = dir.join("model.safetensors");
        let file = std::fs::File::open(&path).map_err(|e| Error::File {
            path: path.clone(),
            what: format!("cannot open: {e}"),
            hint: Some(crate::FETCH_HINT.into()),
        })?;
        // SAFETY: the map is read only, and only while the model loads (see `Mapped`); a file
        // truncated under it by another process is outside what a mapped reader can guard.
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| file_error(&path, format!("cannot map: {e}")))?;
        Ok(Mapped { path, map })
    }

    /// The parsed header over the map.
    pub fn reader(&self) -> Result<Reader<'_>> {
        let tensors = SafeTensors::deserialize(&self.map)
            .map_err(|e| file_error(&self.path, format!("not a valid safetensors file: {e}")))?;
        // Checkpoints saved from a task model (BertForMaskedLM, ...) prefix the encoder's names.
        let prefix = ["", "bert."]
            .into_iter()
            .find(|p| tensors.tensor(&format!("{p}embeddings.word_embeddings.weight")).is_ok())
            .ok_or_else(|| Error::Tensor {
                path: self.path.clone(),
                tensor: "embeddings.word_embeddings.weight".into(),
                what: "not found (nor with the `bert.` prefix): not a BERT checkpoint".into(),
            })?;
        Ok(Reader { path: &self.path, tensors, prefix })
    }
}

/// Tensors of one checkpoint by their Hugging Face names (without the model's prefix).
pub struct Reader<'a> {
    path: &'a Path,
    tensors: SafeTensors<'a>,
    prefix: &'static str,
}

impl Reader<'_> {
    /// Tensor `name` as f32, checked to have `shape`. Older checkpoints name LayerNorm's
    /// weight and bias `gamma` and `beta`: those names are tried too.
    pub fn f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let err = |what: String| Error::Tensor {
            path: self.path.to_path_buf(),
            tensor: format!("{}{name}", self.prefix),
            what,
        };
        let legacy = name
            .strip_suffix("LayerNorm.weight")
            .map(|s| format!("{s}LayerNorm.gamma"))
            .or_else(|| name.strip_suffix("LayerNorm.bias").map(|s| format!("{s}LayerNorm.beta")));
        let view = std::iter::once(name.to_string())
            .chain(legacy)
            .find_map(|n| self.tensors.tensor(&format!("{}{n}", self.prefix)).ok())
            .ok_or_else(|| err("not in the file".into()))?;
        if view.shape() != shape {
            return Err(err(format!(
                "shape {:?}, expected {shape:?} from config.json",
                view.shape()
            )));
        }
        let bytes = view.data();
        Ok(match view.dtype() {
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F16 => bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::BF16 => bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            other => return Err(err(format!("element type {other:?}: F32, F16 or BF16 expected"))),
        })
    }

    /// A linear layer's weight, stored `[out, in]` as torch's `nn.Linear` keeps it, transposed
    /// to the `[in, out]` the graphs' `linear` takes, and scaled by `scale`.
    pub fn linear_weight(
        &self,
        name: &str,
        inputs: usize,
        outputs: usize,
        scale: f32,
    ) -> Result<Vec<f32>> {
        let w = self.f32(name, &[outputs, inputs])?;
        let mut t = vec![0f32; w.len()];
        for (o, row) in w.chunks_exact(inputs).enumerate() {
            for (i, v) in row.iter().enumerate() {
                t[i * outputs + o] = v * scale;
            }
        }
        Ok(t)
    }
}
