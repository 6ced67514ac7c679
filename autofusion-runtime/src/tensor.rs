//! Host tensors: contiguous row-major storage in f32, f16, bf16, i64, i32 or bool.

use crate::error::{Error, Result};
use autofusion_ir::ir::DType;
use half::{bf16, f16};
use std::sync::{Arc, Weak};

#[derive(Clone, Debug, PartialEq)]
pub enum Storage {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    I64(Vec<i64>),
    I32(Vec<i32>),
    /// One byte per element, 0 or 1 (what kernels read and write for `bool`).
    Bool(Vec<u8>),
}

/// A dense tensor on the host. Its contents never change after construction, so a stamp
/// taken at construction identifies them: a device keeps a copy of a weight across calls
/// while the same tensor (or a clone of it) comes back.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    storage: Storage,
    shape: Vec<usize>,
    stamp: Stamp,
}

/// Identity of a tensor's contents (ignored by `==`, which compares values), shared by its
/// clones and reshapes. `alive` tells caches derived from the contents (packed weights)
/// whether any tensor with these contents still exists: they hold only a `Weak` of it.
#[derive(Clone, Debug)]
pub(crate) struct Stamp {
    id: u64,
    alive: Arc<()>,
}

impl Stamp {
    fn new() -> Stamp {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Stamp { id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed), alive: Arc::new(()) }
    }
}

