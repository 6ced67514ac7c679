//! Matmul kernels: Ascend C emission.

use crate::abi::Work;
use crate::codegen::ascend::cube::*;
use crate::codegen::ascend::vector::*;
use crate::codegen::emit::{Code, Emitter, Space};
use crate::dim::{numel, DimExpr, Shape};
use crate::ir::{DType, Graph, NodeId, Op};
use crate::layout::resolve;
use crate::plan::Group;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// The parts of a matmul group: `A [batch.., M, K]` by `B [batch.., K, N]`, the prologue
/// (the members A depends on) and the epilogue (the members after the product).
pub(crate) struct MatmulParts {
    pub(crate) anchor: NodeId,
    pub(crate) a_in: NodeId,
    pub(crate) b_in: NodeId,
    pub(crate) out_shape: Shape,
    pub(crate) batch: Shape,
    pub(crate) k_dim: DimExpr,
    pub(crate) pro_nodes: Vec<NodeId>,
    pub(crate) epi_nodes: Vec<NodeId>,
    /// The sibling product the epilogue reads (`group::matmul_siblings`), if any.
    pub(crate) sibling: Option<NodeId>,
}

impl MatmulParts {
    pub(crate) fn new(g: &Graph, grp: &Group) -> MatmulParts {
        let anchor = grp.anchor.expect("matmul group has an anchor");
        MatmulParts::of(g, anchor, &grp.nodes)
    }
    /// The parts of the matmul at `anchor` among `nodes` (in the group's order).
    pub(crate) fn of(g: &Graph, anchor: NodeId, nodes: &[NodeId]) -> MatmulParts {
        let members: BTreeSet<NodeId> = nodes.iter().copied().collect();
        let out_shape = g.node(anchor).shape.clone();
        let r = out_shape.len();
        let (a_in, b_in) = (g.node(anchor).inputs[0], g.node(anchor).inputs[1]);
        let k_dim = g.node(a_in).shape.last().unwrap().clone();
        let batch: Shape = out_shape[..r - 2].to_vec();
        let prologue = crate::group::prologue_of(g, anchor, |i| members.contains(i));
        let sibling = crate::group::matmul_siblings(g, anchor, &members).first().copied();
        let pro_nodes: Vec<NodeId> =
            nodes.iter().copied().filter(|m| prologue.contains(m)).collect();
        let epi_nodes: Vec<NodeId> = nodes
            .iter()
            .copied()
            .filter(|m| *m != anchor && !prologue.contains(m) && Some(*m) != sibling)
            .collect();
        MatmulParts { anchor, a_in, b_in, out_shape, batch, k_dim, pro_nodes, epi_nodes, sibling }
    }
    /// `[batch.., x, y]`.
    pub(crate) fn with(&self, x: DimExpr, y: DimExpr) -> Shape {
        let mut s = self.batch.clone();
        s.push(x);
        s.push(y);
        s
    }
    pub(crate) fn m(&self) -> DimExpr {
        self.out_shape[self.out_shape.len() - 2].clone()
    }
    pub(crate) fn n(&self) -> DimExpr {
        self.out_shape[self.out_shape.len() - 1].clone()
    }
}

/// The product's sizes and its count of `MC x NC` output tiles (`units`).
pub(crate) fn product_dims(em: &Emitter, mp: &MatmulParts, c: &mut Code) {
    let _ = writeln!(
        c,
        "const int64_t BATCH = {}, M = {}, N = {}, K = {};",
        em.dim(&numel(&mp.batch)),
        em.dim(&mp.m()),
        em.dim(&mp.n()),
        em.dim(&mp.k_dim)
    );
    c.line(
        "const int64_t mt = (M + MC - 1) / MC, nt = (N + NC - 1) / NC, units = BATCH * mt * nt;",
    );
}

