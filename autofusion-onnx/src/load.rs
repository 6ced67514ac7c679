//! Reading a model file: memory-mapped and decoded in place (`raw_data` of inline tensors are
//! slices of the mapping), and tensor data from external-data files, mapped too.

use crate::proto::{ModelProto, TensorProto, DATA_LOCATION_EXTERNAL};
use crate::OnnxError;
use bytes::Bytes;
use prost::Message;
use std::path::{Path, PathBuf};

/// A decoded model and the directory its external data is resolved against.
pub struct Model {
    pub proto: ModelProto,
    pub path: PathBuf,
    /// The mapped file the message was decoded from (`raw_data` fields are slices of it).
    pub bytes: Bytes,
}

/// Where a tensor's data is: a byte range of a file (the model's, for inline `raw_data`, or
/// an external-data file), or bytes that are in no file as such (typed repeated fields,
/// re-encoded little-endian).
#[derive(Clone, Debug, PartialEq)]
pub enum Location {
    File { path: PathBuf, offset: u64, len: u64 },
    Inline(Vec<u8>),
}

/// The location of the data of tensor `t` of `model`, `elem` bytes per element, `numel`
/// elements (checked as `tensor_bytes` checks them).
pub fn tensor_location(
    t: &TensorProto,
    model: &Model,
    elem: usize,
    numel: usize,
) -> Result<Location, OnnxError> {
    let data = tensor_bytes(t, &model.path, elem, numel)?;
    let file_range = |base: &Bytes, path: &Path| {
        let (b, d) = (base.as_ptr() as usize, data.as_ptr() as usize);
        (d >= b && d + data.len() <= b + base.len()).then(|| Location::File {
            path: path.to_path_buf(),
            offset: (d - b) as u64,
            len: data.len() as u64,
        })
    };
    if t.data_location == DATA_LOCATION_EXTERNAL {
        let (path, offset) = external_range(t, &model.path)?;
        return Ok(Location::File { path, offset, len: data.len() as u64 });
    }
    if data.is_empty() {
        return Ok(Location::Inline(Vec::new()));
    }
    Ok(file_range(&model.bytes, &model.path).unwrap_or_else(|| Location::Inline(data.to_vec())))
}

/// A read-only mapping of a file, owned by the `Bytes` handed out for it.
struct Mapped(memmap2::Mmap);

