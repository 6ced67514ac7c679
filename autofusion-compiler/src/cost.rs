//! The cost model: a kernel's time in microseconds at its best feasible tiling.
//!
//! `T = launch + (max(t_mem, t_comp) + (1 - overlap) * min(t_mem, t_comp)) / wave_efficiency`,
//! with `t_mem = bytes / bandwidth` [B / (B/us) = us] and `t_comp = flops / peak`
//! [FLOP / (FLOP/us) = us]. Bytes count only tensors crossing the kernel boundary, times the
//! number of times the tile loops re-fetch them. A tiling is feasible when every on-chip buffer
//! it needs, rounded to the target's alignment (and doubled where the target double-buffers),
//! fits in `onchip_fraction` of that memory.

use crate::dim::{numel, DimExpr};
use crate::group::{iter_shape, space_of, GroupKind};
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
fn op_weight(op: &Op) -> f64 {
    match op {
        Op::Unary(u) => u.spec().flops,
        Op::Binary(b) => b.spec().flops,
        _ => 1.0,
    }
}

/// Ops evaluated by a polynomial or library function (exp, log, tanh, erf, pow) per element.
fn transcendental(op: &Op) -> bool {
    match op {
        Op::Unary(u) => u.spec().transcendental,
        Op::Binary(b) => b.spec().transcendental,
        _ => false,
    }
}

struct Ctx<'a> {
    g: &'a Graph,
    t: &'a Target,
    est: &'a dyn Fn(&DimExpr) -> i64,
}