/// Returns the work, whether A and B are staged in the user workspace, and the element type
/// the cube reads them in.
pub(crate) fn gen_matmul(k: &mut K, grp: &Group) -> (Work, bool, bool, DType) {
    let mp = MatmulParts::new(k.em.g, grp);
    k.setup.line("const int64_t MC = t.mc, NC = t.nc;");
    product_dims(&k.em, &mp, &mut k.setup);
    user_workspace(&mut k.setup);
    let cube = cube_type(k.em.g, mp.a_in, mp.b_in);
    let a = matmul_operand_a(k, &mp, cube);
    let b = matmul_operand_b(k, &mp, cube);
    // The sibling's B, in the same type (staged when its own is another).
    let bs = mp.sibling.map(|s| {
        let sp = space("bs", mp.with(mp.k_dim.clone(), mp.n()));
        operand(k, sp, k.em.g.node(s).inputs[1], "BATCH * K", "N", cube)
    });
    let epi = matmul_epilogue(k, &grp.nodes, &grp.outputs, &mp);
    let c = &mut k.setup;
    c.line("AscendC::tiling::TCubeTiling ct;");
    c.line("af_cube_tiling(t, 0, ct);");
    c.line(matmul_object("mm", a.trans, b.trans, cube));
    match &bs {
        None => {
            c.line("REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm, &ct); /* the AIC serves the AIVs' calls, then returns */");
        }
        Some(bs) => {
            // The sibling's product has its own object (B's layout is a type parameter),
            // with the same tiling: the two take turns on the cube.
            c.line(matmul_object("mm1", a.trans, bs.trans, cube));
            c.line("REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm, &ct, mm1, &ct); /* the AIC serves both, then returns */");
        }
    }
    let staged_b = b.staged || bs.as_ref().is_some_and(|o| o.staged);
    if a.staged || staged_b {
        sync_staged(&mut k.body);
    }
    let tiles = Tiles { obj: "mm", first_unit: "aiv", c_at: "stage", end_each: bs.is_some() };
    matmul_tiles(k, &tiles, &a, &b, bs.as_ref(), &epi);
    if bs.is_none() {
        k.body.line("mm.End();");
    }
    let products = 1 + u32::from(mp.sibling.is_some());
    let nc_step = epi.nc_step();
    let (batch, m, n) = (numel(&mp.batch), mp.m(), mp.n());
    let work = Work::MatMul { batch, m, n, k: mp.k_dim, products, nc_step };
    (work, a.staged, staged_b, cube)
}

/// Operand A: read in place when the Matmul API can address it, else staged by the AIVs as
/// contiguous rows `wa` of the cube's element type (the norm prologue applied once per row,
/// or the operand copied).
pub(crate) fn matmul_operand_a(k: &mut K, mp: &MatmulParts, cube: DType) -> Operand {
    let g = k.em.g;
    let a_in = mp.a_in;
    let mut spa = space("a", mp.with(mp.m(), mp.k_dim.clone()));
    if mp.pro_nodes.is_empty() {
        k.em.access(&mut spa, a_in);
        if let Some((trans, ld)) = mm_layout(&k.em, &spa, a_in, cube) {
            return Operand { v: a_in, sp: spa, trans, ld, staged: false, ty: cube };
        }
    }
    // Stage A = the prologue's output (or the operand itself) as contiguous f32 rows.
    let mut srcs = BTreeMap::new();
    let pro_members: BTreeSet<NodeId> = mp.pro_nodes.iter().copied().collect();
    for i in ext_inputs(g, &mp.pro_nodes, &pro_members) {
        let s = k.src(&mut spa, i, "0");
        srcs.insert(i, s);
    }
    rotated_sources(k, &mut spa, &mp.pro_nodes, "(K / 2)", &mut srcs);
    if mp.pro_nodes.is_empty() {
        let s = k.src(&mut spa, a_in, "0");
        srcs.insert(a_in, s);
    }
    // The staged value: the prologue's last member (= a_in) or the operand through a copy.
    let job = Job {
        g,
        gathers: BTreeMap::new(),
        space: spa.shape.clone(),
        nodes: mp.pro_nodes.clone(),
        srcs,
        outs: vec![(a_in, "wa".into(), "ra * K".into(), cube)],
        // A prologue may hold a causal mask (a softmax before P V): the row's index in its
        // last two axes, as in a rows kernel.
        row_i: match spa.shape.len() {
            r if r >= 2 => format!("a_i{}", r - 2),
            _ => "0".into(),
        },
        causal_shift: causal_shift(&k.em, &mp.pro_nodes),
        col0: "0".into(),
        ncols: "K".into(),
        tag: "a".into(),
    };
    let c = &mut k.body;
    let what = if mp.pro_nodes.is_empty() {
        "a view the Matmul API cannot address"
    } else {
        "the norm prologue applied once per row"
    };
    let _ = writeln!(
        c,
        "/* stage A ({what}) as contiguous {} rows in the user workspace */",
        ascend_type(cube)
    );
    stage_decl(c, "wa", cube, "BATCH * M * K");
    c.open("for (int64_t ra = aiv; ra < BATCH * M; ra += naiv)");
    row_offsets(&k.em, &spa, "ra", c);
    if mp.pro_nodes.is_empty() {
        copy_row(&mut k.ub, &job, a_in, c);
    } else {
        job.emit(&mut k.ub, c);
    }
    c.close();
    stage_advance(c, cube, "BATCH * M * K");
    Operand { v: a_in, sp: spa, trans: false, ld: "K".into(), staged: true, ty: cube }
}