impl PartialEq for Stamp {
    fn eq(&self, _: &Stamp) -> bool {
        true
    }
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

fn check_len(shape: &[usize], got: usize) -> Result<()> {
    if got != numel(shape) {
        return Err(Error::DataLen { shape: shape.to_vec(), expected: numel(shape), got });
    }
    Ok(())
}

/// `x` as an integer the way kernels cast: truncated toward zero, saturated, NaN -> 0.
fn f32_to_i64(x: f32) -> i64 {
    x as i64
}

impl Tensor {
    /// An f32 tensor from data in row-major order.
    pub fn from_f32(shape: &[usize], data: Vec<f32>) -> Result<Tensor> {
        if data.len() != numel(shape) {
            return Err(Error::DataLen {
                shape: shape.to_vec(),
                expected: numel(shape),
                got: data.len(),
            });
        }
        Ok(Tensor { storage: Storage::F32(data), shape: shape.to_vec(), stamp: Stamp::new() })
    }
    /// An i64 tensor (token ids, positions, masks) from data in row-major order.
    pub fn from_i64(shape: &[usize], data: Vec<i64>) -> Result<Tensor> {
        check_len(shape, data.len())?;
        Ok(Tensor { storage: Storage::I64(data), shape: shape.to_vec(), stamp: Stamp::new() })
    }
    /// An i32 tensor from data in row-major order.
    pub fn from_i32(shape: &[usize], data: Vec<i32>) -> Result<Tensor> {
        check_len(shape, data.len())?;
        Ok(Tensor { storage: Storage::I32(data), shape: shape.to_vec(), stamp: Stamp::new() })
    }
    /// A bool tensor from data in row-major order.
    pub fn from_bool(shape: &[usize], data: &[bool]) -> Result<Tensor> {
        check_len(shape, data.len())?;
        let bytes = data.iter().map(|b| *b as u8).collect();
        Ok(Tensor { storage: Storage::Bool(bytes), shape: shape.to_vec(), stamp: Stamp::new() })
    }
    /// A tensor of `dtype` from its elements as little-endian bytes (as model files store
    /// them): f32, the 16-bit patterns of f16 / bf16, integers, or one byte per bool (any
    /// nonzero byte is true).
    pub fn from_le_bytes(dtype: DType, shape: &[usize], bytes: &[u8]) -> Result<Tensor> {
        let n = numel(shape);
        if Some(bytes.len()) != n.checked_mul(dtype.size()) {
            return Err(Error::DataLen {
                shape: shape.to_vec(),
                expected: n,
                got: bytes.len() / dtype.size(),
            });
        }
        let bits = || bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]));
        let storage = match dtype {
            DType::F32 => Storage::F32(
                bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect(),
            ),
            DType::F16 => Storage::F16(bits().map(f16::from_bits).collect()),
            DType::BF16 => Storage::BF16(bits().map(bf16::from_bits).collect()),
            DType::I64 => Storage::I64(
                bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect(),
            ),
            DType::I32 => Storage::I32(
                bytes.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect(),
            ),
            DType::Bool => Storage::Bool(bytes.iter().map(|b| (*b != 0) as u8).collect()),
        };
        Ok(Tensor { storage, shape: shape.to_vec(), stamp: Stamp::new() })
    }
    /// A tensor of `dtype` from f32 data (rounded to nearest even).
    pub fn from_f32_as(shape: &[usize], data: &[f32], dtype: DType) -> Result<Tensor> {
        Tensor::from_f32(shape, data.to_vec())?.to_dtype(dtype)
    }
    pub fn zeros(dtype: DType, shape: &[usize]) -> Tensor {
        let n = numel(shape);
        let storage = match dtype {
            DType::F32 => Storage::F32(vec![0.0; n]),
            DType::F16 => Storage::F16(vec![f16::ZERO; n]),
            DType::BF16 => Storage::BF16(vec![bf16::ZERO; n]),
            DType::I64 => Storage::I64(vec![0; n]),
            DType::I32 => Storage::I32(vec![0; n]),
            DType::Bool => Storage::Bool(vec![0; n]),
        };
        Tensor { storage, shape: shape.to_vec(), stamp: Stamp::new() }
    }
    /// `zeros`, or `Err` naming `graph` when the allocator refuses (no abort).
    pub fn try_zeros(dtype: DType, shape: &[usize], graph: &str) -> Result<Tensor> {
        let n = numel(shape);
        let what = "outputs";
        let storage = match dtype {
            DType::F32 => Storage::F32(crate::memory::try_zeroed(n, graph, what)?),
            DType::F16 => Storage::F16(crate::memory::try_zeroed(n, graph, what)?),
            DType::BF16 => Storage::BF16(crate::memory::try_zeroed(n, graph, what)?),
            DType::I64 => Storage::I64(crate::memory::try_zeroed(n, graph, what)?),
            DType::I32 => Storage::I32(crate::memory::try_zeroed(n, graph, what)?),
            DType::Bool => Storage::Bool(crate::memory::try_zeroed(n, graph, what)?),
        };
        Ok(Tensor { storage, shape: shape.to_vec(), stamp: Stamp::new() })
    }
    /// Deterministic N(0, std^2) values (a small xorshift + Box-Muller): for tests and examples.
    pub fn randn(shape: &[usize], std: f32, seed: u64) -> Tensor {
        let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        let data = (0..numel(shape))
            .map(|_| {
                let (u, v) = (next(), next());
                ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32 * std
            })
            .collect();
        Tensor { storage: Storage::F32(data), shape: shape.to_vec(), stamp: Stamp::new() }
    }
    pub fn dtype(&self) -> DType {
        match self.storage {
            Storage::F32(_) => DType::F32,
            Storage::F16(_) => DType::F16,
            Storage::BF16(_) => DType::BF16,
            Storage::I64(_) => DType::I64,
            Storage::I32(_) => DType::I32,
            Storage::Bool(_) => DType::Bool,
        }
    }
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }
    pub fn storage(&self) -> &Storage {
        &self.storage
    }
    /// Values as f32 (integers beyond 2^24 round to nearest; bools are 0 and 1).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match &self.storage {
            Storage::F32(v) => v.clone(),
            Storage::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
            Storage::BF16(v) => v.iter().map(|x| x.to_f32()).collect(),
            Storage::I64(v) => v.iter().map(|x| *x as f32).collect(),
            Storage::I32(v) => v.iter().map(|x| *x as f32).collect(),
            Storage::Bool(v) => v.iter().map(|x| *x as f32).collect(),
        }
    }
    /// Values as i64: integers exactly, bools as 0 and 1, floats as kernels cast them
    /// (truncated toward zero, saturated, NaN -> 0).
    pub fn to_i64_vec(&self) -> Vec<i64> {
        match &self.storage {
            Storage::I64(v) => v.clone(),
            Storage::I32(v) => v.iter().map(|x| *x as i64).collect(),
            Storage::Bool(v) => v.iter().map(|x| *x as i64).collect(),
            _ => self.to_f32_vec().into_iter().map(f32_to_i64).collect(),
        }
    }
    /// Values as bools (nonzero is true, NaN included).
    pub fn to_bool_vec(&self) -> Vec<bool> {
        match &self.storage {
            Storage::I64(_) | Storage::I32(_) | Storage::Bool(_) => {
                self.to_i64_vec().into_iter().map(|x| x != 0).collect()
            }
            _ => self.to_f32_vec().into_iter().map(|x| x != 0.0).collect(),
        }
    }
    /// The i64 data, if the tensor is i64.
    pub fn as_i64(&self) -> Option<&[i64]> {
        match &self.storage {
            Storage::I64(v) => Some(v),
            _ => None,
        }
    }
    /// The f32 data, if the tensor is f32.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.storage {
            Storage::F32(v) => Some(v),
            _ => None,
        }
    }
    /// Convert to another dtype as a graph's `cast` does: floats round to nearest even when
    /// narrowing; floats to integers truncate toward zero and saturate (NaN -> 0); i64 to i32
    /// wraps; anything to bool is `x != 0`.
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        let storage = match dtype {
            DType::F32 => Storage::F32(self.to_f32_vec()),
            DType::F16 => {
                Storage::F16(self.to_f32_vec().iter().map(|x| f16::from_f32(*x)).collect())
            }
            DType::BF16 => {
                Storage::BF16(self.to_f32_vec().iter().map(|x| bf16::from_f32(*x)).collect())
            }
            DType::I64 => Storage::I64(self.to_i64_vec()),
            DType::I32 => Storage::I32(match self.dtype().is_float() {
                true => self.to_f32_vec().iter().map(|x| *x as i32).collect(),
                false => self.to_i64_vec().iter().map(|x| *x as i32).collect(),
            }),
            DType::Bool => Storage::Bool(self.to_bool_vec().into_iter().map(|b| b as u8).collect()),
        };
        Ok(Tensor { storage, shape: self.shape.clone(), stamp: Stamp::new() })
    }
    /// Same data, new shape with the same number of elements.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        if numel(shape) != self.numel() {
            return Err(Error::Tensor {
                op: "reshape".into(),
                dtype: self.dtype().name().into(),
                msg: format!(
                    "{:?} has {} elements, {:?} has {}",
                    self.shape,
                    self.numel(),
                    shape,
                    numel(shape)
                ),
            });
        }
        Ok(Tensor {
            storage: self.storage.clone(),
            shape: shape.to_vec(),
            stamp: self.stamp.clone(),
        })
    }
    /// Rows `from .. to` along the first axis, as a new tensor (a decoder's last position).
    pub fn rows(&self, from: usize, to: usize) -> Result<Tensor> {
        let n = self.shape.first().copied().unwrap_or(0);
        if from > to || to > n {
            return Err(Error::Tensor {
                op: "rows".into(),
                dtype: self.dtype().name().into(),
                msg: format!("rows {from} .. {to} of a tensor of shape {:?}", self.shape),
            });
        }
        let inner = numel(&self.shape[1..]);
        let (a, b) = (from * inner, to * inner);
        let storage = match &self.storage {
            Storage::F32(v) => Storage::F32(v[a..b].to_vec()),
            Storage::F16(v) => Storage::F16(v[a..b].to_vec()),
            Storage::BF16(v) => Storage::BF16(v[a..b].to_vec()),
            Storage::I64(v) => Storage::I64(v[a..b].to_vec()),
            Storage::I32(v) => Storage::I32(v[a..b].to_vec()),
            Storage::Bool(v) => Storage::Bool(v[a..b].to_vec()),
        };
        let mut shape = self.shape.clone();
        shape[0] = to - from;
        Ok(Tensor { storage, shape, stamp: Stamp::new() })
    }
    pub(crate) fn as_ptr(&self) -> *const u8 {
        match &self.storage {
            Storage::F32(v) => v.as_ptr() as *const u8,
            Storage::F16(v) => v.as_ptr() as *const u8,
            Storage::BF16(v) => v.as_ptr() as *const u8,
            Storage::I64(v) => v.as_ptr() as *const u8,
            Storage::I32(v) => v.as_ptr() as *const u8,
            Storage::Bool(v) => v.as_ptr(),
        }
    }
    /// The contents' identity (see `Stamp`).
    pub(crate) fn stamp(&self) -> u64 {
        self.stamp.id
    }
    /// Dead once this tensor, its clones and reshapes are all dropped (see `Stamp`).
    pub(crate) fn liveness(&self) -> Weak<()> {
        Arc::downgrade(&self.stamp.alive)
    }
    /// Bytes of the contents.
    #[cfg_attr(not(feature = "ascend"), allow(dead_code))]
    pub(crate) fn nbytes(&self) -> usize {
        self.numel() * self.dtype().size()
    }
    /// For filling a new tensor (outputs): the contents get a new identity.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.stamp = Stamp::new();
        match &mut self.storage {
            Storage::F32(v) => v.as_mut_ptr() as *mut u8,
            Storage::F16(v) => v.as_mut_ptr() as *mut u8,
            Storage::BF16(v) => v.as_mut_ptr() as *mut u8,
            Storage::I64(v) => v.as_mut_ptr() as *mut u8,
            Storage::I32(v) => v.as_mut_ptr() as *mut u8,
            Storage::Bool(v) => v.as_mut_ptr(),
        }
    }
    /// Largest |a - b| over all elements (NaN if any differs in NaN-ness); shapes must agree.
    pub fn max_abs_diff(&self, other: &Tensor) -> Result<f32> {
        if self.shape != other.shape {
            return Err(Error::Tensor {
                op: "compare".into(),
                dtype: self.dtype().name().into(),
                msg: format!("shapes {:?} and {:?} differ", self.shape, other.shape),
            });
        }
        if !self.dtype().is_float() && !other.dtype().is_float() {
            // Integers compare exactly (f32 would round those beyond 2^24).
            let (a, b) = (self.to_i64_vec(), other.to_i64_vec());
            let m = a.iter().zip(&b).map(|(x, y)| x.abs_diff(*y)).max().unwrap_or(0);
            return Ok(m as f32);
        }
        let (a, b) = (self.to_f32_vec(), other.to_f32_vec());
        let mut m = 0f32;
        for (x, y) in a.iter().zip(&b) {
            if x.is_nan() != y.is_nan() {
                return Ok(f32::NAN);
            }
            if x.is_finite() || y.is_finite() {
                m = m.max((x - y).abs());
            } else if x != y && !x.is_nan() {
                // Infinities of different signs (two NaNs agree).
                return Ok(f32::INFINITY);
            }
        }
        Ok(m)
    }
    /// `|a - b| <= atol + rtol * |b|` everywhere (b = `reference`).
    pub fn allclose(&self, reference: &Tensor, rtol: f32, atol: f32) -> Result<bool> {
        self.max_abs_diff(reference)?;
        if !self.dtype().is_float() && !reference.dtype().is_float() {
            let (a, b) = (self.to_i64_vec(), reference.to_i64_vec());
            let (rtol, atol) = (rtol as f64, atol as f64);
            let close =
                |x: i64, y: i64| x.abs_diff(y) as f64 <= atol + rtol * y.unsigned_abs() as f64;
            return Ok(a.iter().zip(&b).all(|(x, y)| close(*x, *y)));
        }
        let (a, b) = (self.to_f32_vec(), reference.to_f32_vec());
        let close = |x: f32, y: f32| {
            x == y || (x.is_nan() && y.is_nan()) || (x - y).abs() <= atol + rtol * y.abs()
        };
        Ok(a.iter().zip(&b).all(|(x, y)| close(*x, *y)))
    }
}

/// Tolerances per dtype for fused-vs-reference comparisons: (rtol, atol).
///
/// Fused kernels keep intermediates in f32 registers where the reference rounds each op's
/// result to the value's dtype, and reductions sum in a different order; these bounds cover
/// that for layer-sized reductions (rows of up to a few thousand elements).
pub fn tolerance(dtype: DType) -> (f32, f32) {
    match dtype {
        DType::F32 => (1e-4, 1e-4),
        DType::F16 => (1e-2, 1e-2),
        DType::BF16 => (4e-2, 4e-2),
        // Integers and truth values are exact.
        DType::I64 | DType::I32 | DType::Bool => (0.0, 0.0),
    }
}