impl AsRef<[u8]> for Mapped {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Map `path` read-only (an empty file is read as no bytes: it cannot be mapped).
fn map_file(path: &Path) -> Result<Bytes, OnnxError> {
    let io = |e: std::io::Error| OnnxError::file(path, format!("cannot read it: {e}"));
    let file = std::fs::File::open(path).map_err(io)?;
    if file.metadata().map_err(io)?.len() == 0 {
        return Ok(Bytes::new());
    }
    // Safety: the mapping is read-only and private to this process. A file changed on disk
    // while mapped changes the bytes under us; the decoder and every reader of tensor data
    // check lengths against the declared shapes, so changed contents give wrong values or an
    // error, and a truncated file SIGBUS like any mapped read. Model files are not expected
    // to be rewritten in place while a compiler or a process reads them.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
    Ok(Bytes::from_owner(Mapped(map)))
}

/// Load and decode an ONNX model file.
pub fn load(path: &Path) -> Result<Model, OnnxError> {
    let bytes = map_file(path)?;
    let proto = ModelProto::decode(bytes.clone()).map_err(|e| {
        OnnxError::file(path, format!("is not an ONNX model (protobuf decoding failed: {e})"))
    })?;
    if proto.graph.is_none() {
        return Err(OnnxError::file(path, "holds no graph".into()));
    }
    Ok(Model { proto, path: path.to_path_buf(), bytes })
}

/// The raw little-endian bytes of a tensor: `raw_data`, the typed repeated fields re-encoded,
/// or the external-data file's range (mapped). `elem` is the element size in bytes.
pub fn tensor_bytes(
    t: &TensorProto,
    model_path: &Path,
    elem: usize,
    numel: usize,
) -> Result<Bytes, OnnxError> {
    let want = numel.checked_mul(elem).ok_or_else(|| {
        OnnxError::model(format!(
            "tensor `{}`: {numel} elements overflow the address space",
            t.name
        ))
    })?;
    let bytes = if t.data_location == DATA_LOCATION_EXTERNAL {
        external(t, model_path, want)?
    } else if !t.raw_data.is_empty() {
        t.raw_data.clone()
    } else if !t.float_data.is_empty() {
        Bytes::from(t.float_data.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>())
    } else if !t.int64_data.is_empty() {
        Bytes::from(t.int64_data.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>())
    } else if !t.double_data.is_empty() {
        Bytes::from(t.double_data.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>())
    } else if !t.int32_data.is_empty() {
        // int32_data carries int32, and the 16-bit and 8-bit types widened (one per element).
        let v: Vec<u8> = match elem {
            4 => t.int32_data.iter().flat_map(|f| f.to_le_bytes()).collect(),
            2 => t.int32_data.iter().flat_map(|f| (*f as u16).to_le_bytes()).collect(),
            _ => t.int32_data.iter().map(|f| *f as u8).collect(),
        };
        Bytes::from(v)
    } else {
        Bytes::new()
    };
    if bytes.len() != want {
        return Err(OnnxError::model(format!(
            "tensor `{}` holds {} bytes of data, its shape and type need {want}",
            t.name,
            bytes.len()
        )));
    }
    Ok(bytes)
}

/// The bytes of an external tensor: `location` relative to the model's directory, `offset`
/// and `length` (default: to the end of the file).
/// The file and start offset of an external tensor's data (`location` checked to stay inside
/// the model's directory).
fn external_range(t: &TensorProto, model_path: &Path) -> Result<(PathBuf, u64), OnnxError> {
    let (file, offset, _) = external_spec(t, model_path)?;
    Ok((file, offset as u64))
}

/// An external tensor's file, offset and declared length.
fn external_spec(
    t: &TensorProto,
    model_path: &Path,
) -> Result<(PathBuf, usize, Option<usize>), OnnxError> {
    let key = |k: &str| t.external_data.iter().find(|e| e.key == k).map(|e| e.value.as_str());
    let loc = key("location").ok_or_else(|| {
        OnnxError::model(format!("external tensor `{}` has no `location`", t.name))
    })?;
    let rel = Path::new(loc);
    if rel.is_absolute() || rel.components().any(|c| c == std::path::Component::ParentDir) {
        return Err(OnnxError::model(format!(
            "external tensor `{}`: location `{loc}` must be a relative path inside the model's directory",
            t.name
        )));
    }
    let file = model_path.parent().unwrap_or(Path::new(".")).join(rel);
    let num = |k: &str| -> Result<Option<usize>, OnnxError> {
        key(k)
            .map(|v| {
                v.parse::<usize>().map_err(|_| {
                    OnnxError::model(format!(
                        "external tensor `{}`: {k} `{v}` is not a number",
                        t.name
                    ))
                })
            })
            .transpose()
    };
    Ok((file, num("offset")?.unwrap_or(0), num("length")?))
}

fn external(t: &TensorProto, model_path: &Path, want: usize) -> Result<Bytes, OnnxError> {
    let (file, offset, length) = external_spec(t, model_path)?;
    let all = map_file(&file).map_err(|e| {
        OnnxError::model(format!("external data of tensor `{}`: {}: {}", t.name, e.context, e.msg))
    })?;
    let end = offset.checked_add(length.unwrap_or(want)).filter(|e| *e <= all.len()).ok_or_else(
        || {
            OnnxError::model(format!(
                "external tensor `{}`: bytes {offset}..{} are past the end of {} ({} bytes)",
                t.name,
                offset.saturating_add(length.unwrap_or(want)),
                file.display(),
                all.len()
            ))
        },
    )?;
    Ok(all.slice(offset..end))
}

/// Bytes per element of an ONNX tensor element type with a fixed size.
fn elem_size(data_type: i32) -> Option<usize> {
    use crate::proto::data_type as dt;
    match data_type {
        dt::DOUBLE | dt::INT64 => Some(8),
        dt::FLOAT | dt::INT32 => Some(4),
        dt::FLOAT16 | dt::BFLOAT16 => Some(2),
        dt::INT8 | dt::UINT8 | dt::BOOL => Some(1),
        _ => None,
    }
}

/// Make the external-data references of `proto` (read from `from`) valid for a model written
/// to `to`: when `to` is in another directory, the external tensors' bytes are written to
/// `<to's file name>.data` beside it (each 64-byte aligned) and their entries point there; in
/// the same directory nothing changes. Locations stay relative, as ONNX requires.
pub fn relocate_external_data(
    proto: &mut ModelProto,
    from: &Path,
    to: &Path,
) -> Result<(), OnnxError> {
    let dir = |p: &Path| {
        let d = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        std::fs::canonicalize(d).unwrap_or_else(|_| d.to_path_buf())
    };
    let Some(graph) = proto.graph.as_mut() else { return Ok(()) };
    let external = |t: &TensorProto| t.data_location == DATA_LOCATION_EXTERNAL;
    if dir(from) == dir(to) || !graph.initializer.iter().any(external) {
        return Ok(());
    }
    let name = format!("{}.data", to.file_name().map_or("model".into(), |n| n.to_string_lossy()));
    let mut data: Vec<u8> = Vec::new();
    for t in graph.initializer.iter_mut().filter(|t| external(t)) {
        let n = t.dims.iter().try_fold(1usize, |a, d| a.checked_mul(usize::try_from(*d).ok()?));
        let (Some(n), Some(elem)) = (n, elem_size(t.data_type)) else {
            return Err(OnnxError::model(format!(
                "external tensor `{}`: element type {} or shape {:?} cannot be copied",
                t.name, t.data_type, t.dims
            )));
        };
        let bytes = tensor_bytes(t, from, elem, n)?;
        data.resize(data.len().div_ceil(64) * 64, 0);
        let offset = data.len();
        data.extend_from_slice(&bytes);
        let entry =
            |k: &str, v: String| crate::proto::StringStringEntryProto { key: k.into(), value: v };
        t.external_data = vec![
            entry("location", name.clone()),
            entry("offset", offset.to_string()),
            entry("length", bytes.len().to_string()),
        ];
    }
    let path = to.with_file_name(&name);
    std::fs::write(&path, &data)
        .map_err(|e| OnnxError::file(&path, format!("cannot write it: {e}")))
}

/// A serialized `TensorProto` file (the test data of ONNX's backend tests).
pub fn read_tensor(path: &Path) -> Result<TensorProto, OnnxError> {
    let bytes = map_file(path)?;
    TensorProto::decode(bytes)
        .map_err(|e| OnnxError::file(path, format!("is not a serialized tensor ({e})")))
}

/// A float tensor widened to f32.
pub struct F32Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
    /// The element type it had (`proto::data_type`).
    pub data_type: i32,
}