impl Ctx<'_> {
    fn n(&self, d: &DimExpr) -> f64 {
        (self.est)(d).max(0) as f64
    }
    fn elems(&self, id: NodeId) -> f64 {
        self.n(&numel(&self.g.node(id).shape))
    }
    fn bytes(&self, id: NodeId) -> f64 {
        self.elems(id) * self.g.node(id).dtype.size() as f64
    }
    fn align(&self, b: f64) -> u64 {
        let a = self.t.align_bytes.max(1);
        (b.max(0.0) as u64).div_ceil(a) * a
    }
    /// Bytes of these tensors small enough to stay in the last-level cache between kernels.
    fn cached(&self, ids: &[NodeId]) -> f64 {
        let cap = self.t.llc_bytes as f64 * self.t.onchip_fraction;
        ids.iter().map(|i| self.bytes(*i)).filter(|b| *b <= cap).sum()
    }
    fn fits(&self, use_: &[(String, u64)]) -> bool {
        use_.iter().all(|(m, b)| self.t.budget(m).is_none_or(|cap| *b <= cap))
    }
    /// Off-chip and LLC bytes of reading a tensor of `size` bytes `times` times.
    fn reread(&self, size: f64, times: f64) -> (f64, f64) {
        let again = size * (times - 1.0).max(0.0);
        if size <= self.t.llc_bytes as f64 * self.t.onchip_fraction {
            (size, again)
        } else {
            (size + again, 0.0)
        }
    }
    /// In-cache bandwidth (bytes/us), or the memory bandwidth when the profile has none.
    fn llc_bw(&self) -> f64 {
        if self.t.llc_bandwidth_bytes_per_us > 0.0 {
            self.t.llc_bandwidth_bytes_per_us
        } else {
            self.t.bandwidth_bytes_per_us
        }
    }
    /// Time of moving `elems` operand elements into micro-kernel slivers [elements / (elements/us)].
    fn pack_us(&self, elems: f64) -> f64 {
        if self.t.pack_elems_per_us > 0.0 {
            elems / self.t.pack_elems_per_us
        } else {
            0.0
        }
    }
    /// Execution time from bytes (off-chip, of which `cached` stay in the LLC between kernels;
    /// plus LLC re-reads), flops, transcendental evaluations and packing (`pack_us`).
    #[allow(clippy::too_many_arguments)]
    fn exec_us(
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
fn boundary(
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

type Cand = (f64, f64, f64, f64, (f64, f64), Tiling, Vec<(String, u64)>, bool);

fn best(cands: Vec<Cand>, launch: f64, flops: f64) -> Result<KernelCost, String> {
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
    match kind {
        GroupKind::Elementwise | GroupKind::Concat => rows_cost(&k),
        GroupKind::MatMul => matmul_cost(&k),
        GroupKind::Horizontal => horizontal_cost(&k),
        GroupKind::FlashAttention => flash_cost(&k),
    }
}

/// What every kind of kernel is priced from: its members, the values it reads and writes,
/// its vector and transcendental work, and its launch.
struct Kernel<'a> {
    g: &'a Graph,
    users: &'a [Vec<NodeId>],
    members: &'a BTreeSet<NodeId>,
    kind: GroupKind,
    anchor: Option<NodeId>,
    target: &'a Target,
    est: &'a dyn Fn(&DimExpr) -> i64,
    cx: Ctx<'a>,
    ins: Vec<NodeId>,
    outs: Vec<NodeId>,
    out_bytes: f64,
    vec_flops: f64,
    trans: f64,
    cached: f64,
    work_elems: f64,
    launch: f64,
    inline_below: f64,
}

impl<'a> Kernel<'a> {
    fn new(
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
        let out_bytes: f64 = outs.iter().map(|o| cx.bytes(*o)).sum();
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
    fn one_block(&self, tiles: f64, flops: Option<f64>) -> f64 {
        match flops {
            Some(f) if f < 4.0 * self.inline_below => 1.0,
            None if self.work_elems < self.inline_below => 1.0,
            _ => tiles,
        }
    }
}

/// Rows kernels (elementwise chains, reductions, concat): blocks of rows over the cores, row
/// buffers on chip.
fn rows_cost(k: &Kernel) -> Result<KernelCost, String> {
    let g = k.g;
    let members = k.members;
    let kind = k.kind;
    let target = k.target;
    let out_bytes = k.out_bytes;
    let vec_flops = k.vec_flops;
    let trans = k.trans;
    let cached = k.cached;
    let launch = k.launch;
    let cx = &k.cx;
    let ins = &k.ins;
    let outs = &k.outs;
    let one_block = |tiles: f64, flops: Option<f64>| k.one_block(tiles, flops);
    let space = if kind == GroupKind::Concat {
        g.node(*members.iter().next().unwrap()).shape.clone()
    } else {
        space_of(g, &members.iter().copied().collect::<Vec<_>>())
            .ok_or("members iterate over different shapes")?
    };
    let n = cx.n(space.last().unwrap()).max(1.0);
    let rows = cx.n(&numel(&space[..space.len() - 1])).max(1.0);
    let in_bytes: f64 = ins.iter().map(|i| cx.bytes(*i)).sum();
    let bytes = in_bytes + out_bytes;
    // Streams per row (inputs and outputs at full width) and values kept across phases.
    let full =
        |id: NodeId| cx.n(g.node(id).shape.last().unwrap_or(&DimExpr::constant(1))) >= n && n > 1.0;
    let streams =
        ins.iter().filter(|i| full(**i)).count() + outs.iter().filter(|o| full(**o)).count();
    let kept = members.iter().filter(|m| full(**m) && g.node(**m).shape == space).count();
    let db = if target.double_buffer { 2.0 } else { 1.0 };
    let per_col = (streams as f64 * db + kept as f64) * 4.0;
    let (llc, use_, ok) = if let Some(ub) = target.budget("ub") {
        // Ascend: each AIV streams one row at a time through UB in chunks of up to `chunk`
        // columns (the generator's `Ub::per_col` x `CH`), so any row length fits once 16
        // columns do. Every chunk loop after the first re-reads the row's sources: from L2,
        // the row having just been read.
        let chunk = (((ub as f64 / per_col) / 16.0).floor() * 16.0).min(n.max(16.0));
        let use_ = vec![("ub".to_string(), cx.align(per_col * chunk.max(16.0)))];
        (in_bytes * (row_passes(g, members) - 1) as f64, use_, chunk >= 16.0)
    } else {
        // The host: a block streams one row at a time; later passes over a row (after a
        // reduction) re-read it from L1, not charged (measured: charging them at the in-cache
        // bandwidth made fused norms look slower than their parts, which they are not).
        let use_ = vec![("l2".to_string(), cx.align(per_col * n))];
        let ok = cx.fits(&use_);
        (0.0, use_, ok)
    };
    let (exec, mem, comp, wave) = cx.exec_us(
        (bytes, llc),
        cached,
        0.0,
        vec_flops,
        trans,
        0.0,
        1.0,
        one_block(rows, None),
        target.cores,
    );
    let tiling = Tiling::Rows { rows_per_tile: 1 };
    best(vec![(exec, mem, comp, wave, (bytes, llc), tiling, use_, ok)], launch, vec_flops)
}

/// The chunk loops a rows kernel makes over each row: one, plus one after each reduction that
/// later full-width members depend on (the generators' phases).
fn row_passes(g: &Graph, members: &BTreeSet<NodeId>) -> usize {
    let mut level: std::collections::BTreeMap<NodeId, usize> = Default::default();
    for m in members {
        let l = g
            .node(*m)
            .inputs
            .iter()
            .filter(|i| members.contains(i))
            .map(|i| level[i] + usize::from(matches!(g.node(*i).op, Op::Reduce { .. })))
            .max()
            .unwrap_or(0);
        level.insert(*m, l);
    }
    1 + level.values().copied().max().unwrap_or(0)
}

/// A matmul with its prologue and epilogue, at each feasible (MC, NC, KC) blocking.
fn matmul_cost(k: &Kernel) -> Result<KernelCost, String> {
    let a = k.anchor.expect("matmul group has an anchor");
    let dims = MatMulDims::new(k, a);
    let traffic = MatMulTraffic::new(k, a);
    let packing = Packing::new(k, a, &traffic);
    let cands = matmul_tilings(k, &dims, &traffic, &packing);
    best(cands, k.launch, dims.mm_flops + k.vec_flops)
}

/// The product's extents: output rows `m` and columns `nn`, depth `k`, batch and its flops.
#[derive(Clone, Copy)]
struct MatMulDims {
    m: f64,
    nn: f64,
    k: f64,
    batch: f64,
    mm_flops: f64,
}

impl MatMulDims {
    /// The extents of the product computed by `anchor`.
    fn new(kernel: &Kernel, anchor: NodeId) -> MatMulDims {
        let (g, cx) = (kernel.g, &kernel.cx);
        let an = g.node(anchor);
        let out = &an.shape;
        let r = out.len();
        let (m, nn) = (cx.n(&out[r - 2]), cx.n(&out[r - 1]));
        let k = cx.n(g.node(an.inputs[0]).shape.last().unwrap());
        let batch = cx.n(&numel(&out[..r - 2])).max(1.0);
        let mm_flops = 2.0 * batch * m * nn * k;
        MatMulDims { m, nn, k, batch, mm_flops }
    }
}

/// What a matmul kernel reads and computes besides the product: the A side (with the
/// prologue's inputs), B, the epilogue's other inputs, and the vector work on either side.
struct MatMulTraffic {
    /// Members upstream of the anchor.
    pro: BTreeSet<NodeId>,
    b_in: NodeId,
    /// Inputs read by the epilogue only.
    other: Vec<NodeId>,
    a_bytes: f64,
    b_bytes: f64,
    epi_bytes: f64,
    pro_flops: f64,
    pro_trans: f64,
    epi_flops: f64,
    epi_trans: f64,
}

impl MatMulTraffic {
    /// Split the kernel's inputs and vector work between the prologue and the epilogue of `a`.
    fn new(kernel: &Kernel, a: NodeId) -> MatMulTraffic {
        let (g, cx, members, ins) = (kernel.g, &kernel.cx, kernel.members, &kernel.ins);
        let an = g.node(a);
        // Prologue = members upstream of the anchor: their inputs stream with A.
        let pro = crate::group::prologue_of(g, a, |i| members.contains(i));
        let a_in: Vec<NodeId> = ins
            .iter()
            .copied()
            .filter(|i| pro.iter().any(|p| g.node(*p).inputs.contains(i)) || *i == an.inputs[0])
            .collect();
        let b_in = an.inputs[1];
        let other: Vec<NodeId> =
            ins.iter().copied().filter(|i| !a_in.contains(i) && *i != b_in).collect();
        let a_bytes: f64 = a_in.iter().map(|i| cx.bytes(*i)).sum();
        let b_bytes = cx.bytes(b_in);
        let epi_bytes: f64 = other.iter().map(|i| cx.bytes(*i)).sum();
        let pro_flops: f64 =
            pro.iter().map(|p| cx.n(&numel(&g.node(*p).shape)) * op_weight(&g.node(*p).op)).sum();
        let pro_trans: f64 = pro
            .iter()
            .filter(|p| transcendental(&g.node(**p).op))
            .map(|p| cx.n(&numel(&g.node(*p).shape)))
            .sum();
        let epi_flops = kernel.vec_flops - pro_flops;
        let epi_trans = kernel.trans - pro_trans;
        MatMulTraffic {
            pro,
            b_in,
            other,
            a_bytes,
            b_bytes,
            epi_bytes,
            pro_flops,
            pro_trans,
            epi_flops,
            epi_trans,
        }
    }
}

/// How the operands reach the micro-kernel: which packing copies the target's template skips.
struct Packing {
    b_rows_contiguous: bool,
    b_prepacked: bool,
    a_direct: bool,
    /// Bytes moved per element of a B copy.
    b_copy_bytes: f64,
}

impl Packing {
    /// The packing of the operands of `a`.
    fn new(kernel: &Kernel, a: NodeId, traffic: &MatMulTraffic) -> Packing {
        let (g, target, b_in) = (kernel.g, kernel.target, traffic.b_in);
        let an = g.node(a);
        // B rows contiguous: packing B is a copy (read at its dtype, written as f32).
        let b_rows_contiguous =
            crate::layout::resolve(g, b_in).strides.last().and_then(|s| s.as_const()) == Some(1);
        // The host template packs a B read from a parameter once per weight tensor (not
        // per call), and reads an f32 A with contiguous rows and no prologue in place.
        let host = target.runtime_blocking.is_some();
        let b_prepacked = host
            && matches!(
                g.node(crate::layout::resolve(g, b_in).base).op,
                crate::ir::Op::Param { .. }
            );
        let a_direct = host
            && traffic.pro.is_empty()
            && g.node(an.inputs[0]).dtype.is_compute()
            && crate::layout::resolve(g, an.inputs[0]).strides.last().and_then(|s| s.as_const())
                == Some(1);
        let b_copy_bytes = (g.node(b_in).dtype.size() + 4) as f64;
        Packing { b_rows_contiguous, b_prepacked, a_direct, b_copy_bytes }
    }

    /// Time packing the operands takes with `mt` x `nt` output tiles.
    fn time_us(&self, cx: &Ctx, target: &Target, dims: &MatMulDims, mt: f64, nt: f64) -> f64 {
        let MatMulDims { m, nn, k, batch, .. } = *dims;
        // A is packed once per N tile (a scatter into MR-row slivers, at the
        // calibrated packing rate), B once per M tile: when B's rows are
        // contiguous that is a cache-resident copy of NR-wide rows (read and
        // written once at the in-cache bandwidth); a transposed B is gathered
        // at the packing rate.
        let b_elems = batch * k * nn * mt;
        let pack_b = if self.b_prepacked {
            0.0
        } else if self.b_rows_contiguous && target.pack_elems_per_us > 0.0 {
            b_elems * self.b_copy_bytes / cx.llc_bw()
        } else {
            cx.pack_us(b_elems)
        };
        let pack_a = if self.a_direct { 0.0 } else { cx.pack_us(batch * m * k * nt) };
        pack_a + pack_b
    }
}

/// The (MC, NC, KC) blockings to try: the host runtime's fixed MC and KC with NC up to its
/// own, or a grid on other targets.
fn matmul_blockings(target: &Target) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    match target.runtime_blocking {
        Some([mc, nc, kc, _, _]) => (
            vec![mc as f64],
            [32.0, 64.0, 128.0, 256.0].into_iter().filter(|x| *x <= nc as f64).collect(),
            vec![kc as f64],
        ),
        None => (
            vec![16.0, 32.0, 64.0, 128.0, 256.0],
            vec![32.0, 64.0, 128.0, 256.0, 512.0],
            vec![64.0, 128.0, 256.0, 512.0],
        ),
    }
}

/// On-chip bytes per core of an (mc, nc, kc) block with `epi_inputs` epilogue inputs.
fn matmul_onchip(
    cx: &Ctx,
    target: &Target,
    (mc, nc, kc): (f64, f64, f64),
    epi_inputs: usize,
) -> Vec<(String, u64)> {
    let ob = target.matmul_operand_bytes as f64;
    let db = if target.double_buffer { 2.0 } else { 1.0 };
    if target.memory("ub").is_some() {
        let k0 = kc.min(64.0);
        vec![
            ("l1".into(), cx.align((mc * kc + kc * nc) * ob * db)),
            ("l0a".into(), cx.align(mc * k0 * ob * db)),
            ("l0b".into(), cx.align(k0 * nc * ob * db)),
            ("l0c".into(), cx.align(mc * nc * 4.0)),
            // The epilogue streams each C row (from the AIV's GM tile) with its inputs
            // through UB in chunks of at most the tile's width, as rows kernels do.
            ("ub".into(), cx.align(nc.min(256.0) * 4.0 * ((1.0 + epi_inputs as f64) * db + 1.0))),
        ]
    } else {
        vec![("l2".into(), cx.align((mc * kc + kc * nc + mc * nc) * 4.0))]
    }
}

/// The tiling search: a candidate per blocking, with its traffic, work and on-chip bytes.
fn matmul_tilings(
    kernel: &Kernel,
    dims: &MatMulDims,
    traffic: &MatMulTraffic,
    packing: &Packing,
) -> Vec<Cand> {
    let (target, cx, out_bytes) = (kernel.target, &kernel.cx, kernel.out_bytes);
    let MatMulDims { m, nn, k, batch, mm_flops } = *dims;
    let (mcs, ncs, kcs) = matmul_blockings(target);
    let mut cands: Vec<Cand> = Vec::new();
    for &mc in &mcs {
        for &nc in &ncs {
            for &kc in &kcs {
                let (mc, nc, kc) =
                    (f64::min(mc, m.max(1.0)), f64::min(nc, nn.max(1.0)), f64::min(kc, k.max(1.0)));
                let (mt, nt) = ((m / mc).ceil().max(1.0), (nn / nc).ceil().max(1.0));
                let (n_major, (a_hbm, a_llc), (b_hbm, b_llc)) = tile_order(cx, traffic, mt, nt);
                let bytes = (a_hbm + b_hbm + traffic.epi_bytes + out_bytes, a_llc + b_llc);
                let flops_v = traffic.pro_flops * nt + traffic.epi_flops;
                let eff = (mc / (mc + 8.0)) * (nc / (nc + 16.0));
                let tiles = batch * mt * nt;
                let use_ = matmul_onchip(cx, target, (mc, nc, kc), traffic.other.len());
                let pack = packing.time_us(cx, target, dims, mt, nt);
                let (exec, mem, comp, wave) = cx.exec_us(
                    bytes,
                    kernel.cached,
                    mm_flops,
                    flops_v,
                    traffic.pro_trans * nt + traffic.epi_trans,
                    pack,
                    eff,
                    kernel.one_block(tiles, Some(mm_flops)),
                    target.matrix_cores,
                );
                let ok = cx.fits(&use_);
                cands.push((
                    exec,
                    mem,
                    comp,
                    wave,
                    bytes,
                    Tiling::MatMul { mc: mc as i64, nc: nc as i64, kc: kc as i64, n_major },
                    use_,
                    ok,
                ));
            }
        }
    }
    cands
}

/// The order of a matmul's output tiles and the (off-chip, L2) bytes of reading A and B in it.
/// The host template re-reads each operand per tile of the other (from the LLC when it fits);
/// on a device the cores take consecutive tiles at once, so the operand of the current panel is
/// read from memory once and re-read from L2, and the other operand once per panel unless it
/// stays in L2 (`abi::ascend_n_major` picks the order).
fn tile_order(
    cx: &Ctx,
    traffic: &MatMulTraffic,
    mt: f64,
    nt: f64,
) -> (bool, (f64, f64), (f64, f64)) {
    let (a, b) = (traffic.a_bytes, traffic.b_bytes);
    if cx.t.runtime_blocking.is_some() {
        return (false, cx.reread(a, nt), cx.reread(b, mt));
    }
    if crate::abi::ascend_n_major(a, b, mt, nt) {
        (true, cx.reread(a, nt), (b, b * (mt - 1.0).max(0.0)))
    } else {
        (false, (a, a * (nt - 1.0).max(0.0)), cx.reread(b, mt))
    }
}

/// Sibling matmuls in one launch: each part at its own best tiling, one launch.
fn horizontal_cost(k: &Kernel) -> Result<KernelCost, String> {
    let g = k.g;
    let users = k.users;
    let members = k.members;
    let target = k.target;
    let est = k.est;
    // One launch running every part's tiles; each part keeps its own best tiling.
    let parts = crate::group::horizontal_parts(g, &members.iter().copied().collect::<Vec<_>>());
    let mut total: Option<KernelCost> = None;
    for (anchor, part) in parts {
        let c = kernel_cost(g, users, &part, GroupKind::MatMul, Some(anchor), target, est)?;
        total = Some(match total {
            None => c,
            Some(t) => KernelCost {
                time_us: t.time_us + c.time_us - c.launch_us,
                mem_us: t.mem_us + c.mem_us,
                compute_us: t.compute_us + c.compute_us,
                wave_efficiency: t.wave_efficiency.min(c.wave_efficiency),
                bytes: t.bytes + c.bytes,
                llc_bytes: t.llc_bytes + c.llc_bytes,
                flops: t.flops + c.flops,
                onchip: t
                    .onchip
                    .iter()
                    .zip(&c.onchip)
                    .map(|(x, y)| (x.0.clone(), x.1.max(y.1)))
                    .collect(),
                unconstrained_exec_us: t.unconstrained_exec_us + c.unconstrained_exec_us,
                ..t
            },
        });
    }
    total.ok_or_else(|| "a horizontal group without matmuls".to_string())
}

/// Online-softmax attention at each feasible (BR, BC) block pair.
fn flash_cost(k: &Kernel) -> Result<KernelCost, String> {
    let g = k.g;
    let members = k.members;
    let target = k.target;
    let out_bytes = k.out_bytes;
    let cached = k.cached;
    let launch = k.launch;
    let cx = &k.cx;
    let ins = &k.ins;
    let one_block = |tiles: f64, flops: Option<f64>| k.one_block(tiles, flops);
    let mut cands: Vec<Cand> = Vec::new();
    let f = crate::group::flash_parts(g, members).ok_or("not an attention pattern")?;
    let s = &g.node(f.scores).shape;
    let r = s.len();
    let (sq, sk) = (cx.n(&s[r - 2]), cx.n(&s[r - 1]));
    let batch = cx.n(&numel(&s[..r - 2])).max(1.0);
    let d = cx.n(g.node(g.node(f.qk).inputs[0]).shape.last().unwrap());
    let dv = cx.n(g.node(f.pv).shape.last().unwrap());
    let mm_flops = 2.0 * batch * sq * sk * (d + dv);
    // Per score: the chain (scale, mask), then max, subtract, sum and the rescale.
    let vec_f = batch * sq * sk * (f.chain.len() as f64 + 4.0);
    let q_bytes = cx.bytes(g.node(f.qk).inputs[0]);
    let kv_bytes = cx.bytes(g.node(f.qk).inputs[1]) + cx.bytes(g.node(f.pv).inputs[1]);
    let mask_bytes: f64 = ins
        .iter()
        .filter(|i| {
            **i != g.node(f.qk).inputs[0]
                && **i != g.node(f.qk).inputs[1]
                && **i != g.node(f.pv).inputs[1]
        })
        .map(|i| cx.bytes(*i))
        .sum();
    let db = if target.double_buffer { 2.0 } else { 1.0 };
    let (brs, bcs): (Vec<f64>, Vec<f64>) = match target.runtime_blocking {
        Some([_, _, _, br, bc]) => (
            [4.0, 8.0, 16.0, 32.0, 64.0].into_iter().filter(|x| *x <= br as f64).collect(),
            vec![bc as f64],
        ),
        None => (vec![16.0, 32.0, 64.0, 128.0], vec![32.0, 64.0, 128.0, 256.0]),
    };
    for &br in &brs {
        for &bc in &bcs {
            let (br, bc) = (f64::min(br, sq.max(1.0)), f64::min(bc, sk.max(1.0)));
            let qt = (sq / br).ceil().max(1.0);
            // K and V of one (batch, head) are read once per unit: on the host a unit
            // is as many query blocks of a head as leave two units per core (the
            // runtime's choice), on Ascend one query block.
            let kv_reads = if target.runtime_blocking.is_some() {
                (2.0 * target.cores.max(1) as f64 / batch).ceil().clamp(1.0, qt)
            } else {
                qt
            };
            let (kv_hbm, kv_llc) = cx.reread(kv_bytes / batch, kv_reads);
            let bytes = (q_bytes + kv_hbm * batch + mask_bytes + out_bytes, kv_llc * batch);
            let onchip = (br * d + (bc * d + bc * dv) * db + br * bc + br * dv) * 4.0;
            let mem_name = if target.memory("ub").is_some() { "ub" } else { "l2" };
            let use_ = vec![(mem_name.to_string(), cx.align(onchip))];
            let eff = (br / (br + 8.0)) * (bc / (bc + 16.0));
            // One exp per score, plus the rescale per row and key block.
            let t_exp = batch * sq * sk + batch * sq * (sk / bc).ceil();
            // K and V once per unit, Q once, P per key block. On the host, Q (f32
            // with contiguous rows) and P are read in place, and V, K with contiguous
            // rows are copies at the in-cache bandwidth; a transposed K is gathered.
            let pack = if target.runtime_blocking.is_some() {
                let contiguous = |v: NodeId| {
                    crate::layout::resolve(g, v).strides.last().and_then(|s| s.as_const())
                        == Some(1)
                };
                let (q, kt, v) =
                    (g.node(f.qk).inputs[0], g.node(f.qk).inputs[1], g.node(f.pv).inputs[1]);
                let copy = |v: NodeId, elems: f64| {
                    elems * (g.node(v).dtype.size() + 4) as f64 / cx.llc_bw()
                };
                let q_us = if g.node(q).dtype.is_compute() && contiguous(q) {
                    0.0
                } else {
                    cx.pack_us(batch * sq * d)
                };
                let k_us = if contiguous(kt) {
                    copy(kt, batch * kv_reads * sk * d)
                } else {
                    cx.pack_us(batch * kv_reads * sk * d)
                };
                let v_us = if contiguous(v) {
                    copy(v, batch * kv_reads * sk * dv)
                } else {
                    cx.pack_us(batch * kv_reads * sk * dv)
                };
                q_us + k_us + v_us
            } else {
                cx.pack_us(batch * (sq * d + kv_reads * sk * (d + dv) + sq * sk))
            };
            let (exec, mem, comp, wave) = cx.exec_us(
                bytes,
                cached,
                mm_flops,
                vec_f,
                t_exp,
                pack,
                eff,
                one_block(batch * qt, Some(4.0 * batch * sq * sk * d)),
                target.matrix_cores,
            );
            let ok = cx.fits(&use_);
            cands.push((
                exec,
                mem,
                comp,
                wave,
                bytes,
                Tiling::Flash { br: br as i64, bc: bc as i64 },
                use_,
                ok,
            ));
        }
    }
    best(cands, launch, mm_flops + vec_f)
}
