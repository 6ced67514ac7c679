//! The cost model: a kernel's time in microseconds at its best feasible tiling.
//!
//! `T = launch + (max(t_mem, t_comp) + (1 - overlap) * min(t_mem, t_comp)) / wave_efficiency`,
//! with `t_mem = bytes / bandwidth` [B / (B/us) = us] and `t_comp = flops / peak`
//! [FLOP / (FLOP/us) = us]. Bytes count only tensors crossing the kernel boundary, times the
//! number of times the tile loops re-fetch them. A tiling is feasible when every on-chip buffer
//! it needs, rounded to the target's alignment (and doubled where the target double-buffers),
//! fits in `onchip_fraction` of that memory.

use crate::dim::{numel, DimExpr};
use crate::group::{iter_shape, GroupKind};
use crate::ir::{Graph, NodeId, Op};
use crate::layout::resolve;
use crate::target::Target;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// A tiling the cost model chose for a kernel.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tiling {
    Rows {
        rows_per_tile: i64,
    },
    MatMul {
        mc: i64,
        nc: i64,
        kc: i64,
        /// Output tiles in column-panel order (`abi::ascend_n_major`; the host template has
        /// its own loop order).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        n_major: bool,
    },
    Flash {
        br: i64,
        bc: i64,
    },
}

/// A kernel's modelled cost. Times in us, sizes in bytes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelCost {
    pub time_us: f64,
    pub launch_us: f64,
    pub mem_us: f64,
    pub compute_us: f64,
    /// Busy share of the cores in the last wave, 0..1.
    pub wave_efficiency: f64,
    /// Off-chip bytes (first reads, writes, and re-reads of tensors too big for the LLC).
    pub bytes: f64,
    /// Re-read bytes served by the shared last-level cache.
    #[serde(default)]
    pub llc_bytes: f64,
    pub flops: f64,
    pub tiling: Tiling,
    /// On-chip bytes per core at the tiling, per memory.
    pub onchip: Vec<(String, u64)>,
    /// Execution time (without launch) at the best tiling when capacity is ignored.
    pub unconstrained_exec_us: f64,
}

/// FLOPs one element of an op costs on a vector unit (the op table's figure for elementwise
/// functions); transcendentals are counted apart.
pub(crate) fn op_weight(op: &Op) -> f64 {
    match op {
        Op::Unary(u) => u.spec().flops,
        Op::Binary(b) => b.spec().flops,
        _ => 1.0,
    }
}

/// Ops evaluated by a polynomial or library function (exp, log, tanh, erf, pow) per element.
pub(crate) fn transcendental(op: &Op) -> bool {
    match op {
        Op::Unary(u) => u.spec().transcendental,
        Op::Binary(b) => b.spec().transcendental,
        _ => false,
    }
}

pub(crate) struct Ctx<'a> {
    pub(crate) g: &'a Graph,
    pub(crate) t: &'a Target,
    pub(crate) est: &'a dyn Fn(&DimExpr) -> i64,
}

