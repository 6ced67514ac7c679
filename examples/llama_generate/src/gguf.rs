//! GGUF files (llama.cpp's format, versions 2 and 3, little-endian): the header, the metadata,
//! the tensor infos and the tensors' data, read from a memory map.
//!
//! Layout: magic `GGUF`, u32 version, u64 tensor count, u64 metadata count; each metadata
//! entry a key (u64 length + UTF-8) and a typed value (u32 type; arrays hold a u32 element
//! type and a u64 count, and may nest); each tensor info a name, u32 dimension count (at most
//! 4), u64 dimensions innermost first, u32 ggml type and u64 offset from the data section,
//! which starts at the end of the infos rounded up to `general.alignment` (default 32).
//!
//! Nothing read from the file sizes an allocation before it is checked against the bytes
//! that remain: counts and lengths are bounded by the file, sizes are computed with checked
//! arithmetic, and every tensor's extent is checked to lie in the data section when the file
//! is opened, so a truncated or inconsistent file is an `Err` naming it (and the tensor or
//! key), never a panic.

use crate::{Error, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    /// An integer value of any width, if it is one.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }
    /// A float value of either width, or an integer, as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_i128().map(|v| v as f64),
        }
    }
}

/// The element types this reader dequantises, and the others by their ggml number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    /// Blocks of 32: an f16 scale and 32 signed bytes.
    Q8_0,
    /// Blocks of 32: an f16 scale and 16 bytes of 4-bit values, element j in the low nibble
    /// of byte j and element j + 16 in its high nibble, each minus 8.
    Q4_0,
    /// Blocks of 32: an f16 scale `d`, an f16 minimum `m` and 16 bytes of 4-bit values `q`
    /// (nibbles ordered as Q4_0's), each element `d * q + m`.
    Q4_1,
    Other(u32),
}

impl GgmlType {
    fn from_u32(v: u32) -> GgmlType {
        match v {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            8 => GgmlType::Q8_0,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            30 => GgmlType::BF16,
            other => GgmlType::Other(other),
        }
    }
    /// (elements per block, bytes per block); `None` for types this reader does not know.
    fn block(self) -> Option<(u64, u64)> {
        match self {
            GgmlType::F32 => Some((1, 4)),
            GgmlType::F16 | GgmlType::BF16 => Some((1, 2)),
            GgmlType::Q8_0 => Some((32, 34)),
            GgmlType::Q4_0 => Some((32, 18)),
            GgmlType::Q4_1 => Some((32, 20)),
            GgmlType::Other(_) => None,
        }
    }
}

/// One tensor's info: its dimensions innermost first (as stored), type and extent in the data
/// section (`None` for a type this reader does not know: its size cannot be checked).
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    pub offset: u64,
    pub bytes: Option<u64>,
}