/// Operand B: read in place when the Matmul API can address it, else copied by the AIVs as
/// contiguous rows `wb` of the cube's element type.
pub(crate) fn matmul_operand_b(k: &mut K, mp: &MatmulParts, cube: DType) -> Operand {
    let b_in = mp.b_in;
    let mut spb = space("b", mp.with(mp.k_dim.clone(), mp.n()));
    k.em.access(&mut spb, b_in);
    if let Some((trans, ld)) = mm_layout(&k.em, &spb, b_in, cube) {
        return Operand { v: b_in, sp: spb, trans, ld, staged: false, ty: cube };
    }
    let mut srcs = BTreeMap::new();
    let s = k.src(&mut spb, b_in, "0");
    srcs.insert(b_in, s);
    let job = Job {
        g: k.em.g,
        gathers: BTreeMap::new(),
        space: spb.shape.clone(),
        nodes: vec![],
        srcs,
        outs: vec![(b_in, "wb".into(), "rb * N".into(), cube)],
        row_i: "0".into(),
        causal_shift: "0".into(),
        col0: "0".into(),
        ncols: "N".into(),
        tag: "b".into(),
    };
    let c = &mut k.body;
    let _ = writeln!(
        c,
        "/* stage B (a view the Matmul API cannot address) as contiguous {} rows */",
        ascend_type(cube)
    );
    stage_decl(c, "wb", cube, "BATCH * K * N");
    c.open("for (int64_t rb = aiv; rb < BATCH * K; rb += naiv)");
    row_offsets(&k.em, &spb, "rb", c);
    copy_row(&mut k.ub, &job, b_in, c);
    c.close();
    stage_advance(c, cube, "BATCH * K * N");
    Operand { v: b_in, sp: spb, trans: false, ld: "N".into(), staged: true, ty: cube }
}

/// The epilogue of one product: the job applied to each row of a C tile, the output space
/// it reads in, and, when it computes in a natural split of the product (RoPE on heads), the
/// heads' width: each tile row is then walked head by head, one job row per head.
pub(crate) struct Epilogue<'g> {
    pub(crate) job: Job<'g>,
    pub(crate) spo: Space,
    pub(crate) heads: Option<DimExpr>,
}

impl Epilogue<'_> {
    /// What NC must be a multiple of (`Work::MatMul::nc_step`): the heads' width, else 1.
    pub(crate) fn nc_step(&self) -> DimExpr {
        self.heads.clone().unwrap_or_else(|| DimExpr::constant(1))
    }
}

