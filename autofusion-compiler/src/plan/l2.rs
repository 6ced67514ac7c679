//! Off-chip traffic of a schedule: how much of the bytes kernels move between each other the
//! shared last-level cache (the L2 of an Ascend chip, the L3 of a host) serves.
//!
//! Each kernel's cost counts the bytes crossing its boundary as if every tensor came from
//! memory. Over a schedule, a tensor written or read by one kernel and read again by a later
//! one is still partly in the cache when the later kernel reads it. The model is LRU's: a
//! cache line is a hit when the distinct bytes touched since its last use (its stack distance)
//! fit in the usable share of the cache. Between the two kernels, every byte the kernels in
//! between touch counts; inside them, a line of the tensor is touched at a uniformly random
//! point of each kernel's streaming, so the other bytes of the first kernel that follow it and
//! those of the second that precede its read count in proportion.
//!
//! Writes of intermediates: a dirty line still in the cache at its last read is counted as
//! never written back, because the arena hands the dead buffer to a later kernel whose writes
//! land on the same lines. That is an assumption (the hardware may write back earlier); the
//! traffic without it is reported beside (`writes_reach_memory`).

use crate::dim::numel;
use crate::ir::{Graph, NodeId, Op};
use crate::layout::resolve;
use crate::target::Target;
use std::collections::BTreeMap;

/// What one kernel of a schedule reads and writes: storage (base) ids, and its boundary
/// bytes as its cost counts them (re-reads included).
pub struct KernelIo {
    pub reads: Vec<NodeId>,
    /// Reads that all happen as the kernel starts (the A operand of a matmul walking column
    /// panels: the first panel reads all of it), so no other bytes of this kernel precede them.
    pub early: Vec<NodeId>,
    pub writes: Vec<NodeId>,
    pub bytes: f64,
}

impl KernelIo {
    /// The io of a kernel holding `members` (the storage it reads, the members it writes).
    pub fn of(g: &Graph, members: &[NodeId], writes: Vec<NodeId>, bytes: f64) -> KernelIo {
        let mut reads: Vec<NodeId> = members
            .iter()
            .flat_map(|m| g.node(*m).inputs.iter().map(|i| resolve(g, *i).base))
            .filter(|b| !members.contains(b) && !matches!(g.node(*b).op, Op::Const { .. }))
            .collect();
        reads.sort();
        reads.dedup();
        KernelIo { reads, early: Vec::new(), writes, bytes }
    }
}

/// The off-chip bytes of a schedule, and the parts of its boundary traffic the cache serves.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Offchip {
    /// Boundary bytes minus the cache hits below.
    pub bytes: f64,
    /// Reads served by the cache.
    pub cached_reads: f64,
    /// Intermediate writes whose lines are still cached at their last read.
    pub cached_writes: f64,
}

impl Offchip {
    /// The off-chip bytes if every write reached memory.
    pub fn writes_reach_memory(&self) -> f64 {
        self.bytes + self.cached_writes
    }
}

/// P(a U + b V <= x) for independent U, V uniform on [0, 1]: the share of a tensor's lines
/// whose stack distance fits, when `x` bytes of cache are left after the tensor and the
/// kernels between, and `a`, `b` other bytes stream through the two kernels.
fn fraction_within(x: f64, a: f64, b: f64) -> f64 {
    if x < 0.0 {
        return 0.0;
    }
    if x >= a + b {
        return 1.0;
    }
    // Midpoint rule over U; V's share in closed form.
    const STEPS: usize = 256;
    (0..STEPS)
        .map(|i| {
            let u = (i as f64 + 0.5) / STEPS as f64;
            let left = x - a * u;
            if left < 0.0 {
                0.0
            } else if b <= 0.0 {
                1.0
            } else {
                (left / b).min(1.0)
            }
        })
        .sum::<f64>()
        / STEPS as f64
}

/// The distinct bytes `kernels` touch, other than `t`'s: LRU's stack distance counts each
/// line once, so a tensor that two kernels in between both read (the normalised input of
/// the q, k and v projections) takes its room in the cache once.
fn distinct_bytes(kernels: &[KernelIo], t: NodeId, size: &dyn Fn(NodeId) -> f64) -> f64 {
    let mut seen: Vec<NodeId> =
        kernels.iter().flat_map(|k| k.reads.iter().chain(&k.writes)).copied().collect();
    seen.sort();
    seen.dedup();
    seen.into_iter().filter(|x| *x != t).map(size).sum()
}

