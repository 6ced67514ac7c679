//! Matmul kernels: host C emission.

use crate::abi::{PackMeta, Work};
use crate::codegen::emit::{Code, Emitter, Space};
use crate::codegen::host::c::*;
use crate::dim::{numel, DimExpr, Shape};
use crate::ir::{DType, NodeId, Op};
use crate::layout::resolve;
use crate::plan::Group;
use std::collections::{BTreeMap, BTreeSet};

pub(crate) fn gen_matmul(em: &mut Emitter, grp: &Group, body: &mut Code) -> Work {
    let members: BTreeSet<NodeId> = grp.nodes.iter().copied().collect();
    let outputs: BTreeSet<NodeId> = grp.outputs.iter().copied().collect();
    body.line("const int64_t hoff = 0;");
    let p = gen_matmul_part(em, grp.anchor.unwrap(), &members, &outputs, body);
    Work::MatMul {
        batch: p.batch,
        m: p.m,
        n: p.n,
        k: p.k,
        products: p.products,
        nc_step: p.nc_step,
    }
}

/// One matmul of a kernel with its prologue and epilogue, and how its operands are read.
pub(crate) struct MatmulPart {
    pub(crate) a_in: NodeId,
    /// The anchor's product (its B), then its sibling's (`group::matmul_siblings`), each into
    /// its own C block (`Cc`, `Cc1`).
    pub(crate) products: Vec<Product>,
    pub(crate) out_shape: Shape,
    pub(crate) k_dim: DimExpr,
    pub(crate) batch: Shape,
    /// Members upstream of the anchor, applied while packing A.
    pub(crate) prologue: BTreeSet<NodeId>,
    /// The other members, applied while storing C.
    pub(crate) epilogue: Vec<NodeId>,
    pub(crate) spa: Space,
    pub(crate) spo: Space,
    /// A is read in place by the micro-kernel (no packing).
    pub(crate) a_direct: bool,
    /// (batch, M) as the loops walk them: the batch folded into the rows when one B serves
    /// every batch index (see `rows_over_batch`).
    pub(crate) loop_batch: DimExpr,
    pub(crate) loop_m: DimExpr,
    /// The view of the product the epilogue reads, when it computes in a natural split of
    /// the product (`spo` is then the split's space, rows of its last axis).
    pub(crate) split: Option<(NodeId, crate::group::NaturalSplit)>,
}

/// One product of a matmul kernel: the matmul, its B operand and how B is read.
pub(crate) struct Product {
    pub(crate) node: NodeId,
    pub(crate) b_in: NodeId,
    pub(crate) spb: Space,
    /// The `bufs` slot of B, its element type and (C) the index of the packed matrix batch
    /// index `bi` reads, when B is packed once per weight tensor.
    pub(crate) packed: Option<(usize, DType, String)>,
}

impl Product {
    /// B read from a parameter (a weight) is packed once per tensor by a pack function the
    /// runtime runs (see `abi::PackMeta`); any other B is packed in the kernel, one sliver at a
    /// time (`tag` names its space).
    fn new(em: &mut Emitter, node: NodeId, b_shape: &Shape, tag: &'static str) -> Product {
        let g = em.g;
        let b_in = g.node(node).inputs[1];
        let mut spb = Space { tag, shape: b_shape.clone(), accesses: BTreeMap::new() };
        let packed = matches!(g.node(resolve(g, b_in).base).op, Op::Param { .. }).then(|| {
            let (slot, index) = pack_b(em, b_shape, b_in);
            (slot, g.node(b_in).dtype, index)
        });
        if packed.is_none() {
            em.access(&mut spb, b_in);
        }
        Product { node, b_in, spb, packed }
    }
    /// The C block this product accumulates in (the anchor's first).
    fn c_block(i: usize) -> String {
        numbered("Cc", i)
    }
}