/// The epilogue job over the output rows of one tile, and the output space it reads in.
pub(crate) fn matmul_epilogue<'g>(
    k: &mut K<'g>,
    nodes: &[NodeId],
    outputs: &[NodeId],
    mp: &MatmulParts,
) -> Epilogue<'g> {
    let g = k.em.g;
    let members: BTreeSet<NodeId> = nodes.iter().copied().collect();
    let split = super::natural_epilogue(g, mp.anchor, &mp.epi_nodes, &members)
        .expect("a matmul kernel's epilogue was checked");
    if let Some((view, ns)) = split {
        return split_epilogue(k, &members, outputs, mp, (view, &ns));
    }
    let mut spo = space("o", mp.out_shape.clone());
    let mut srcs = BTreeMap::new();
    for i in ext_inputs(g, &mp.epi_nodes, &members) {
        if i == mp.anchor {
            continue;
        }
        let s = k.src(&mut spo, i, "n0");
        srcs.insert(i, s);
    }
    srcs.insert(mp.anchor, Src::Row { gm: "wc".into(), off: "ti * NC".into(), d: DType::F32 });
    if let Some(s) = mp.sibling {
        srcs.insert(s, Src::Row { gm: "wc1".into(), off: "ti * NC".into(), d: DType::F32 });
    }
    let outs: Vec<(NodeId, String, String, DType)> = outputs
        .iter()
        .filter(|o| members.contains(o))
        .map(|o| (*o, k.gm(k.em.buf[o]), "orow * N + n0".to_string(), g.node(*o).dtype))
        .collect();
    // The sibling is a phase-0 source too (`epi_nodes` leaves it out).
    let mut nodes = mp.epi_nodes.clone();
    // The anchor is a phase-0 source; when it is itself an output it is copied out.
    if outputs.contains(&mp.anchor) {
        nodes.retain(|n| *n != mp.anchor);
    }
    let job = Job {
        g,
        gathers: BTreeMap::new(),
        space: mp.out_shape.clone(),
        nodes,
        srcs,
        outs,
        row_i: format!("o_i{}", mp.out_shape.len() - 2),
        causal_shift: causal_shift(&k.em, &mp.epi_nodes),
        col0: "n0".into(),
        ncols: "nlen".into(),
        tag: "o".into(),
    };
    Epilogue { job, spo, heads: None }
}

/// The epilogue of a product read through a natural split (`group::NaturalSplit`): the job
/// walks the split's space, one row per head of `W` columns (`hh`, the head of the tile row
/// `ti`), reading the view from the C tile (`rotate_half` of it at the partner column of the
/// same head), the other operands and the outputs through the view's permutation, and cache
/// writes at their cache rows.
fn split_epilogue<'g>(
    k: &mut K<'g>,
    members: &BTreeSet<NodeId>,
    outputs: &[NodeId],
    mp: &MatmulParts,
    (view, ns): (NodeId, &crate::group::NaturalSplit),
) -> Epilogue<'g> {
    let g = k.em.g;
    let mut spo = space("o", ns.space.clone());
    let mut srcs = BTreeMap::new();
    for i in ext_inputs(g, &mp.epi_nodes, members) {
        let written = crate::kernels::cache_write::only_written(g, members, i);
        if i == view || written {
            continue;
        }
        let s = k.src_permuted(&mut spo, i, "0", &ns.perm);
        srcs.insert(i, s);
    }
    let tile = Src::Row { gm: "wc".into(), off: "ti * NC + (hh * W - n0)".into(), d: DType::F32 };
    for &m in &mp.epi_nodes {
        let n = g.node(m);
        if n.op == Op::RotateHalf && n.inputs[0] == view {
            srcs.insert(m, tile.clone().rotated("(W / 2)"));
        }
    }
    srcs.insert(view, tile.clone());
    let mut outs = Vec::new();
    for &o in outputs.iter().filter(|o| members.contains(o)) {
        let at = match crate::kernels::cache_write::Write::at(g, o) {
            Ok(w) => {
                let index = |d: usize| format!("o_i{}", ns.perm[d]);
                w.cache_row_at(g, &|d| k.em.dim(d), &index)
            }
            Err(_) if o == mp.anchor => "orow * N + hh * W".to_string(),
            Err(_) => {
                let a = k.em.access_permuted(&mut spo, o, &ns.perm);
                format!("o_row{a}")
            }
        };
        outs.push((o, k.gm(k.em.buf[&o]), at, g.node(o).dtype));
    }
    if outputs.contains(&mp.anchor) {
        // The product itself is copied out as its view's rows are.
        srcs.insert(mp.anchor, tile);
    }
    // The rotations of the view stay members: their sources give their values (`chunk_loop`).
    let nodes = mp.epi_nodes.clone();
    let r = ns.space.len();
    let job = Job {
        g,
        gathers: BTreeMap::new(),
        // The members' own shape (the view's), which the phases compare them with; the rows
        // the job walks are the split's (`spo`).
        space: g.node(view).shape.clone(),
        nodes,
        srcs,
        outs,
        row_i: format!("o_i{}", r - 2),
        causal_shift: causal_shift(&k.em, &mp.epi_nodes),
        col0: "0".into(),
        ncols: "W".into(),
        tag: "o".into(),
    };
    let width = ns.space.last().expect("a split has axes").clone();
    Epilogue { job, spo, heads: Some(width) }
}

