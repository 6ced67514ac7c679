//! Packed weight operands (`autofusion_ir::abi::PackMeta`), shared by the whole process.
//!
//! A matmul whose B is read from a weight gets B packed once, in the micro-kernel's sliver
//! layout and in the weight's own dtype. What a packed copy holds depends only on the weight
//! tensor's contents (its stamp: a tensor and its clones share one) and on how the kernel
//! reads it (`PackKey`), so every kernel of every module that packs the same tensor the same
//! way uses one copy: a fused module and its opt_level 0 twin over the same weights hold the
//! packed weights once, not twice.
//!
//! Modules own their packs (`Arc`), one per weight tensor still alive that a kernel read (a
//! layer module called with the weights of each layer in turn keeps every layer's copy, not
//! only the last one's, which it would pack again at every call); the registry only points
//! at them (`Weak`). A copy is freed when the last module holding it lets go: its tensor and
//! the tensor's clones dropped (noticed at the module's next call or memory query),
//! `Module::release_memory`, or the module dropped.

use crate::error::Result;
use crate::memory;
use autofusion_ir::abi::{packed_elems, PackMeta};
use autofusion_ir::dim::DimExpr;
use autofusion_ir::ir::DType;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Weak};

/// 64-byte aligned storage for packed operands (the micro-kernels stream them).
#[repr(C, align(64))]
#[derive(Clone, Copy, Default)]
pub(crate) struct Line([u64; 8]);

/// What a packed copy holds: the weight tensor (its stamp) read as B through a view, all
/// evaluated at the call's dims.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PackKey {
    stamp: u64,
    dtype: DType,
    /// B's batch extents, then K and N.
    extents: Vec<i64>,
    offset: i64,
    strides: Vec<i64>,
}

impl PackKey {
    pub(crate) fn new(stamp: u64, p: &PackMeta, eval: &dyn Fn(&DimExpr) -> i64) -> PackKey {
        let extents = p.batch_dims.iter().chain([&p.k, &p.n]).map(eval).collect();
        PackKey {
            stamp,
            dtype: p.dtype,
            extents,
            offset: eval(&p.offset),
            strides: p.strides.iter().map(eval).collect(),
        }
    }
    /// The weight tensor's contents (`Tensor::stamp`).
    pub(crate) fn stamp(&self) -> u64 {
        self.stamp
    }
    /// (batch, k, n) of the packed operand.
    pub(crate) fn batch_k_n(&self) -> [i64; 3] {
        let r = self.extents.len();
        let batch = self.extents[..r - 2].iter().map(|&d| d.max(0)).product();
        [batch, self.extents[r - 2].max(0), self.extents[r - 1].max(0)]
    }
}

/// One packed operand and what it holds.
pub(crate) struct Packed {
    pub(crate) key: PackKey,
    pub(crate) data: Vec<Line>,
}

impl Packed {
    /// Zeroed storage for the operand `key` describes (`Err` when the allocator refuses).
    pub(crate) fn alloc(key: PackKey, graph: &str) -> Result<Packed> {
        let [b, k, n] = key.batch_k_n();
        // The call's footprint check bounded this already; saturating keeps it an `Err` anyway.
        let bytes = (packed_elems(b, k, n) as usize).saturating_mul(key.dtype.size());
        let data = memory::try_zeroed(bytes.div_ceil(64).max(1), graph, "packed weights")?;
        Ok(Packed { key, data })
    }
    pub(crate) fn bytes(&self) -> usize {
        self.data.len() * std::mem::size_of::<Line>()
    }
}

/// Bytes of the packed copy of `p` at these dims (`None` on overflow).
pub(crate) fn packed_bytes(p: &PackMeta, eval: &dyn Fn(&DimExpr) -> i64) -> Option<usize> {
    let [b, k, n] = [&p.batch, &p.k, &p.n].map(|d| eval(d).max(0));
    let elems = usize::try_from(packed_elems(b, k, n)).ok()?;
    elems.checked_mul(p.dtype.size())
}

static REGISTRY: LazyLock<Mutex<HashMap<PackKey, Weak<Packed>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

fn registry() -> std::sync::MutexGuard<'static, HashMap<PackKey, Weak<Packed>>> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// The live packed copy for `key`, if some module holds one.
pub(crate) fn lookup(key: &PackKey) -> Option<Arc<Packed>> {
    registry().get(key).and_then(Weak::upgrade)
}

/// Register a copy just packed. When another thread published the same key meanwhile, its
/// copy is returned and this one dropped, so the process still holds one.
pub(crate) fn publish(p: Packed) -> Arc<Packed> {
    let mut reg = registry();
    if let Some(live) = reg.get(&p.key).and_then(Weak::upgrade) {
        return live;
    }
    reg.retain(|_, w| w.strong_count() > 0);
    let p = Arc::new(p);
    reg.insert(p.key.clone(), Arc::downgrade(&p));
    p
}

/// Bytes of every packed weight copy alive in the process (each counted once, however many
/// kernels and modules share it).
pub fn live_bytes() -> usize {
    registry().values().filter_map(Weak::upgrade).map(|p| p.bytes()).sum()
}

/// Bytes of the live packed copies made from `weight` (or a clone of it): 0 once no module
/// holds one.
pub fn bytes_packed_from(weight: &crate::Tensor) -> usize {
    let stamp = weight.stamp();
    let reg = registry();
    reg.iter()
        .filter(|(k, _)| k.stamp == stamp)
        .filter_map(|(_, w)| w.upgrade())
        .map(|p| p.bytes())
        .sum()
}