/// Splits the members around the anchor, declares the accesses of the spaces of A, B and the
/// output, and makes the pack function of a B read from a parameter.
pub(crate) fn matmul_part(
    em: &mut Emitter,
    anchor: NodeId,
    members: &BTreeSet<NodeId>,
    outputs: &BTreeSet<NodeId>,
) -> MatmulPart {
    let g = em.g;
    let out_shape = g.node(anchor).shape.clone();
    let r = out_shape.len();
    let a_in = g.node(anchor).inputs[0];
    let k_dim = g.node(a_in).shape.last().unwrap().clone();
    let batch: Shape = out_shape[..r - 2].to_vec();
    let mut a_shape = batch.clone();
    a_shape.push(out_shape[r - 2].clone());
    a_shape.push(k_dim.clone());
    let mut b_shape = batch.clone();
    b_shape.push(k_dim.clone());
    b_shape.push(out_shape[r - 1].clone());
    // Prologue = members upstream of the anchor; the sibling product; epilogue = the rest.
    let prologue = crate::group::prologue_of(g, anchor, |i| members.contains(i));
    let siblings = crate::group::matmul_siblings(g, anchor, members);
    let epilogue: Vec<NodeId> = members
        .iter()
        .copied()
        .filter(|m| *m != anchor && !prologue.contains(m) && !siblings.contains(m))
        .collect();
    let mut spa = Space { tag: "a", shape: a_shape, accesses: BTreeMap::new() };
    let split = crate::kernels::matmul::natural_epilogue(g, anchor, &epilogue, members)
        .expect("a matmul kernel's epilogue was checked");
    let spo_shape = split.as_ref().map_or(out_shape.clone(), |(_, s)| s.space.clone());
    let mut spo = Space { tag: "o", shape: spo_shape, accesses: BTreeMap::new() };
    access_operands(em, &mut spa, prologue.iter().copied(), members);
    if !members.contains(&a_in) {
        em.access(&mut spa, a_in);
    }
    let mut products = vec![Product::new(em, anchor, &b_shape, "b")];
    for s in siblings {
        products.push(Product::new(em, s, &b_shape, "bs"));
    }
    match &split {
        None => access_operands(em, &mut spo, epilogue.iter().copied(), members),
        Some((view, ns)) => split_accesses(em, &mut spo, (*view, ns), &epilogue, members, outputs),
    }
    // A of f32 with contiguous rows and no prologue is read in place by the micro-kernel.
    let a_direct =
        prologue.is_empty() && g.node(a_in).dtype.is_compute() && !em.strided_cols(&spa, a_in);
    let m_dim = out_shape[r - 2].clone();
    let over_batch =
        products.iter().all(|p| rows_over_batch(g, &p.packed, &batch, &m_dim, a_direct, a_in));
    let (loop_batch, loop_m) = if over_batch {
        (DimExpr::constant(1), numel(&batch).mul(&m_dim))
    } else {
        (numel(&batch), m_dim)
    };
    MatmulPart {
        a_in,
        products,
        out_shape,
        k_dim,
        batch,
        prologue,
        epilogue,
        spa,
        spo,
        a_direct,
        loop_batch,
        loop_m,
        split,
    }
}

/// The accesses of an epilogue computed in a natural split (`spo` its space): every operand
/// read from memory and every output member (for its store), each in the
/// permuted view the members compute in; the view of the product itself is read from C.
fn split_accesses(
    em: &mut Emitter,
    spo: &mut Space,
    (view, ns): (NodeId, &crate::group::NaturalSplit),
    epilogue: &[NodeId],
    members: &BTreeSet<NodeId>,
    outputs: &BTreeSet<NodeId>,
) {
    let g = em.g;
    for &m in epilogue {
        if let Op::CacheWrite { .. } = g.node(m).op {
            // Stored at its cache rows (`split_cache_rows`); the cache itself is not read.
            let new = g.node(m).inputs[1];
            if new != view && !members.contains(&new) {
                em.access_permuted(spo, new, &ns.perm);
            }
            continue;
        }
        for &i in &g.node(m).inputs {
            if i != view && !members.contains(&i) && !matches!(g.node(i).op, Op::Const { .. }) {
                em.access_permuted(spo, i, &ns.perm);
            }
        }
        if outputs.contains(&m) {
            em.access_permuted(spo, m, &ns.perm);
        }
    }
}

/// Whether the batch can be walked as more rows of one matrix (M = batch x M): B is a weight
/// broadcast over every batch axis, so `x: [B, S, D] @ w: [D, N]` is one `[B*S, D] x [D, N]`
/// product. Tiles of `MC` rows then span batch elements: fewer partial micro-tiles when S is
/// small and each packed sliver of B serves more rows. A and C rows are found row by row
/// (`row_prologue`) except A read in place, which must then be one run of rows.
fn rows_over_batch(
    g: &crate::ir::Graph,
    packed: &Option<(usize, DType, String)>,
    batch: &Shape,
    m: &DimExpr,
    a_direct: bool,
    a_in: NodeId,
) -> bool {
    let one_b = matches!(packed, Some((_, _, index)) if index == "0");
    if batch.is_empty() || !one_b {
        return false;
    }
    if !a_direct {
        return true;
    }
    let r = batch.len() + 2;
    let strides = crate::layout::space_strides(&resolve(g, a_in), &g.node(a_in).shape, r);
    // Each batch axis steps over whole runs of the axes after it.
    let mut run = strides[r - 2].mul(m);
    for d in (0..r - 2).rev() {
        if strides[d] != run {
            return false;
        }
        run = run.mul(&batch[d]);
    }
    true
}