/// How a kernel walks one product's output tiles.
pub(crate) struct Tiles<'a> {
    /// The Matmul object computing the anchor's product.
    pub(crate) obj: &'a str,
    /// This AIV's first unit (the AIVs take units `first_unit, first_unit + naiv, ..`).
    pub(crate) first_unit: &'a str,
    /// Where the AIVs' C tiles start in the user workspace (floats).
    pub(crate) c_at: &'a str,
    /// Each product `End()`s its object: objects that take turns on the cube release it.
    pub(crate) end_each: bool,
}

/// This AIV's output tiles: the cube writes each `mlen x nlen` tile into the AIV's slice `wc`
/// of the user workspace, then the AIV applies the epilogue row by row.
pub(crate) fn matmul_tiles(
    k: &mut K,
    tiles: &Tiles,
    a: &Operand,
    b: &Operand,
    bs: Option<&Operand>,
    epi: &Epilogue,
) {
    let g = k.em.g;
    let c = &mut k.body;
    let at = tiles.c_at;
    let _ = writeln!(c, "AscendC::GlobalTensor<float> wc; wc.SetGlobalBuffer(uws + {at} + aiv * MC * NC, MC * NC); /* this AIV's C tile */");
    if bs.is_some() {
        let _ = writeln!(c, "AscendC::GlobalTensor<float> wc1; wc1.SetGlobalBuffer(uws + {at} + (naiv + aiv) * MC * NC, MC * NC); /* the sibling's C tile */");
    }
    c.open(format!("for (int64_t u = {}; u < units; u += naiv)", tiles.first_unit));
    // Consecutive units run at once on the cores: in column-panel order they share a B panel
    // (B leaves memory once, A is re-read from L2), in row-panel order an A panel.
    c.line("const int64_t bi = u / (mt * nt), tile = u % (mt * nt);");
    c.line("const int64_t mi = t.n_major ? tile % mt : tile / nt, ni = t.n_major ? tile / mt : tile % nt;");
    c.line("const int64_t m0 = mi * MC, n0 = ni * NC, mlen = af_min(MC, M - m0), nlen = af_min(NC, N - n0);");
    let ta = ascend_type(a.ty);
    if a.staged {
        let _ = writeln!(c, "AscendC::GlobalTensor<{ta}> ga = wa[(bi * M + m0) * K];");
    } else {
        row_offsets(&k.em, &a.sp, "bi * M + m0", c);
        let ac = a.sp.accesses[&a.v];
        let gb = format!("g{}", k.em.buf[&resolve(g, a.v).base]);
        let _ = writeln!(c, "AscendC::GlobalTensor<{ta}> ga = {gb}[a_row{ac}];");
    }
    product(c, &k.em, (tiles.obj, "wc", "gbm"), a, b, tiles.end_each);
    if let Some(bs) = bs {
        product(c, &k.em, ("mm1", "wc1", "gbs"), a, bs, true);
    }
    let scalar_reads_tile =
        epi.job.srcs.values().any(|s| matches!(s, Src::Gather { gm, .. } if gm == "wc"));
    if scalar_reads_tile {
        // `rotate_half` reads partner columns of the tile through the scalar unit's data
        // cache, which may hold lines of the previous tile (the cube wrote this one):
        // `docs/ascend-decode.md`, rule 8.
        c.line("AscendC::DataCacheCleanAndInvalid<float, AscendC::CacheLine::ENTIRE_DATA_CACHE, AscendC::DcciDst::CACHELINE_OUT>(wc);");
    }
    c.block_noted("for (int64_t ti = 0; ti < mlen; ++ti)", "epilogue, row by row", |c| {
        c.line("const int64_t orow = bi * M + m0 + ti;");
        match &epi.heads {
            None => {
                row_offsets(&k.em, &epi.spo, "orow", c);
                epi.job.emit(&mut k.ub, c);
            }
            Some(w) => {
                // NC is a multiple of the heads' width (`Work::MatMul::nc_step`).
                let _ = writeln!(c, "const int64_t W = {};", k.em.dim(w));
                c.block("for (int64_t hh = n0 / W; hh < (n0 + nlen) / W; ++hh)", |c| {
                    row_offsets(&k.em, &epi.spo, "orow * (N / W) + hh", c);
                    epi.job.emit(&mut k.ub, c);
                });
            }
        }
    });
    c.close();
}