impl Ctx<'_> {
    pub(crate) fn n(&self, d: &DimExpr) -> f64 {
        (self.est)(d).max(0) as f64
    }
    pub(crate) fn elems(&self, id: NodeId) -> f64 {
        self.n(&numel(&self.g.node(id).shape))
    }
    pub(crate) fn bytes(&self, id: NodeId) -> f64 {
        self.elems(id) * self.g.node(id).dtype.size() as f64
    }
    pub(crate) fn align(&self, b: f64) -> u64 {
        let a = self.t.align_bytes.max(1);
        (b.max(0.0) as u64).div_ceil(a) * a
    }
    /// Bytes of these tensors small enough to stay in the last-level cache between kernels.
    pub(crate) fn cached(&self, ids: &[NodeId]) -> f64 {
        let cap = self.t.llc_bytes as f64 * self.t.onchip_fraction;
        ids.iter().map(|i| self.bytes(*i)).filter(|b| *b <= cap).sum()
    }
    pub(crate) fn fits(&self, use_: &[(String, u64)]) -> bool {
        use_.iter().all(|(m, b)| self.t.budget(m).is_none_or(|cap| *b <= cap))
    }
    /// Off-chip and LLC bytes of reading a tensor of `size` bytes `times` times.
    pub(crate) fn reread(&self, size: f64, times: f64) -> (f64, f64) {
        let again = size * (times - 1.0).max(0.0);
        if size <= self.t.llc_bytes as f64 * self.t.onchip_fraction {
            (size, again)
        } else {
            (size + again, 0.0)
        }
    }
    /// In-cache bandwidth (bytes/us), or the memory bandwidth when the profile has none.
    pub(crate) fn llc_bw(&self) -> f64 {
        if self.t.llc_bandwidth_bytes_per_us > 0.0 {
            self.t.llc_bandwidth_bytes_per_us
        } else {
            self.t.bandwidth_bytes_per_us
        }
    }
    /// Time of moving `elems` operand elements into micro-kernel slivers [elements / (elements/us)].
    pub(crate) fn pack_us(&self, elems: f64) -> f64 {
        if self.t.pack_elems_per_us > 0.0 {
            elems / self.t.pack_elems_per_us
        } else {
            0.0
        }
    }
    /// Execution time from bytes (off-chip, of which `cached` stay in the LLC between kernels;
    /// plus LLC re-reads), flops, transcendental evaluations and packing (`pack_us`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn exec_us(
        &self,
        (bytes, llc): (f64, f64),
        cached: f64,
        mm_flops: f64,
        vec_flops: f64,
        trans: f64,
        pack_us: f64,
        mm_eff: f64,
        tiles: f64,
        cores: u32,
    ) -> (f64, f64, f64, f64) {
        let llc_bw = if self.t.llc_bandwidth_bytes_per_us > 0.0 {
            self.t.llc_bandwidth_bytes_per_us
        } else {
            self.t.bandwidth_bytes_per_us
        };
        let cached = cached.min(bytes);
        let mem = (bytes - cached) / self.t.bandwidth_bytes_per_us + (llc + cached) / llc_bw;
        let trans_rate = if self.t.transcendental_per_us > 0.0 {
            self.t.transcendental_per_us
        } else {
            self.t.vector_flops_per_us / 8.0
        };
        let comp = mm_flops / (self.t.matmul_flops_per_us * mm_eff.max(1e-3))
            + vec_flops / self.t.vector_flops_per_us
            + trans / trans_rate
            + pack_us;
        let c = cores.max(1) as f64;
        let tiles = tiles.max(1.0);
        let wave = tiles / (c * (tiles / c).ceil());
        let exec = (mem.max(comp) + (1.0 - self.t.overlap) * mem.min(comp)) / wave;
        (exec, mem, comp, wave)
    }
}

/// External values a kernel reads (the value read, possibly a view), and its written members.
pub(crate) fn boundary(
    g: &Graph,
    members: &BTreeSet<NodeId>,
    users: &[Vec<NodeId>],
    outputs: &[NodeId],
) -> (Vec<NodeId>, Vec<NodeId>) {
    let mut ins = BTreeSet::new();
    for m in members {
        for i in &g.node(*m).inputs {
            let base = resolve(g, *i).base;
            // (a view of a member is read inside the kernel: a layout store's copy)
            if !members.contains(i)
                && !members.contains(&base)
                && !matches!(g.node(base).op, Op::Const { .. })
            {
                ins.insert(*i);
            }
        }
    }
    let outs = members
        .iter()
        .copied()
        .filter(|m| {
            g.outputs.contains(m)
                || outputs.contains(m)
                || (users[m.idx()].iter().any(|u| !members.contains(u))
                    && crate::group::layout_store(g, users, *m, members).is_none())
        })
        .collect();
    (ins.into_iter().collect(), outs)
}

pub(crate) type Cand = (f64, f64, f64, f64, (f64, f64), Tiling, Vec<(String, u64)>, bool);

pub(crate) fn best(cands: Vec<Cand>, launch: f64, flops: f64) -> Result<KernelCost, String> {
    let unconstrained = cands.iter().map(|c| c.0).fold(f64::INFINITY, f64::min);
    let mut feasible: Vec<_> = cands.into_iter().filter(|c| c.7).collect();
    if feasible.is_empty() {
        return Err("no tiling fits on chip".into());
    }
    feasible.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
    let (exec, mem, comp, wave, (bytes, llc_bytes), tiling, onchip, _) = feasible.swap_remove(0);
    Ok(KernelCost {
        time_us: launch + exec,
        launch_us: launch,
        mem_us: mem,
        compute_us: comp,
        wave_efficiency: wave,
        bytes,
        llc_bytes,
        flops,
        tiling,
        onchip,
        unconstrained_exec_us: unconstrained,
    })
}