/// One matmul with its prologue and epilogue; its work units start at `hoff` in the block
/// numbering. Returns (batch, m, n, k).
pub(crate) fn gen_matmul_part(
    em: &mut Emitter,
    anchor: NodeId,
    members: &BTreeSet<NodeId>,
    outputs: &BTreeSet<NodeId>,
    body: &mut Code,
) -> PartWork {
    let mp = matmul_part(em, anchor, members, outputs);
    let em: &Emitter = em;
    matmul_setup(em, &mp, body);
    body.block("for (int64_t u = u0; u < u1; ++u)", |c| {
        c.line("const int64_t bi = u / (mt * nt), mi = (u / nt) % mt, ni = u % nt;");
        c.line("const int64_t m0 = mi * MC, n0 = ni * NC, mlen = af_min64(MC, M - m0), nlen = af_min64(NC, N - n0);");
        for i in 0..mp.products.len() {
            let cc = Product::c_block(i);
            c.line(format!("if (K <= 0) memset({cc}, 0, sizeof(float) * (size_t)(mlen * LDC));"));
        }
        k_blocks(em, &mp, members, c);
        // Epilogue while storing C.
        store_c(em, &mp, members, outputs, c);
    });
    let r = mp.out_shape.len();
    // An epilogue walking heads needs C blocks of whole heads.
    let nc_step =
        mp.split.map_or(DimExpr::constant(1), |(_, s)| s.space[s.space.len() - 1].clone());
    PartWork {
        batch: mp.loop_batch,
        m: mp.loop_m,
        n: mp.out_shape[r - 1].clone(),
        k: mp.k_dim,
        products: mp.products.len() as u32,
        nc_step,
    }
}

/// The work of one matmul part as its loops walk it (`Work::MatMul`'s fields).
pub(crate) struct PartWork {
    pub(crate) batch: DimExpr,
    pub(crate) m: DimExpr,
    pub(crate) n: DimExpr,
    pub(crate) k: DimExpr,
    pub(crate) products: u32,
    pub(crate) nc_step: DimExpr,
}

/// The sizes, tiling, micro-kernel, scratch layout and work units of a matmul part.
pub(crate) fn matmul_setup(em: &Emitter, mp: &MatmulPart, c: &mut Code) {
    let r = mp.out_shape.len();
    let bt = em.dim(&mp.loop_batch);
    let (m_e, n_e, k_e) = (em.dim(&mp.loop_m), em.dim(&mp.out_shape[r - 1]), em.dim(&mp.k_dim));
    if mp.loop_batch != numel(&mp.batch) {
        c.line("/* one B for every batch index: the batch is walked as more rows */");
    }
    c.line(format!("const int64_t BATCH = {bt}, M = {m_e}, N = {n_e}, K = {k_e};"));
    c.line("const int64_t MC = t->mc, NC = t->nc, KC = t->kc;");
    c.line("const af_isa_info isa = af_isa();");
    c.line("const int64_t MR = isa.mr, NR = isa.nr;");
    for (i, p) in mp.products.iter().enumerate() {
        if let Some((slot, dt, _)) = &p.packed {
            let t = ctype(*dt);
            let what = if dt.is_compute() { "B".into() } else { format!("B ({} bits)", dt.name()) };
            let bpk = packed_b(i);
            c.line(format!("const {t} *restrict {bpk} = (const {t} *)bufs[{slot}]; /* {what} of `{}`, packed once per weight tensor */", em.g.node(p.node).name));
        }
    }
    if mp.products.iter().any(|p| p.packed.is_some()) {
        c.line("const int64_t nsl = (N + NR - 1) / NR;");
    }
    c.line("float *Ap = scratch, *Ar = Ap + (MC + AF_MR_MAX) * KC, *Bs = Ar + KC, *Cc = Bs + KC * AF_NR_MAX;");
    c.line("const int64_t LDC = NC + 16; /* C block rows padded by a cache line: no 4 KiB aliasing between rows */");
    for i in 1..mp.products.len() {
        let (cc, prev) = (Product::c_block(i), Product::c_block(i - 1));
        c.line(format!(
            "float *{cc} = {prev} + MC * LDC; /* the C block of `{}` */",
            em.g.node(mp.products[i].node).name
        ));
    }
    c.line("(void)Ar;");
    c.line(
        "const int64_t mt = (M + MC - 1) / MC, nt = (N + NC - 1) / NC, units = BATCH * mt * nt;",
    );
    c.line("const int64_t ub = block * t->rows_per_block - hoff, u0 = ub < 0 ? 0 : ub, u1 = af_min64(units, ub + t->rows_per_block);");
}

/// The K blocks of one tile of C: A read in place or packed, B's slivers, the micro-kernel.
pub(crate) fn k_blocks(em: &Emitter, mp: &MatmulPart, members: &BTreeSet<NodeId>, c: &mut Code) {
    if mp.a_direct {
        let a = mp.spa.accesses[&mp.a_in];
        c.line("/* A read in place (f32, contiguous rows): no packing */");
        em.row_prologue(&mp.spa, "bi * M + m0", c);
        c.line(format!(
            "const float *Ab = in{} + ac{a}_row;",
            em.buf[&resolve(em.g, mp.a_in).base]
        ));
        c.line(format!("const int64_t lda = ac{a}_s{};", mp.out_shape.len() - 2));
    }
    c.block("for (int64_t k0 = 0; k0 < K; k0 += KC)", |c| {
        c.line("const int64_t klen = af_min64(KC, K - k0);");
        if !mp.a_direct {
            // Pack A in slivers of MR rows, applying the prologue once per row of the block.
            pack_a(em, mp, members, c);
        }
        // Each product's slivers of B against the block of A (packed once for all).
        for (i, p) in mp.products.iter().enumerate() {
            if i > 0 {
                c.line(format!("/* the sibling product `{}` */", em.g.node(p.node).name));
            }
            b_slivers(em, mp, i, c);
        }
    });
}