/// One product of a tile: B's panel of the tile (`gb`), then `obj` computes C into `wc` (and
/// ends, when two objects take turns on the cube).
fn product(
    c: &mut Code,
    em: &Emitter,
    (obj, wc, gb): (&str, &str, &str),
    a: &Operand,
    b: &Operand,
    end: bool,
) {
    let tb = ascend_type(b.ty);
    if b.staged {
        let w = format!("w{}", b.sp.tag);
        let _ = writeln!(c, "AscendC::GlobalTensor<{tb}> {gb} = {w}[bi * K * N + n0];");
    } else {
        let tag = b.sp.tag;
        row_offsets(em, &b.sp, "bi * K", c);
        let ac = b.sp.accesses[&b.v];
        let gbuf = format!("g{}", em.buf[&resolve(em.g, b.v).base]);
        let col = if b.trans { format!("n0 * ({})", b.ld) } else { "n0".into() };
        let _ = writeln!(c, "AscendC::GlobalTensor<{tb}> {gb} = {gbuf}[{tag}_row{ac} + {col}];");
    }
    // SetOrgShape comes before SetTensorA/B and SetSingleShape (SetOrgShape.md, constraints);
    // its fifth argument is C's row stride (the tile is NC wide, B's rows N).
    let org = org_shape("M", "N", "K", (a.trans, &a.ld), (b.trans, &b.ld), "NC");
    let _ = writeln!(c, "{obj}.SetOrgShape({org});");
    let _ = writeln!(c, "{obj}.SetTensorA(ga, {});", a.trans);
    let _ = writeln!(c, "{obj}.SetTensorB({gb}, {});", b.trans);
    let _ = writeln!(c, "{obj}.SetSingleShape((int)mlen, (int)nlen, (int)K);");
    let _ = writeln!(c, "{obj}.IterateAll({wc});");
    if end {
        // The objects share the cube's L1 / L0C: each releases them before the other runs.
        let _ = writeln!(c, "{obj}.End();");
    }
}
