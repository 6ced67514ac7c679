//! Weights read from model files at run time, for the modules `autofusion_build::Builder::onnx`
//! generates: each weight is a byte range of a file (the model, or its external-data file)
//! that the build recorded with a hash of its bytes. The file is memory-mapped, the range
//! checked against the file's length and the recorded hash, and copied once into a tensor
//! (the weights are then packed once per tensor like any other). A model file replaced or
//! edited since the build is an error naming the file and the weight, never wrong results.

use crate::error::{Error, Result};
use crate::tensor::Tensor;
use autofusion_ir::ir::DType;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// One weight as the build found it.
#[derive(Clone, Copy, Debug)]
pub struct WeightRef {
    /// The initializer's name in the model.
    pub name: &'static str,
    pub dtype: DType,
    pub shape: &'static [usize],
    /// The file holding it, relative to the model's directory (`""`: the model itself), and
    /// its byte range there. Ignored when `inline` holds the bytes.
    pub file: &'static str,
    pub offset: u64,
    pub len: u64,
    /// FNV-1a (64-bit) of the bytes.
    pub hash: u64,
    /// Bytes that are in no file as such (the model stored them in typed fields), embedded by
    /// the build.
    pub inline: Option<&'static [u8]>,
}

/// What the build records of each weight's bytes (FNV-1a, 64-bit).
pub use autofusion_ir::hash::fnv1a;

fn fail(file: &Path, weight: &str, msg: String) -> Error {
    Error::Weights { file: file.display().to_string(), weight: weight.to_string(), msg }
}

/// A read-only mapping of `path`, which holds `weight` (named in the error).
fn map(path: &Path, weight: &str) -> Result<Option<memmap2::Mmap>> {
    let io = |e: std::io::Error| fail(path, weight, format!("cannot read the file: {e}"));
    let file = std::fs::File::open(path).map_err(io)?;
    if file.metadata().map_err(io)?.len() == 0 {
        return Ok(None);
    }
    // SAFETY: a read-only private mapping; every range read from it is bounds-checked
    // against its length and its bytes are hashed before use, so a file changed on disk
    // gives an error (a file truncated while mapped faults like any mapped read; model files
    // are not rewritten in place while a process loads them).
    unsafe { memmap2::Mmap::map(&file) }.map(Some).map_err(io)
}

/// The weights of `table` read from the model at `model` (its directory resolves the
/// external-data files), in table order.
pub fn load(model: &Path, table: &[WeightRef]) -> Result<Vec<Tensor>> {
    let dir = model.parent().unwrap_or(Path::new("."));
    let mut maps: HashMap<PathBuf, Option<memmap2::Mmap>> = HashMap::new();
    let mut out = Vec::with_capacity(table.len());
    for w in table {
        let path = if w.file.is_empty() { model.to_path_buf() } else { dir.join(w.file) };
        let bytes: &[u8] = match w.inline {
            Some(b) => b,
            None => {
                if !maps.contains_key(&path) {
                    let m = map(&path, w.name)?;
                    maps.insert(path.clone(), m);
                }
                let all: &[u8] = maps[&path].as_deref().unwrap_or(&[]);
                let range = usize::try_from(w.offset)
                    .ok()
                    .zip(usize::try_from(w.len).ok())
                    .and_then(|(o, l)| Some(o..o.checked_add(l)?))
                    .filter(|r| r.end <= all.len());
                let Some(range) = range else {
                    return Err(fail(
                        &path,
                        w.name,
                        format!(
                            "bytes {}..{} are past the end of the file ({} bytes): the model \
                             changed since the build; rebuild",
                            w.offset,
                            w.offset.saturating_add(w.len),
                            all.len()
                        ),
                    ));
                };
                &all[range]
            }
        };
        if fnv1a(bytes) != w.hash {
            return Err(fail(
                &path,
                w.name,
                "its bytes differ from the model the build read: the model changed since the \
                 build; rebuild"
                    .into(),
            ));
        }
        let t = Tensor::from_le_bytes(w.dtype, w.shape, bytes)
            .map_err(|e| fail(&path, w.name, e.to_string()))?;
        out.push(t);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(dir: &Path, bytes: &[u8]) -> PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        let p = dir.join("m.onnx");
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn weights_are_read_checked_and_a_changed_file_is_an_error() {
        let dir = std::env::temp_dir().join(format!("af-weights-{}", std::process::id()));
        let data: Vec<u8> = [1.5f32, -2.0, 0.25].iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut file = b"header..".to_vec();
        file.extend(&data);
        let p = model(&dir, &file);
        let w = WeightRef {
            name: "w",
            dtype: DType::F32,
            shape: &[3],
            file: "",
            offset: 8,
            len: 12,
            hash: fnv1a(&data),
            inline: None,
        };
        let t = load(&p, &[w]).unwrap();
        assert_eq!(t[0].to_f32_vec(), [1.5, -2.0, 0.25]);
        // Same length, other bytes: the hash says so.
        file[10] ^= 0xff;
        std::fs::write(&p, &file).unwrap();
        let e = load(&p, &[w]).unwrap_err().to_string();
        assert!(e.contains("weight `w`") && e.contains("rebuild"), "{e}");
        // Truncated: the range is past the end.
        std::fs::write(&p, &file[..10]).unwrap();
        let e = load(&p, &[w]).unwrap_err().to_string();
        assert!(e.contains("past the end"), "{e}");
        // Missing file.
        let e = load(&dir.join("gone.onnx"), &[w]).unwrap_err().to_string();
        assert!(e.contains("cannot read") && e.contains("weight `w`"), "{e}");
        // Inline bytes need no file; f16 from its bit patterns.
        let h: Vec<u8> =
            [half::f16::from_f32(0.5).to_bits()].iter().flat_map(|b| b.to_le_bytes()).collect();
        let hw: &'static [u8] = Box::leak(h.into_boxed_slice());
        let inl = WeightRef {
            dtype: DType::F16,
            shape: &[1],
            len: 2,
            hash: fnv1a(hw),
            inline: Some(hw),
            ..w
        };
        assert_eq!(load(&dir.join("gone.onnx"), &[inl]).unwrap()[0].to_f32_vec(), [0.5]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