/// The slivers of product `i`'s B over the tile's columns, each through the micro-kernel
/// into the product's C block.
fn b_slivers(em: &Emitter, mp: &MatmulPart, i: usize, c: &mut Code) {
    let p = &mp.products[i];
    let cc = Product::c_block(i);
    c.block("for (int64_t jr = 0; jr < nlen; jr += NR)", |c| {
        c.line("const int64_t nr = af_min64(NR, nlen - jr);");
        if let Some((_, dt, pbi)) = &p.packed {
            // NC is a multiple of NR_MAX (or N has one tile), so n0 + jr starts a sliver.
            let t = ctype(*dt);
            let bpk = packed_b(i);
            c.line(format!(
                "const {t} *restrict bsl = {bpk} + (({pbi} * nsl + (n0 + jr) / NR) * K + k0) * NR;"
            ));
        } else {
            c.line("/* pack one sliver of B */");
            b_sliver(em, &p.spb, p.b_in, ("k0", "klen"), "n0 + jr", "Bs", false, c);
        }
        let asrc = if mp.a_direct { "Ab + ir * lda + k0, lda, 1" } else { "Ap + ir * klen, 1, MR" };
        let tiles = "for (int64_t ir = 0; ir < mlen; ir += MR)";
        let call = |uk: &str, b: &str| format!("isa.{uk}(klen, {asrc}, {b}, {cc} + ir * LDC + jr, LDC, af_min64(MR, mlen - ir), nr, k0 > 0);");
        match &p.packed {
            None => nested_loops(c, &[tiles], &call("uk", "Bs")),
            Some((_, dt, _)) => widen_or_direct(*dt, tiles, &call, c),
        }
    });
}

/// The packed B of product `i` in the kernel (`Bpk`, `Bpk1`).
fn packed_b(i: usize) -> String {
    numbered("Bpk", i)
}

/// The C name of product `i`'s `base` variable: the anchor's unnumbered, as before siblings.
fn numbered(base: &str, i: usize) -> String {
    if i == 0 {
        base.into()
    } else {
        format!("{base}{i}")
    }
}

/// The micro-kernel calls on a sliver of a 16-bit weight: several row tiles reuse the sliver,
/// so it is widened once into `Bs` for the f32 kernel; a single tile (decode) lets the kernel
/// widen B as it loads it, reading half the bytes.
pub(crate) fn widen_or_direct(
    dt: DType,
    tiles: &str,
    call: &dyn Fn(&str, &str) -> String,
    c: &mut Code,
) {
    let (uk16, widen) = match dt {
        // Packed as the kernel reads it: nothing to widen.
        DType::F32 => return nested_loops(c, &[tiles], &call("uk", "bsl")),
        DType::F16 => ("uk_f16", "widen_f16"),
        DType::BF16 => ("uk_bf16", "widen_bf16"),
        DType::I64 | DType::I32 | DType::Bool => {
            unreachable!("matmul operands are floats (ir::infer)")
        }
    };
    let note = "widen the sliver once for the row tiles that share it";
    c.if_else(
        "mlen > MR",
        note,
        |c| {
            c.line(format!("isa.{widen}(bsl, Bs, klen * NR);"));
            nested_loops(c, &[tiles], &call("uk", "Bs"));
        },
        |c| {
            c.line("const int64_t ir = 0; /* one row tile */");
            c.line(call(uk16, "bsl"));
        },
    );
}

/// The loop packing the block of A in slivers of MR rows, with the prologue applied per row.
pub(crate) fn pack_a(em: &Emitter, mp: &MatmulPart, members: &BTreeSet<NodeId>, c: &mut Code) {
    let note = format!("pack A{}", if mp.prologue.is_empty() { "" } else { " with the prologue" });
    c.block_noted("for (int64_t m = 0; m < mlen; ++m)", &note, |c| {
        em.row_prologue(&mp.spa, "bi * M + m0 + m", c);
        c.line("float *ap = Ap + (m / MR) * MR * klen + m % MR;");
        let a_val = operand(em, &mp.spa, members, &|x| Some(em.var(x)), mp.a_in, "c");
        if mp.prologue.is_empty() {
            c.block("for (int64_t k = 0; k < klen; ++k)", |c| {
                c.line("const int64_t c = k0 + k;");
                c.line(format!("ap[k * MR] = {a_val};"));
            });
        } else {
            // A norm's row statistics first (over the whole row), then its apply.
            let stats = row_statistics(em, mp, members, c);
            // The members A's value is computed from at each column (past the statistics).
            let mut per_column = BTreeSet::new();
            let mut stack = vec![mp.a_in];
            while let Some(x) = stack.pop() {
                if mp.prologue.contains(&x) && !stats.contains(&x) && per_column.insert(x) {
                    stack.extend(em.g.node(x).inputs.iter().copied());
                }
            }
            // Compute the row contiguously (so it vectorises), then scatter it into the sliver.
            c.block("for (int64_t k = 0; k < klen; ++k)", |c| {
                c.line("const int64_t c = k0 + k;");
                for &m in members.iter().filter(|m| per_column.contains(m)) {
                    c.line(member_def(em, &mp.spa, members, &|x| Some(em.var(x)), m, "c"));
                }
                c.line(format!("Ar[k] = {a_val};"));
            });
            c.line("for (int64_t k = 0; k < klen; ++k) ap[k * MR] = Ar[k];");
        }
    });
}