/// A float tensor's shape and elements widened to f32 (f32, f16, bf16 and f64 tensors), with
/// the element type it had; `None` for other element types.
pub fn tensor_f32(t: &TensorProto, model_path: &Path) -> Result<Option<F32Tensor>, OnnxError> {
    use crate::proto::data_type as dt;
    let shape: Vec<usize> = t
        .dims
        .iter()
        .map(|d| usize::try_from(*d))
        .collect::<Result<_, _>>()
        .map_err(|_| OnnxError::model(format!("tensor `{}` has a negative dim", t.name)))?;
    let n = shape.iter().try_fold(1usize, |a, d| a.checked_mul(*d)).ok_or_else(|| {
        OnnxError::model(format!("tensor `{}`: shape {shape:?} overflows", t.name))
    })?;
    let elem = match t.data_type {
        dt::FLOAT => 4,
        dt::FLOAT16 | dt::BFLOAT16 => 2,
        dt::DOUBLE => 8,
        _ => return Ok(None),
    };
    let b = tensor_bytes(t, model_path, elem, n)?;
    let v: Vec<f32> = match t.data_type {
        dt::FLOAT => b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect(),
        dt::FLOAT16 => {
            b.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect()
        }
        dt::BFLOAT16 => {
            b.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect()
        }
        _ => b.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap()) as f32).collect(),
    };
    Ok(Some(F32Tensor { shape, data: v, data_type: t.data_type }))
}
