//! Matmul kernels: the cost model's price.

use crate::cost::*;
use crate::dim::numel;
use crate::group::iter_shape;
use crate::ir::{NodeId, Op};
use crate::target::OnChip;
use crate::target::Target;
use std::collections::BTreeSet;

/// A matmul with its prologue and epilogue, at each feasible (MC, NC, KC) blocking.
pub(crate) fn matmul_cost(k: &Kernel) -> Result<KernelCost, String> {
    let a = k.anchor.expect("matmul group has an anchor");
    let dims = MatMulDims::new(k, a);
    let traffic = MatMulTraffic::new(k, a);
    let packing = Packing::new(k, a, &traffic);
    let cands = matmul_tilings(k, &dims, &traffic, &packing);
    best(cands, k.launch, dims.mm_flops + k.vec_flops)
}

/// The product's extents: output rows `m` and columns `nn`, depth `k`, batch and its flops.
#[derive(Clone, Copy)]
pub(crate) struct MatMulDims {
    pub(crate) m: f64,
    pub(crate) nn: f64,
    pub(crate) k: f64,
    pub(crate) batch: f64,
    /// Products per output tile: 2 with a sibling matmul (`group::matmul_siblings`).
    pub(crate) products: f64,
    /// The flops of every product.
    pub(crate) mm_flops: f64,
}

impl MatMulDims {
    /// The extents of the product computed by `anchor`.
    pub(crate) fn new(kernel: &Kernel, anchor: NodeId) -> MatMulDims {
        let (g, cx) = (kernel.g, &kernel.cx);
        let an = g.node(anchor);
        let out = &an.shape;
        let r = out.len();
        let (m, nn) = (cx.n(&out[r - 2]), cx.n(&out[r - 1]));
        let k = cx.n(g.node(an.inputs[0]).shape.last().unwrap());
        let batch = cx.n(&numel(&out[..r - 2])).max(1.0);
        let products = 1.0 + siblings(kernel, anchor).len() as f64;
        let mm_flops = 2.0 * batch * m * nn * k * products;
        MatMulDims { m, nn, k, batch, products, mm_flops }
    }
}

/// The sibling products of `anchor` in the kernel.
fn siblings(kernel: &Kernel, anchor: NodeId) -> Vec<NodeId> {
    crate::group::matmul_siblings(kernel.g, anchor, kernel.members)
}

/// What a matmul kernel reads and computes besides the product: the A side (with the
/// prologue's inputs), B, the epilogue's other inputs, and the vector work on either side.
pub(crate) struct MatMulTraffic {
    /// Members upstream of the anchor.
    pub(crate) pro: BTreeSet<NodeId>,
    pub(crate) b_in: NodeId,
    /// Inputs read by the epilogue only.
    pub(crate) other: Vec<NodeId>,
    pub(crate) a_bytes: f64,
    pub(crate) b_bytes: f64,
    pub(crate) epi_bytes: f64,
    pub(crate) pro_flops: f64,
    /// The prologue's row statistics (its reductions and the values they read): the host
    /// recomputes them for each K block of a row it packs.
    pub(crate) stats_flops: f64,
    pub(crate) pro_trans: f64,
    pub(crate) epi_flops: f64,
    pub(crate) epi_trans: f64,
}

impl MatMulTraffic {
    /// Split the kernel's inputs and vector work between the prologue and the epilogue of `a`.
    pub(crate) fn new(kernel: &Kernel, a: NodeId) -> MatMulTraffic {
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
        // Every product's B streams the same way (the sibling's beside the anchor's).
        let bs: Vec<NodeId> = std::iter::once(b_in)
            .chain(siblings(kernel, a).iter().map(|s| g.node(*s).inputs[1]))
            .collect();
        let other: Vec<NodeId> =
            ins.iter().copied().filter(|i| !a_in.contains(i) && !bs.contains(i)).collect();
        let a_bytes: f64 = a_in.iter().map(|i| cx.bytes(*i)).sum();
        let b_bytes = bs.iter().map(|b| cx.bytes(*b)).sum();
        let epi_bytes: f64 = other.iter().map(|i| cx.bytes(*i)).sum();
        // Counted as `Kernel::new` counts the vector work (a reduction over its input).
        let flops_of = |p: &NodeId| cx.n(&numel(&iter_shape(g, *p))) * op_weight(&g.node(*p).op);
        let stats = statistics(g, &pro);
        let stats_flops: f64 = stats.iter().map(flops_of).sum();
        let pro_flops: f64 = pro.iter().filter(|p| !stats.contains(p)).map(flops_of).sum();
        let pro_trans: f64 = pro
            .iter()
            .filter(|p| transcendental(&g.node(**p).op))
            .map(|p| cx.n(&numel(&g.node(*p).shape)))
            .sum();
        let epi_flops = kernel.vec_flops - pro.iter().map(flops_of).sum::<f64>();
        let epi_trans = kernel.trans - pro_trans;
        MatMulTraffic {
            pro,
            b_in,
            other,
            a_bytes,
            b_bytes,
            epi_bytes,
            pro_flops,
            stats_flops,
            pro_trans,
            epi_flops,
            epi_trans,
        }
    }
}