/// The row statistics of a prologue with reductions (a norm's mean and rstd) for the row of A
/// being packed, over all K of its columns: per reduction loop of the rows schedule, the
/// full-width values the loop's reductions read (recomputed, nothing is buffered) into lane
/// partials, then the row values that become ready. Returns the members defined (the
/// reductions and row values); the packing loop computes the full-width rest per column.
/// Runs once per K block of the row (the pack does): the cost model counts K / KC passes.
fn row_statistics(
    em: &Emitter,
    mp: &MatmulPart,
    members: &BTreeSet<NodeId>,
    c: &mut Code,
) -> BTreeSet<NodeId> {
    use crate::kernels::rows::host::is_max_reduce;
    use crate::kernels::rows::host::{
        accumulate, lane_loops, lane_partials, lane_tree, reduce_result,
    };
    let g = em.g;
    let pro: Vec<NodeId> = members.iter().copied().filter(|m| mp.prologue.contains(m)).collect();
    if !pro.iter().any(|m| matches!(g.node(*m).op, Op::Reduce { .. })) {
        return BTreeSet::new();
    }
    let ph = crate::kernels::rows::RowPhases::of(g, &pro, &mp.spa.shape, []);
    let local = |x: NodeId| Some(em.var(x));
    let mut defined = BTreeSet::new();
    let row_values = |lvl: usize, c: &mut Code, defined: &mut BTreeSet<NodeId>| {
        for &m in pro.iter().filter(|m| ph.level.get(m) == Some(&lvl)) {
            if matches!(g.node(m).op, Op::Reduce { .. }) {
                c.line(reduce_result(em, m, "K"));
            } else {
                c.line(member_def(em, &mp.spa, members, &local, m, "0"));
            }
            defined.insert(m);
        }
    };
    c.line("/* the row's statistics, over all of its K columns */");
    row_values(0, c, &mut defined);
    for p in 0..ph.n_loops {
        let reds = ph.reductions_in(p);
        if reds.is_empty() {
            continue;
        }
        // The full-width members these reductions read, recomputed at each column.
        let mut need = BTreeSet::new();
        let mut stack: Vec<NodeId> = reds.iter().map(|r| g.node(*r).inputs[0]).collect();
        while let Some(x) = stack.pop() {
            if ph.phase.contains_key(&x) && mp.prologue.contains(&x) && need.insert(x) {
                stack.extend(g.node(x).inputs.iter().copied());
            }
        }
        let (mut lb, mut lt) = (Code::new(), Code::new());
        for &m in pro.iter().filter(|m| need.contains(m)) {
            let def = member_def(em, &mp.spa, members, &local, m, "c");
            lb.line(def.clone());
            lt.line(def);
        }
        for &r in &reds {
            let x = operand(em, &mp.spa, members, &local, g.node(r).inputs[0], "c");
            accumulate(g, r, &x, &mut lb, &mut lt);
        }
        lane_partials(g, &reds, c);
        lane_loops(g, (p, "K"), &reds, &lb, &lt, c);
        for &r in &reds {
            c.line(format!("const float acc{} = {};", r.0, lane_tree(r, is_max_reduce(g, r))));
        }
        row_values(p + 1, c, &mut defined);
    }
    defined
}