impl TensorInfo {
    /// The shape in row-major order (outermost first), as the graphs take it.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
    pub fn numel(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A parsed GGUF file over its bytes.
pub struct Gguf<B: AsRef<[u8]>> {
    path: PathBuf,
    bytes: B,
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    data_start: usize,
}

/// Largest dimension count a ggml tensor has.
const MAX_DIMS: u32 = 4;

impl Gguf<memmap2::Mmap> {
    /// Map and parse `path`.
    pub fn open(path: &Path) -> Result<Gguf<memmap2::Mmap>> {
        let err = |what: String| Error::File { path: path.to_path_buf(), what };
        let file = std::fs::File::open(path).map_err(|e| err(format!("cannot open: {e}")))?;
        // SAFETY: the map is read only; a file truncated under it by another process is
        // outside what a mapped reader can guard (copy the tensors out early).
        let map =
            unsafe { memmap2::Mmap::map(&file) }.map_err(|e| err(format!("cannot map: {e}")))?;
        Gguf::parse(path, map)
    }
}

impl<B: AsRef<[u8]>> Gguf<B> {
    /// Parse a GGUF file's bytes (`path` names it in errors).
    pub fn parse(path: &Path, bytes: B) -> Result<Gguf<B>> {
        let (version, metadata, tensors, alignment, data_start) = {
            let mut r = Reader { path, bytes: bytes.as_ref(), pos: 0 };
            let magic: [u8; 4] = r.array("the magic")?;
            if &magic != b"GGUF" {
                return Err(r.err(format!("not a GGUF file (magic {magic:02x?}, want \"GGUF\")")));
            }
            let version = r.u32("the version")?;
            if !(2..=3).contains(&version) {
                return Err(
                    r.err(format!("GGUF version {version}: this reader reads versions 2 and 3"))
                );
            }
            let n_tensors = r.u64("the tensor count")?;
            let n_kv = r.u64("the metadata count")?;
            let mut metadata = BTreeMap::new();
            for _ in 0..n_kv {
                let key = r.string("a metadata key")?;
                let ty = r.u32("a metadata type").map_err(|e| r.at_key(&key, e))?;
                let value = r.value(ty, 0).map_err(|e| r.at_key(&key, e))?;
                metadata.insert(key, value);
            }
            let alignment = match metadata.get("general.alignment") {
                None => 32,
                Some(v) => match v.as_i128() {
                    Some(a) if a > 0 && a % 8 == 0 && a <= 1 << 20 => a as u64,
                    _ => {
                        return Err(Error::Metadata {
                            path: path.to_path_buf(),
                            key: "general.alignment".into(),
                            what: format!("{v:?}: want a positive multiple of 8"),
                        })
                    }
                },
            };
            let mut tensors = Vec::new();
            for _ in 0..n_tensors {
                tensors.push(r.tensor_info()?);
            }
            let data_start = (r.pos as u64).div_ceil(alignment) * alignment;
            (version, metadata, tensors, alignment, data_start)
        };
        let data_len = (bytes.as_ref().len() as u64).saturating_sub(data_start);
        for t in &tensors {
            let terr = |what: String| Error::Tensor {
                path: path.to_path_buf(),
                tensor: t.name.clone(),
                what,
            };
            if t.offset % alignment != 0 {
                return Err(terr(format!(
                    "offset {} is not a multiple of the alignment {alignment}",
                    t.offset
                )));
            }
            if let Some(n) = t.bytes {
                let end = t.offset.checked_add(n).filter(|&e| e <= data_len);
                if end.is_none() {
                    return Err(terr(format!(
                        "{n} bytes at offset {} pass the end of the data section ({data_len} bytes): the file is truncated or inconsistent",
                        t.offset
                    )));
                }
            }
        }
        let data_start = usize::try_from(data_start).map_err(|_| Error::File {
            path: path.to_path_buf(),
            what: "data section past the address space".into(),
        })?;
        Ok(Gguf {
            path: path.to_path_buf(),
            bytes,
            version,
            metadata,
            tensors,
            alignment,
            data_start,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn tensor_info(&self, name: &str) -> Result<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name).ok_or_else(|| Error::Tensor {
            path: self.path.clone(),
            tensor: name.into(),
            what: "not in the file".into(),
        })
    }

    /// Metadata `key`, or an error naming it.
    pub fn get(&self, key: &str) -> Result<&Value> {
        self.metadata.get(key).ok_or_else(|| Error::Metadata {
            path: self.path.clone(),
            key: key.into(),
            what: "not in the file".into(),
        })
    }

    /// Metadata `key` as a non-negative integer that fits `usize`.
    pub fn usize(&self, key: &str) -> Result<usize> {
        let v = self.get(key)?;
        v.as_i128().and_then(|x| usize::try_from(x).ok()).ok_or_else(|| Error::Metadata {
            path: self.path.clone(),
            key: key.into(),
            what: format!("{v:?} is not a non-negative integer"),
        })
    }

    /// Metadata `key` as a number.
    pub fn f64(&self, key: &str) -> Result<f64> {
        let v = self.get(key)?;
        v.as_f64().ok_or_else(|| Error::Metadata {
            path: self.path.clone(),
            key: key.into(),
            what: format!("{v:?} is not a number"),
        })
    }

    /// Metadata `key` as a string.
    pub fn str(&self, key: &str) -> Result<&str> {
        match self.get(key)? {
            Value::String(s) => Ok(s),
            v => Err(Error::Metadata {
                path: self.path.clone(),
                key: key.into(),
                what: format!("{v:?} is not a string"),
            }),
        }
    }

    /// Tensor `name` dequantised to f32, with its row-major shape.
    pub fn f32(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let t = self.tensor_info(name)?;
        let err =
            |what: String| Error::Tensor { path: self.path.clone(), tensor: name.into(), what };
        let n = t.bytes.ok_or_else(|| {
            err(format!(
                "type {:?}: this reader reads F32, F16, BF16, Q8_0, Q4_0 and Q4_1",
                t.ggml_type
            ))
        })?;
        // Checked against the data section when the file was parsed.
        let start = self.data_start + t.offset as usize;
        let data = &self.bytes.as_ref()[start..start + n as usize];
        let values = dequantize(t.ggml_type, data);
        Ok((t.shape(), values))
    }
}

/// `data` (whole blocks of `ty`) as f32.
fn dequantize(ty: GgmlType, data: &[u8]) -> Vec<f32> {
    let f16 = |b: &[u8]| half::f16::from_le_bytes([b[0], b[1]]).to_f32();
    match ty {
        GgmlType::F32 => {
            data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
        }
        GgmlType::F16 => data.chunks_exact(2).map(f16).collect(),
        GgmlType::BF16 => {
            data.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect()
        }
        GgmlType::Q8_0 => data
            .chunks_exact(34)
            .flat_map(|b| {
                let d = f16(&b[..2]);
                b[2..].iter().map(move |&q| d * (q as i8) as f32)
            })
            .collect(),
        GgmlType::Q4_0 => data
            .chunks_exact(18)
            .flat_map(|b| {
                let d = f16(&b[..2]);
                nibbles(&b[2..], move |q| d * (q as i32 - 8) as f32)
            })
            .collect(),
        GgmlType::Q4_1 => data
            .chunks_exact(20)
            .flat_map(|b| {
                let (d, m) = (f16(&b[..2]), f16(&b[2..4]));
                nibbles(&b[4..], move |q| d * q as f32 + m)
            })
            .collect(),
        GgmlType::Other(_) => Vec::new(),
    }
}

/// A 4-bit block's 32 values through `value`: element j in the low nibble of byte j, element
/// j + 16 in its high nibble.
fn nibbles(qs: &[u8], value: impl Fn(u8) -> f32 + Copy) -> Vec<f32> {
    let lo = qs.iter().map(move |&q| value(q & 0x0f));
    let hi = qs.iter().map(move |&q| value(q >> 4));
    lo.chain(hi).collect()
}

/// A bounds-checked cursor over the file's bytes.
struct Reader<'a> {
    path: &'a Path,
    bytes: &'a [u8],
    pos: usize,
}

/// Arrays nest at most this deep (the format allows nesting; files use one level).
const MAX_NESTING: u32 = 4;

impl Reader<'_> {
    fn err(&self, what: String) -> Error {
        Error::File { path: self.path.to_path_buf(), what }
    }
    fn at_key(&self, key: &str, e: Error) -> Error {
        let what = match e {
            Error::File { what, .. } => what,
            other => other.to_string(),
        };
        Error::Metadata { path: self.path.to_path_buf(), key: key.into(), what }
    }
    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8]> {
        if n > self.remaining() {
            return Err(self.err(format!(
                "truncated: {what} needs {n} bytes at offset {}, {} remain",
                self.pos,
                self.remaining()
            )));
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    /// A length read from the file, checked against the bytes left (each item takes at least
    /// `min_item` bytes) before anything is allocated for it.
    fn count(&mut self, what: &str, min_item: usize) -> Result<usize> {
        let n = self.u64(what)?;
        let fits = usize::try_from(n)
            .ok()
            .filter(|&n| n.checked_mul(min_item).is_some_and(|b| b <= self.remaining()));
        fits.ok_or_else(|| {
            self.err(format!(
                "{what} {n} at offset {}: more than the {} bytes left hold",
                self.pos - 8,
                self.remaining()
            ))
        })
    }
    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.count(what, 1)?;
        let at = self.pos;
        let b = self.take(n, what)?.to_vec();
        String::from_utf8(b).map_err(|_| self.err(format!("{what} at offset {at} is not UTF-8")))
    }
    fn value(&mut self, ty: u32, depth: u32) -> Result<Value> {
        Ok(match ty {
            0 => Value::U8(self.array::<1>("a u8")?[0]),
            1 => Value::I8(self.array::<1>("an i8")?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array("a u16")?)),
            3 => Value::I16(i16::from_le_bytes(self.array("an i16")?)),
            4 => Value::U32(self.u32("a u32")?),
            5 => Value::I32(i32::from_le_bytes(self.array("an i32")?)),
            6 => Value::F32(f32::from_le_bytes(self.array("an f32")?)),
            7 => match self.array::<1>("a bool")?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.err(format!("bool value {b} at offset {}", self.pos - 1))),
            },
            8 => Value::String(self.string("a string")?),
            9 => {
                if depth >= MAX_NESTING {
                    return Err(self.err(format!("arrays nested deeper than {MAX_NESTING}")));
                }
                let ety = self.u32("an array's element type")?;
                let min_item = match ety {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    9 => 12,
                    other => {
                        return Err(
                            self.err(format!("array element type {other} is not a GGUF type"))
                        )
                    }
                };
                let n = self.count("an array's length", min_item)?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(ety, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64("a u64")?),
            11 => Value::I64(i64::from_le_bytes(self.array("an i64")?)),
            12 => Value::F64(f64::from_le_bytes(self.array("an f64")?)),
            other => return Err(self.err(format!("value type {other} is not a GGUF type"))),
        })
    }
    fn tensor_info(&mut self) -> Result<TensorInfo> {
        let name = self.string("a tensor name")?;
        let path = self.path;
        let terr =
            |what: String| Error::Tensor { path: path.to_path_buf(), tensor: name.clone(), what };
        let n_dims = self.u32("a dimension count").map_err(|e| terr(e.to_string()))?;
        if n_dims > MAX_DIMS {
            return Err(terr(format!(
                "{n_dims} dimensions (ggml tensors have at most {MAX_DIMS})"
            )));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(self.u64("a dimension").map_err(|e| terr(e.to_string()))?);
        }
        let ggml_type =
            GgmlType::from_u32(self.u32("a tensor type").map_err(|e| terr(e.to_string()))?);
        let offset = self.u64("a tensor offset").map_err(|e| terr(e.to_string()))?;
        let numel = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        let numel = numel.ok_or_else(|| terr(format!("dimensions {dims:?} overflow")))?;
        let bytes = match ggml_type.block() {
            None => None,
            Some((per_block, block_bytes)) => {
                if dims.first().copied().unwrap_or(1) % per_block != 0 {
                    return Err(terr(format!(
                        "{ggml_type:?} rows of {} elements: not whole blocks of {per_block}",
                        dims.first().copied().unwrap_or(1)
                    )));
                }
                let b = (numel / per_block).checked_mul(block_bytes);
                Some(
                    b.filter(|&b| usize::try_from(b).is_ok())
                        .ok_or_else(|| terr(format!("{numel} elements overflow a size")))?,
                )
            }
        };
        Ok(TensorInfo { name, dims, ggml_type, offset, bytes })
    }
}