/// The row statistics of prologue `pro`: its reductions and the members upstream of them.
fn statistics(g: &crate::ir::Graph, pro: &BTreeSet<NodeId>) -> BTreeSet<NodeId> {
    let mut need = BTreeSet::new();
    let mut stack: Vec<NodeId> =
        pro.iter().copied().filter(|m| matches!(g.node(*m).op, Op::Reduce { .. })).collect();
    while let Some(x) = stack.pop() {
        if pro.contains(&x) && need.insert(x) {
            stack.extend(g.node(x).inputs.iter().copied());
        }
    }
    need
}

/// How the operands reach the micro-kernel: which packing copies the target's template skips.
pub(crate) struct Packing {
    pub(crate) b_rows_contiguous: bool,
    pub(crate) b_prepacked: bool,
    pub(crate) a_direct: bool,
    /// Bytes moved per element of a B copy.
    pub(crate) b_copy_bytes: f64,
}

impl Packing {
    /// The packing of the operands of `a`.
    pub(crate) fn new(kernel: &Kernel, a: NodeId, traffic: &MatMulTraffic) -> Packing {
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
    pub(crate) fn time_us(
        &self,
        cx: &Ctx,
        target: &Target,
        dims: &MatMulDims,
        mt: f64,
        nt: f64,
    ) -> f64 {
        let MatMulDims { m, nn, k, batch, products, .. } = *dims;
        // A is packed once per N tile (a scatter into MR-row slivers, at the
        // calibrated packing rate), B once per M tile: when B's rows are
        // contiguous that is a cache-resident copy of NR-wide rows (read and
        // written once at the in-cache bandwidth); a transposed B is gathered
        // at the packing rate.
        let b_elems = batch * k * nn * mt * products;
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
pub(crate) fn matmul_blockings(target: &Target) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
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

/// On-chip bytes per core of an (mc, nc, kc) block with `epi_inputs` epilogue inputs and
/// `products` C blocks.
pub(crate) fn matmul_onchip(
    cx: &Ctx,
    target: &Target,
    (mc, nc, kc): (f64, f64, f64),
    epi_inputs: usize,
    products: f64,
) -> Vec<(String, u64)> {
    let ob = target.matmul_operand_bytes as f64;
    let db = if target.double_buffer { 2.0 } else { 1.0 };
    if target.on_chip == OnChip::Scratchpads {
        let k0 = kc.min(64.0);
        vec![
            ("l1".into(), cx.align((mc * kc + kc * nc) * ob * db)),
            ("l0a".into(), cx.align(mc * k0 * ob * db)),
            ("l0b".into(), cx.align(k0 * nc * ob * db)),
            ("l0c".into(), cx.align(mc * nc * 4.0)),
            // The epilogue streams each C row (from the AIV's GM tiles) with its inputs
            // through UB in chunks of at most the tile's width, as rows kernels do.
            (
                target.vector_memory().into(),
                cx.align(nc.min(256.0) * 4.0 * ((products + epi_inputs as f64) * db + 1.0)),
            ),
        ]
    } else {
        vec![(
            target.vector_memory().into(),
            cx.align((mc * kc + kc * nc + mc * nc * products) * 4.0),
        )]
    }
}

/// The tiling search: a candidate per blocking, with its traffic, work and on-chip bytes.
pub(crate) fn matmul_tilings(
    kernel: &Kernel,
    dims: &MatMulDims,
    traffic: &MatMulTraffic,
    packing: &Packing,
) -> Vec<Cand> {
    let (target, cx, out_bytes) = (kernel.target, &kernel.cx, kernel.out_bytes);
    let MatMulDims { m, nn, k, batch, products, mm_flops } = *dims;
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
                // The host packs A per K block and recomputes a norm's statistics for each.
                let k_blocks =
                    if target.runtime_blocking.is_some() { (k / kc).ceil() } else { 1.0 };
                let pro_v = traffic.pro_flops + traffic.stats_flops * k_blocks;
                let flops_v = pro_v * nt + traffic.epi_flops;
                let eff = (mc / (mc + 8.0)) * (nc / (nc + 16.0));
                let tiles = batch * mt * nt;
                let use_ = matmul_onchip(cx, target, (mc, nc, kc), traffic.other.len(), products);
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
pub(crate) fn tile_order(
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