/// The loop storing the tile of C, with the epilogue applied on the way.
pub(crate) fn store_c(
    em: &Emitter,
    mp: &MatmulPart,
    members: &BTreeSet<NodeId>,
    outputs: &BTreeSet<NodeId>,
    c: &mut Code,
) {
    if let Some((view, ns)) = &mp.split {
        store_c_split(em, mp, (*view, ns), members, outputs, c);
        return;
    }
    let g = em.g;
    let note = format!("store C{}", if mp.epilogue.is_empty() { "" } else { " with the epilogue" });
    c.block_noted("for (int64_t m = 0; m < mlen; ++m)", &note, |c| {
        em.row_prologue(&mp.spo, "bi * M + m0 + m", c);
        c.line("const int64_t orow = (bi * M + m0 + m) * N;");
        c.block("for (int64_t n = 0; n < nlen; ++n)", |c| {
            c.line("const int64_t c = n0 + n;");
            // The anchor's product, then its sibling's, each from its own C block.
            for (i, p) in mp.products.iter().enumerate() {
                let acc =
                    round_to(g.node(p.node).dtype, format!("{}[m * LDC + n]", Product::c_block(i)));
                c.line(format!(
                    "const float {} = {acc}; /* {} */",
                    em.var(p.node),
                    g.node(p.node).name
                ));
                if outputs.contains(&p.node) {
                    c.line(store_out(em, p.node, "orow + c"));
                }
            }
            for &m in &mp.epilogue {
                c.line(member_def(em, &mp.spo, members, &|x| Some(em.var(x)), m, "c"));
                if outputs.contains(&m) {
                    c.line(store_out(em, m, "orow + c"));
                }
            }
        });
    });
}

/// `store_c` for an epilogue computed in a natural split of the product (RoPE on heads):
/// each row of the C block is walked head by head (`W` columns each, the split's last
/// extent; the blocking keeps NC a multiple of it), each head a row of the split's space, so
/// every operand's offset is affine in the column `d` again. The view of the product is the
/// C block; `rotate_half` of it reads its partner column in the same head of the block.
fn store_c_split(
    em: &Emitter,
    mp: &MatmulPart,
    (view, ns): (NodeId, &crate::group::NaturalSplit),
    members: &BTreeSet<NodeId>,
    outputs: &BTreeSet<NodeId>,
    c: &mut Code,
) {
    let g = em.g;
    let anchor = mp.products[0].node;
    let dt = g.node(anchor).dtype;
    let width = em.dim(ns.space.last().expect("a split has axes"));
    let last = ns.space.len() - 1;
    for &m in mp.epilogue.iter().filter(|m| matches!(g.node(**m).op, Op::CacheWrite { .. })) {
        let cache = em.buf[&g.node(m).inputs[0]];
        c.line(format!(
            "(void)in{cache}; /* the cache, written in place through out{} */",
            em.buf[&m]
        ));
    }
    c.block_noted(
        "for (int64_t m = 0; m < mlen; ++m)",
        "store C with the epilogue, head by head",
        |c| {
            c.line(format!("const int64_t W = {width}, H = N / W;"));
            c.block("for (int64_t h = n0 / W; h < (n0 + nlen) / W; ++h)", |c| {
                em.row_prologue(&mp.spo, "(bi * M + m0 + m) * H + h", c);
                split_cache_rows(em, mp, ns, c);
                c.line("const float *Ch = Cc + m * LDC + (h * W - n0);");
                c.block("for (int64_t d = 0; d < W; ++d)", |c| {
                    let acc = round_to(dt, "Ch[d]".into());
                    c.line(format!(
                        "const float {} = {acc}; /* {} */",
                        em.var(view),
                        g.node(view).name
                    ));
                    if outputs.contains(&anchor) {
                        c.line(format!("const float {} = {};", em.var(anchor), em.var(view)));
                        c.line(store_out(em, anchor, "(bi * M + m0 + m) * N + h * W + d"));
                    }
                    let local = |x: NodeId| Some(em.var(x));
                    let mut known = members.clone();
                    known.insert(view);
                    for &m in &mp.epilogue {
                        let n = g.node(m);
                        if n.op == Op::RotateHalf && n.inputs[0] == view {
                            let p = "(d < W / 2 ? d + W / 2 : d - W / 2)";
                            let x = round_to(dt, format!("Ch[{p}]"));
                            c.line(format!(
                                "const float {} = d < W / 2 ? -({x}) : ({x}); /* {} */",
                                em.var(m),
                                n.name
                            ));
                        } else {
                            c.line(member_def(em, &mp.spo, &known, &local, m, "d"));
                        }
                        if let Op::CacheWrite { .. } = n.op {
                            // The new rows go straight to their cache row (`split_cache_rows`).
                            c.line(store_out(em, m, &format!("cw{} + d", m.0)));
                        } else if outputs.contains(&m) {
                            let a = mp.spo.accesses[&m];
                            c.line(store_out(em, m, &format!("ac{a}_row + d * ac{a}_s{last}")));
                        }
                    }
                });
            });
        },
    );
}

/// The cache row (`cw<m>`) of each cache write of a split epilogue for the current head row:
/// the new rows' axis `i` is the split space's axis `perm[i]` (`o_i<perm[i]>`).
fn split_cache_rows(em: &Emitter, mp: &MatmulPart, ns: &crate::group::NaturalSplit, c: &mut Code) {
    let g = em.g;
    for &m in &mp.epilogue {
        if let Ok(w) = crate::kernels::cache_write::Write::at(g, m) {
            let index = |d: usize| format!("{}_i{}", mp.spo.tag, ns.perm[d]);
            c.line(format!(
                "const int64_t cw{} = {};",
                m.0,
                w.cache_row_at(g, &|d| em.dim(d), &index)
            ));
        }
    }
}