/// The off-chip traffic of `kernels` run in this order on `target`, with dims estimated by
/// `est`.
pub fn offchip(
    g: &Graph,
    kernels: &[KernelIo],
    target: &Target,
    est: &dyn Fn(&crate::dim::DimExpr) -> i64,
) -> Offchip {
    let cap = target.llc_bytes as f64 * target.onchip_fraction;
    let size = |id: NodeId| {
        let n = g.node(id);
        est(&numel(&n.shape)).max(0) as f64 * n.dtype.size() as f64
    };
    let footprint: Vec<f64> =
        kernels.iter().map(|k| k.reads.iter().chain(&k.writes).map(|t| size(*t)).sum()).collect();
    let mut last_use: BTreeMap<NodeId, usize> = BTreeMap::new();
    // Intermediates written, with the cached share of their latest read.
    let mut written: BTreeMap<NodeId, f64> = BTreeMap::new();
    let mut out = Offchip::default();
    for (k, io) in kernels.iter().enumerate() {
        for t in &io.reads {
            let s = size(*t);
            if let Some(&p) = last_use.get(t) {
                let between = distinct_bytes(&kernels[p + 1..k], *t, &size);
                let before_read =
                    if io.early.contains(t) { 0.0 } else { (footprint[k] - s).max(0.0) };
                let f =
                    fraction_within(cap - s - between, (footprint[p] - s).max(0.0), before_read);
                out.cached_reads += f * s;
                if let Some(w) = written.get_mut(t) {
                    *w = f;
                }
            }
            last_use.insert(*t, k);
        }
        for t in &io.writes {
            last_use.insert(*t, k);
            if !g.outputs.contains(t) {
                written.insert(*t, 0.0);
            }
        }
    }
    out.cached_writes = written.iter().map(|(t, f)| f * size(*t)).sum();
    let boundary: f64 = kernels.iter().map(|k| k.bytes).sum();
    out.bytes = (boundary - out.cached_reads - out.cached_writes).max(0.0);
    out
}

#[cfg(test)]
mod tests {
    use super::{distinct_bytes, fraction_within, KernelIo};
    use crate::ir::NodeId;

    #[test]
    fn stack_distance_counts_a_tensor_two_kernels_read_once() {
        // The k and v projections both read h (1) and write k (2), v (3); q (0) waits for them.
        let io = |reads: Vec<u32>, writes: Vec<u32>| KernelIo {
            reads: reads.into_iter().map(NodeId).collect(),
            early: Vec::new(),
            writes: writes.into_iter().map(NodeId).collect(),
            bytes: 0.0,
        };
        let between = [io(vec![1, 4], vec![2]), io(vec![1, 5], vec![3])];
        let size = |t: NodeId| [16.0, 16.0, 16.0, 16.0, 32.0, 32.0][t.0 as usize];
        assert_eq!(distinct_bytes(&between, NodeId(0), &size), 16.0 * 3.0 + 64.0);
        // The tensor itself is not in its own stack distance.
        assert_eq!(distinct_bytes(&between, NodeId(1), &size), 16.0 * 2.0 + 64.0);
    }

    #[test]
    fn fraction_within_is_the_uniform_sum_distribution() {
        assert_eq!(fraction_within(-1.0, 1.0, 1.0), 0.0);
        assert_eq!(fraction_within(3.0, 1.0, 1.0), 1.0);
        // Triangle: P(U + V <= 1) = 1/2, P(U + V <= 0.5) = 1/8.
        assert!((fraction_within(1.0, 1.0, 1.0) - 0.5).abs() < 1e-3);
        assert!((fraction_within(0.5, 1.0, 1.0) - 0.125).abs() < 1e-3);
        // One side only: P(2U <= 1) = 1/2.
        assert!((fraction_within(1.0, 2.0, 0.0) - 0.5).abs() < 1e-3);
    }
}