/// The cost of one kernel holding `members`, at its best feasible tiling.
pub fn kernel_cost(
    g: &Graph,
    users: &[Vec<NodeId>],
    members: &BTreeSet<NodeId>,
    kind: GroupKind,
    anchor: Option<NodeId>,
    target: &Target,
    est: &dyn Fn(&DimExpr) -> i64,
) -> Result<KernelCost, String> {
    let k = Kernel::new(g, users, members, kind, anchor, target, est);
    crate::kernels::of(kind).cost(&k)
}

/// What every kind of kernel is priced from: its members, the values it reads and writes,
/// its vector and transcendental work, and its launch.
pub(crate) struct Kernel<'a> {
    pub(crate) g: &'a Graph,
    pub(crate) users: &'a [Vec<NodeId>],
    pub(crate) members: &'a BTreeSet<NodeId>,
    pub(crate) kind: GroupKind,
    pub(crate) anchor: Option<NodeId>,
    pub(crate) target: &'a Target,
    pub(crate) est: &'a dyn Fn(&DimExpr) -> i64,
    pub(crate) cx: Ctx<'a>,
    pub(crate) ins: Vec<NodeId>,
    pub(crate) outs: Vec<NodeId>,
    pub(crate) out_bytes: f64,
    pub(crate) vec_flops: f64,
    pub(crate) trans: f64,
    pub(crate) cached: f64,
    pub(crate) work_elems: f64,
    pub(crate) launch: f64,
    pub(crate) inline_below: f64,
}

impl<'a> Kernel<'a> {
    pub(crate) fn new(
        g: &'a Graph,
        users: &'a [Vec<NodeId>],
        members: &'a BTreeSet<NodeId>,
        kind: GroupKind,
        anchor: Option<NodeId>,
        target: &'a Target,
        est: &'a dyn Fn(&DimExpr) -> i64,
    ) -> Kernel<'a> {
        let cx = Ctx { g, t: target, est };
        let (ins, outs) = boundary(g, members, users, &[]);
        // A cache write moves only its new rows: its cache is neither read nor written whole.
        let ins: Vec<NodeId> = ins
            .into_iter()
            .filter(|i| !crate::kernels::cache_write::only_written(g, members, *i))
            .collect();
        let moved = |o: &NodeId| match g.node(*o).op {
            Op::CacheWrite { .. } => g.node(*o).inputs[1],
            _ => *o,
        };
        let out_bytes: f64 = outs.iter().map(|o| cx.bytes(moved(o))).sum();
        let vec_flops: f64 = members
            .iter()
            .filter(|m| !matches!(g.node(**m).op, Op::MatMul))
            .map(|m| {
                let n = g.node(*m);
                let it = cx.n(&numel(&iter_shape(g, *m)));
                it * op_weight(&n.op)
            })
            .sum();
        let trans: f64 = members
            .iter()
            .filter(|m| transcendental(&g.node(**m).op))
            .map(|m| cx.n(&numel(&iter_shape(g, *m))))
            .sum();
        let mut io: Vec<NodeId> = ins.clone();
        io.extend(outs.iter().copied());
        let cached = cx.cached(&io);
        // The host runtime runs small work inline, without a launch.
        let work_elems: f64 =
            members.iter().map(|m| cx.n(&numel(&iter_shape(g, *m)))).fold(0.0, f64::max);
        let launch = if work_elems < target.inline_below_elems as f64 {
            target.launch_us.min(0.2)
        } else {
            target.launch_us
        };
        let inline_below = target.inline_below_elems as f64;
        Kernel {
            g,
            users,
            members,
            kind,
            anchor,
            target,
            est,
            cx,
            ins,
            outs,
            out_bytes,
            vec_flops,
            trans,
            cached,
            work_elems,
            launch,
            inline_below,
        }
    }

    /// Small work runs as one block on one core (DynamicTiling's thresholds: rows kernels below
    /// `inline_below_elems` elements, matmul and attention below 4x that many flops).
    pub(crate) fn one_block(&self, tiles: f64, flops: Option<f64>) -> f64 {
        match flops {
            Some(f) if f < 4.0 * self.inline_below => 1.0,
            None if self.work_elems < self.inline_below => 1.0,
            _ => tiles,
        }
    }
}