/// Code writing rows `k0 .. k0 + klen` of B's NR columns from `col0` into the sliver `dst`
/// (`dst[k * NR + j]`, columns past `nr` zero), in the space `sp` of B (batch + [K, N], row
/// index `bi * K + k`). A transposed view is walked column by column, K inside (along memory).
/// With `bits`, a 16-bit B is copied as its bits into a `uint16_t` sliver (zero is +0 there
/// too); otherwise the sliver is f32.
#[allow(clippy::too_many_arguments)]
pub(crate) fn b_sliver(
    em: &Emitter,
    sp: &Space,
    b: NodeId,
    (k0, klen): (&str, &str),
    col0: &str,
    dst: &str,
    bits: bool,
    c: &mut Code,
) {
    let k = if k0 == "0" { "k".to_string() } else { format!("{k0} + k") };
    let (t, zero) = if bits { ("uint16_t", "0") } else { ("float", "0.0f") };
    if em.strided_cols(sp, b) {
        em.row_prologue(sp, "bi * K", c);
        let (kk, col) = (k.as_str(), format!("{col0} + j"));
        let value =
            if bits { em.read_inner_bits(sp, b, kk, &col) } else { em.read_inner(sp, b, kk, &col) };
        c.block("for (int64_t j = 0; j < NR; ++j)", |c| {
            c.line(format!("if (j >= nr) {{ for (int64_t k = 0; k < {klen}; ++k) {dst}[k * NR + j] = {zero}; continue; }}"));
            c.line(format!("for (int64_t k = 0; k < {klen}; ++k) {dst}[k * NR + j] = {value};"));
        });
    } else {
        let col = format!("{col0} + j");
        let value = if bits { em.read_bits(sp, b, &col) } else { em.read(sp, b, &col) };
        c.block(format!("for (int64_t k = 0; k < {klen}; ++k)"), |c| {
            em.row_prologue(sp, &format!("bi * K + {k}"), c);
            c.line(format!("{t} *restrict row = {dst} + k * NR;"));
            c.line(format!("for (int64_t j = 0; j < nr; ++j) row[j] = {value};"));
            c.line(format!("for (int64_t j = nr; j < NR; ++j) row[j] = {zero};"));
        });
    }
}

/// The pack function of matmul operand `b_in` (shape `b_shape` = batch + [K, N]), read from a
/// parameter: appended to `em.packs`; returns the `bufs` slot the kernel finds it in. The
/// packed elements keep the parameter's dtype (a 16-bit weight is copied as its bits).
pub(crate) fn pack_b(em: &mut Emitter, b_shape: &Shape, b_in: NodeId) -> (usize, String) {
    let g = em.g;
    let j = em.packs.len();
    let slot = em.buf.len() + j;
    let func = format!("{}_pack{j}", em.kname);
    let param = resolve(g, b_in).base;
    let r = b_shape.len();
    // What the packed copy holds, so the runtime can share it between kernels and modules.
    let view = resolve(g, b_in);
    let strides = crate::layout::space_strides(&view, &g.node(b_in).shape, r);
    let kept = PackedBatch::of(b_shape, &strides);
    let batch = numel(&kept.extents());
    let mut pe = Emitter::new(g, em.buf.clone(), &func);
    let mut sp = Space { tag: "b", shape: b_shape.clone(), accesses: BTreeMap::new() };
    pe.access(&mut sp, b_in);
    let b = em.buf[&param];
    let dtype = g.node(param).dtype;
    let (t, bits) = (ctype(dtype), !dtype.is_compute());
    let mut head = Code::at_depth(1);
    head.line("(void)dims; (void)scratch;");
    head.line(format!(
        "const {t} *restrict in{b} = (const {t} *)bufs[{b}]; /* {} */",
        g.node(param).name
    ));
    head.line(format!("{t} *restrict dst = ({t} *)bufs[{slot}];"));
    let mut body = Code::at_depth(1);
    body.line(format!(
        "const int64_t BATCH = {}, K = {}, N = {};",
        pe.dim(&batch),
        pe.dim(&b_shape[r - 2]),
        pe.dim(&b_shape[r - 1])
    ));
    body.line("const int64_t NR = af_isa().nr, nsl = (N + NR - 1) / NR, ng = (N + AF_NR_MAX - 1) / AF_NR_MAX;");
    body.line("const int64_t g0 = block * t->rows_per_block, g1 = af_min64(t->units, g0 + t->rows_per_block);");
    body.line("(void)BATCH;");
    let group = "a group of NR_MAX columns of one matrix";
    body.block_noted("for (int64_t gi = g0; gi < g1; ++gi)", group, |c| {
        if kept.all_kept() {
            c.line("const int64_t bi = gi / ng, c0 = (gi % ng) * AF_NR_MAX, c1 = af_min64(N, c0 + AF_NR_MAX);");
        } else {
            c.line("/* B's broadcast batch axes are packed once: matrix pbi of the copy is matrix bi of B */");
            c.line("const int64_t pbi = gi / ng, c0 = (gi % ng) * AF_NR_MAX, c1 = af_min64(N, c0 + AF_NR_MAX);");
            c.line(format!("const int64_t bi = {};", kept.full_index(&pe, "pbi")));
        }
        let pbi = if kept.all_kept() { "bi" } else { "pbi" };
        c.block("for (int64_t j0 = c0; j0 < c1; j0 += NR)", |c| {
            c.line("const int64_t nr = af_min64(NR, N - j0);");
            c.line(format!("{t} *restrict ds = dst + ({pbi} * nsl + j0 / NR) * K * NR;"));
            b_sliver(&pe, &sp, b_in, ("0", "K"), "j0", "ds", bits, c);
        });
    });
    let mut c = Code::new();
    let elems = if bits { format!("{} bits", dtype.name()) } else { "f32".into() };
    c.line(format!("/* {func}: B of {} (`{}`), packed once per weight tensor as {elems} in slivers of NR columns", em.kname, g.node(param).name));
    c.line(
        " * (the micro-kernel's B layout); the runtime reruns it only when another tensor is passed. */",
    );
    c_function(
        &mut c,
        &format!("AF_CLONES static void {func}{KERNEL_PARAMS}"),
        &[&head, &pe.decls, &body],
    );
    c.line("");
    let index = kept.packed_index(em, "bi");
    let mut packed_strides: Vec<DimExpr> =
        kept.keep.iter().zip(&strides).filter(|(k, _)| **k).map(|(_, s)| s.clone()).collect();
    packed_strides.extend_from_slice(&strides[r - 2..]);
    let meta = PackMeta {
        func,
        param,
        dtype,
        batch,
        k: b_shape[r - 2].clone(),
        n: b_shape[r - 1].clone(),
        batch_dims: kept.extents(),
        offset: view.offset,
        strides: packed_strides,
    };
    em.packs.push((meta, c.finish()));
    (slot, index)
}

/// The batch axes of a packed B that hold distinct matrices. A weight read by a batched
/// matmul (`x: [B, S, D] @ w: [D, N]`) is broadcast over B (stride 0): it is packed once, not
/// once per batch index, and every batch index of the kernel reads that one copy.
struct PackedBatch {
    /// B's batch extents (the matmul's batch).
    extents: Vec<DimExpr>,
    /// Whether each batch axis is kept (its stride is not 0).
    keep: Vec<bool>,
}

impl PackedBatch {
    fn of(b_shape: &Shape, strides: &[DimExpr]) -> PackedBatch {
        let nb = b_shape.len() - 2;
        let zero = DimExpr::constant(0);
        PackedBatch {
            extents: b_shape[..nb].to_vec(),
            keep: strides[..nb].iter().map(|s| *s != zero).collect(),
        }
    }
    fn all_kept(&self) -> bool {
        self.keep.iter().all(|k| *k)
    }
    /// The extents of the packed copy's batch axes.
    fn extents(&self) -> Vec<DimExpr> {
        self.keep.iter().zip(&self.extents).filter(|(k, _)| **k).map(|(_, e)| e.clone()).collect()
    }
    /// C: the index of the packed matrix holding matmul batch index `bi` (flat over all axes).
    fn packed_index(&self, em: &Emitter, bi: &str) -> String {
        self.reindex(em, bi, |a| self.extents[a + 1..].to_vec(), |a| self.kept_after(a))
    }
    /// C: the matmul batch index (broadcast axes at 0) of packed matrix `pbi`.
    fn full_index(&self, em: &Emitter, pbi: &str) -> String {
        self.reindex(em, pbi, |a| self.kept_after(a), |a| self.extents[a + 1..].to_vec())
    }
    /// Extents of the kept axes after axis `a`.
    fn kept_after(&self, a: usize) -> Vec<DimExpr> {
        (a + 1..self.extents.len())
            .filter(|&b| self.keep[b])
            .map(|b| self.extents[b].clone())
            .collect()
    }
    /// Sum over kept axes `a` of (index `a` read from `from` with the place values `from_pv(a)`)
    /// times `to_pv(a)`.
    fn reindex(
        &self,
        em: &Emitter,
        from: &str,
        from_pv: impl Fn(usize) -> Vec<DimExpr>,
        to_pv: impl Fn(usize) -> Vec<DimExpr>,
    ) -> String {
        if self.all_kept() {
            return from.to_string();
        }
        let terms: Vec<String> = (0..self.extents.len())
            .filter(|&a| self.keep[a])
            .map(|a| {
                let idx = format!(
                    "(({from} / ({})) % ({}))",
                    em.dim(&numel(&from_pv(a))),
                    em.dim(&self.extents[a])
                );
                format!("{idx} * ({})", em.dim(&numel(&to_pv(a))))
            })
            .collect();
        if terms.is_empty() {
            "0".into()
        } else {
            terms.join(" + ")
        }
    }
}
