//! Flash attention kernels: Ascend C emission.

use crate::abi::Work;
use crate::codegen::ascend::cube::*;
use crate::codegen::ascend::vector::*;
use crate::codegen::emit::{Code, Emitter, RowStore, Space};
use crate::dim::{numel, DimExpr, Shape};
use crate::ir::{DType, NodeId, Op};
use crate::layout::resolve;
use crate::plan::Group;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// The UB of the softmax over score and output rows: the in and out queues of a row streamed
/// through UB, a float slot, the output's queue and type, the output buffer and the offset of
/// query row `bi * SQ + q0 + i` in it.
pub(crate) struct FlashUb {
    pub(crate) fq: String,
    pub(crate) fo: String,
    pub(crate) ex: String,
    /// The queue P leaves UB through when O += P V is computed in a 16-bit type (P is
    /// written to its own tile `wp` in V's type, as the cube reads it).
    pub(crate) fp: Option<String>,
    pub(crate) oq: String,
    pub(crate) out_d: DType,
    pub(crate) ob: String,
    pub(crate) orow: String,
}

impl FlashUb {
    /// A row of `n` floats of a GM f32 tile (from `src`) streamed through UB in chunks:
    /// `body` sees the chunk as `x` and leaves what it computes in `y`, which `store`
    /// (queue, type, GM destination), if any, writes back. `body` is spliced as written,
    /// relative to the loop's `for` line: the bodies of the block max and of P sit one level
    /// into the loop, the rescale's at the `for`'s own level and the final store's two levels
    /// in (an indentation quirk of the output, kept).
    pub(crate) fn stream(
        &self,
        c: &mut Code,
        src: &str,
        n: &str,
        body: &Code,
        store: Option<(&str, &str, &str)>,
    ) {
        let fq = &self.fq;
        c.line(format!("for (int64_t c0 = 0; c0 < {n}; c0 += CH) {{"));
        c.indented(|c| {
            let _ = writeln!(c, "const int32_t cn = (int32_t)af_min(CH, {n} - c0);");
            aligned_group(
                c,
                &[
                    format!("AscendC::LocalTensor<float> x = {fq}.AllocTensor<float>();"),
                    pad_in("x", src, "float"),
                    format!("{fq}.EnQue(x);"),
                ],
            );
            let _ = writeln!(c, "AscendC::LocalTensor<float> x = {fq}.DeQue<float>();");
        });
        c.append(body);
        c.indented(|c| {
            if let Some((q, ty, dst)) = store {
                enque_store(c, q, "y", ty, dst);
            }
            let _ = writeln!(c, "{fq}.FreeTensor(x);");
        });
        c.line("}");
    }
}

/// The shapes of a flash group: scores `[batch.., SQ, SK]` = Q `[.., SQ, D]` by K^T
/// `[.., D, SK]`, output P V `[.., SQ, DV]`.
pub(crate) struct FlashShape {
    pub(crate) batch: Shape,
    pub(crate) scores: Shape,
    pub(crate) sq: DimExpr,
    pub(crate) sk: DimExpr,
    pub(crate) d: DimExpr,
    pub(crate) dv: DimExpr,
}

impl FlashShape {
    /// `[batch.., a, b]`.
    pub(crate) fn with(&self, a: DimExpr, b: DimExpr) -> Shape {
        let mut s = self.batch.clone();
        s.extend([a, b]);
        s
    }
}

/// What the loops of a flash kernel read: the three operands, the chain on the score tile
/// (one row's code over the space of the scores, with its op names), whether it holds a
/// causal mask, and the softmax's UB.
pub(crate) struct Flash {
    pub(crate) q: Operand,
    pub(crate) k: Operand,
    pub(crate) v: Operand,
    pub(crate) chain: Option<(Code, String)>,
    pub(crate) sps: Space,
    pub(crate) causal: bool,
    pub(crate) ub: FlashUb,
}

/// Flash attention: per AIV a block of `BR` queries of one batch entry, key blocks of `BC`.
/// The cube computes S = Q K^T into the AIV's score tile; the AIV applies the chain (scale,
/// mask) in place, takes the block's row maxima, writes P = exp(S - max) over the tile and
/// keeps the running max and sum per row (online softmax) in UB; the cube then adds P V into
/// the AIV's output accumulator in GM (atomic add; the first block overwrites it), which the
/// AIV has rescaled by exp(old max - new max). No S x S buffer: the tiles are BR x BC.
/// Q K^T is computed in Q's and K's type when they share one (half / bfloat16_t in, f32 in
/// L0C), P V in V's: P is rounded to it into its own tile. Operands the Matmul API cannot
/// address (strided views, or a type other than the product's) are staged first.
pub(crate) fn gen_flash(k: &mut K, grp: &Group) -> (Work, bool, bool, DType, DType) {
    let g = k.em.g;
    let members: BTreeSet<NodeId> = grp.nodes.iter().copied().collect();
    let f = crate::group::flash_parts(g, &members).expect("planner formed a flash group");
    let (q, kt, v) = (g.node(f.qk).inputs[0], g.node(f.qk).inputs[1], g.node(f.pv).inputs[1]);
    let ss = g.node(f.scores).shape.clone();
    let r = ss.len();
    let fs = FlashShape {
        batch: ss[..r - 2].to_vec(),
        sq: ss[r - 2].clone(),
        sk: ss[r - 1].clone(),
        d: g.node(q).shape.last().unwrap().clone(),
        dv: g.node(f.pv).shape.last().unwrap().clone(),
        scores: ss,
    };
    let em = &k.em;
    let _ = writeln!(
        k.setup,
        "const int64_t BATCH = {}, SQ = {}, SK = {}, D = {}, DV = {};",
        em.dim(&numel(&fs.batch)),
        em.dim(&fs.sq),
        em.dim(&fs.sk),
        em.dim(&fs.d),
        em.dim(&fs.dv)
    );
    k.setup
        .line("const int64_t BR = t.br, BC = t.bc, qt = (SQ + BR - 1) / BR, units = BATCH * qt;");
    user_workspace(&mut k.setup);
    // The running max and sum per query row, in UB beside the queues and slots; declared
    // first in the body, before the operands' staging.
    k.ub.extra_fixed += 2 * 64 * 4 + 64;
    k.body.line("AscendC::TBuf<AscendC::TPosition::VECCALC> statb;");
    k.body.line("pipe.InitBuffer(statb, 2 * 64 * sizeof(float));");
    k.body.line("AscendC::LocalTensor<float> mr = statb.Get<float>(), lr = mr[64]; /* running max and sum per query row */");
    // S = Q K^T in Q's and K's own type; O += P V in V's (P rounded to it, as the cube takes
    // it: hicann/ops-transformer's flash-attention kernels cast P to the input type for the
    // second product).
    let qk_t = cube_type(g, q, kt);
    let pv_t = g.node(v).dtype;
    let sp_q = space("q", fs.with(fs.sq.clone(), fs.d.clone()));
    let oq = operand(k, sp_q, q, "BATCH * SQ", "D", qk_t);
    let sp_k = space("k", fs.with(fs.d.clone(), fs.sk.clone()));
    let ok = operand(k, sp_k, kt, "BATCH * D", "SK", qk_t);
    let sp_v = space("v", fs.with(fs.sk.clone(), fs.dv.clone()));
    let ov = operand(k, sp_v, v, "BATCH * SK", "DV", pv_t);
    let (stage_a, stage_b) = (oq.staged, ok.staged || ov.staged);
    let (chain, sps) = flash_chain(k, &f, &members, &fs);
    let fl = Flash {
        q: oq,
        k: ok,
        v: ov,
        chain,
        sps,
        causal: f.chain.iter().any(|m| g.node(*m).op == Op::CausalMask),
        ub: flash_ub(k, g.node(f.pv).dtype, f.pv, &members, pv_t),
    };
    flash_objects(&mut k.setup, &fl);
    if stage_a || stage_b {
        sync_staged(&mut k.body);
    }
    flash_blocks(k, &fl, &fs);
    let FlashShape { batch, sq, sk, d, dv, .. } = fs;
    // The Ascend kernel computes each query head on its own: no group.
    let group = DimExpr::constant(1);
    (Work::Flash { batch: numel(&batch), sq, sk, d, dv, group }, stage_a, stage_b, qk_t, pv_t)
}

/// The chain on the score tile, in place: a rows job over the columns `[k0, k0 + bc)` of
/// one score row (`None` without a chain), and the space of the scores it reads in.
pub(crate) fn flash_chain(
    k: &mut K,
    f: &crate::group::FlashParts,
    members: &BTreeSet<NodeId>,
    fs: &FlashShape,
) -> (Option<(Code, String)>, Space) {
    let g = k.em.g;
    let mut sps = space("s", fs.scores.clone());
    let mut srcs = BTreeMap::new();
    for &m in &f.chain {
        for &i in &g.node(m).inputs {
            if !members.contains(&i)
                && !matches!(g.node(i).op, Op::Const { .. })
                && !srcs.contains_key(&i)
            {
                let s = k.src(&mut sps, i, "k0");
                srcs.insert(i, s);
            }
        }
    }
    srcs.insert(f.qk, Src::Row { gm: "ws".into(), off: "i * BC".into(), d: DType::F32 });
    if f.chain.is_empty() {
        return (None, sps);
    }
    let job = Job {
        g,
        gathers: BTreeMap::new(),
        space: fs.scores.clone(),
        nodes: f.chain.clone(),
        srcs,
        outs: vec![(f.scores, "ws".into(), "i * BC".into(), DType::F32)],
        row_i: format!("s_i{}", fs.scores.len() - 2),
        causal_shift: causal_shift(&k.em, &f.chain),
        col0: "k0".into(),
        ncols: "bc".into(),
        tag: "s".into(),
    };
    let mut code = Code::new();
    job.emit(&mut k.ub, &mut code);
    let ops = f.chain.iter().map(|m| g.node(*m).op.name()).collect::<Vec<_>>().join(" ");
    (Some((code, ops)), sps)
}

/// The softmax's queues and slot, and the output `pv` (dtype `out_d`) it stores: in its own
/// buffer, or at its place in a layout store's copy.
pub(crate) fn flash_ub(
    k: &mut K,
    out_d: DType,
    pv: NodeId,
    members: &BTreeSet<NodeId>,
    pv_t: DType,
) -> FlashUb {
    let rs = RowStore::new(&k.em, pv, members);
    FlashUb {
        fq: k.ub.queue("fq".into(), DType::F32, true),
        fo: k.ub.queue("fo".into(), DType::F32, false),
        ex: k.ub.slot(),
        fp: (!pv_t.is_compute()).then(|| k.ub.queue("fp".into(), pv_t, false)),
        oq: k.ub.queue("fy".into(), out_d, false),
        out_d,
        ob: k.gm(k.em.buf[&rs.buf]),
        orow: rs.offset("bi * SQ + q0 + i", "DV"),
    }
}

/// The two Matmul objects, S = Q K^T and O += P V, and their tilings, registered with the AIC.
pub(crate) fn flash_objects(c: &mut Code, fl: &Flash) {
    c.line("AscendC::tiling::TCubeTiling ct0, ct1;");
    c.line("af_cube_tiling(t, 0, ct0);");
    c.line("af_cube_tiling(t, 1, ct1);");
    let (mqk, mpv) = (
        matmul_object("mqk", fl.q.trans, fl.k.trans, fl.q.ty),
        matmul_object("mpv", false, fl.v.trans, fl.v.ty),
    );
    let _ = writeln!(c, "{mqk} /* S = Q K^T */");
    let _ = writeln!(c, "{mpv} /* O += P V */");
    c.line("REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mqk, &ct0, mpv, &ct1); /* the AIC serves both, then returns */");
}

/// This AIV's query blocks: per block, the key blocks (scores, softmax, P V), then the
/// normalised rows stored.
pub(crate) fn flash_blocks(k: &mut K, fl: &Flash, fs: &FlashShape) {
    let c = &mut k.body;
    let vt = ascend_type(fl.v.ty);
    if fl.ub.fp.is_some() {
        c.line("const int64_t PER = BR * BC + BR * DV + (BR * BC + 1) / 2; /* floats per AIV: S, O, P */");
        c.line("AscendC::GlobalTensor<float> ws, wo; /* this AIV's score tile and output accumulator */");
        let _ = writeln!(
            c,
            "AscendC::GlobalTensor<{vt}> wp; /* P in V's type, as the cube reads it */"
        );
        let _ = writeln!(
            c,
            "wp.SetGlobalBuffer((__gm__ {vt} *)(uws + stage + aiv * PER + BR * BC + BR * DV), BR * BC);"
        );
    } else {
        c.line(
            "const int64_t PER = BR * BC + BR * DV; /* floats per AIV: S (then P in place), O */",
        );
        c.line("AscendC::GlobalTensor<float> ws, wo; /* this AIV's score tile (S, then P) and output accumulator */");
    }
    c.line("ws.SetGlobalBuffer(uws + stage + aiv * PER, BR * BC);");
    c.line("wo.SetGlobalBuffer(uws + stage + aiv * PER + BR * BC, BR * DV);");
    split_layout(c);
    c.open("for (int64_t u = aiv; u < units * NS; u += naiv)");
    c.line("const int64_t s = u % NS, bi = (u / NS) / qt, q0 = ((u / NS) % qt) * BR, br = af_min(BR, SQ - q0);");
    c.line("const int64_t ks0 = s * KS, ks1 = af_min(SK, ks0 + KS); /* this unit's keys */");
    c.line("if (NS > 1) { wo.SetGlobalBuffer(part + PO + u * BR * DV, BR * DV); } /* the unit's partial output */");
    c.line("for (int64_t i = 0; i < br; ++i) { mr.SetValue((uint32_t)i, AF_NEG_INF); lr.SetValue((uint32_t)i, 0.0f); }");
    c.open("for (int64_t k0 = ks0; k0 < ks1; k0 += BC)");
    if fl.causal {
        let _ = writeln!(
            c,
            "if (k0 > q0 + br - 1 + ({})) break; /* every later key is masked for this block */",
            k.em.dim(&fs.sk.sub(&fs.sq))
        );
    }
    c.line("const int64_t bc = af_min(BC, ks1 - k0);");
    flash_key_block(c, &k.em, fl);
    c.close();
    c.open("if (NS > 1)");
    store_split_stats(c, &fl.ub);
    c.close();
    c.open("else");
    flash_store(c, &fl.ub);
    c.close();
    c.close();
    c.open("if (NS > 1)");
    merge_splits(c, &fl.ub);
    c.close();
}

/// Flash-decoding (docs/ascend-decode.md, IFA's `SplitBNS`): when a few query rows leave
/// cores idle, DynamicTiling splits the keys into `NS` ranges of whole key blocks; a unit is
/// one range of one query block. Its partial output stays unnormalised in the workspace
/// after the AIVs' tiles, with each row's max and sum (each broadcast to 8 floats, 32-byte
/// copies); every AIV then meets at `SyncAll` and the rows are merged.
fn split_layout(c: &mut Code) {
    c.line("const int64_t NS = t.splits > 1 ? t.splits : 1; /* key ranges per query block */");
    c.line("const int64_t KS = ((SK + BC - 1) / BC + NS - 1) / NS * BC; /* keys per range */");
    c.line("/* per unit: BR rows of (max x 8, sum x 8), then (at PO) BR x DV partial outputs */");
    c.line("__gm__ float *part = uws + stage + naiv * PER;");
    c.line("const int64_t PO = units * NS * BR * 16;");
    c.line("AscendC::GlobalTensor<float> gml, gpo; /* set only when split: the workspace has them then */");
    c.line("if (NS > 1) { gml.SetGlobalBuffer(part, (uint64_t)PO); gpo.SetGlobalBuffer(part + PO, (uint64_t)(units * NS * BR * DV)); }");
}

/// A split unit's row maxima and sums, each row's pair as 16 floats.
fn store_split_stats(c: &mut Code, ub: &FlashUb) {
    let fo = &ub.fo;
    c.open("for (int64_t i = 0; i < br; ++i)");
    c.line("const float m = mr.GetValue((uint32_t)i), l = lr.GetValue((uint32_t)i);");
    let _ = writeln!(c, "AscendC::LocalTensor<float> y = {fo}.AllocTensor<float>();");
    c.line("AscendC::Duplicate(y, m, 8);");
    c.line("AscendC::Duplicate(y[8], l, 8);");
    let _ = writeln!(c, "{fo}.EnQue(y);");
    let _ = writeln!(c, "y = {fo}.DeQue<float>();");
    c.line("AscendC::DataCopy(gml[(u * BR + i) * 16], y, 16);");
    let _ = writeln!(c, "{fo}.FreeTensor(y);");
    c.close();
}

/// After every AIV's ranges: each query row's partial outputs weighted by
/// `exp(m_s - M)` (M the largest range max; ranges that saw no key skipped) and divided by
/// the weighted sum of their sums, stored in the output's dtype.
fn merge_splits(c: &mut Code, ub: &FlashUb) {
    let (fq, oq, ex) = (&ub.fq, &ub.oq, &ub.ex);
    let oty = ascend_type(ub.out_d);
    c.line("AscendC::PipeBarrier<PIPE_ALL>();");
    c.line("AscendC::SyncAll(); /* every range's partial results are in GM */");
    c.open("for (int64_t r = aiv; r < BATCH * SQ; r += naiv)");
    c.line("const int64_t bi = r / SQ, q0 = (r % SQ) / BR * BR, i = r % SQ - q0, u0 = (bi * qt + q0 / BR) * NS;");
    c.line("float M = AF_NEG_INF, L = 0.0f;");
    c.open("for (int64_t s = 0; s < NS; ++s)");
    let _ = writeln!(c, "AscendC::LocalTensor<float> x = {fq}.AllocTensor<float>();");
    c.line("AscendC::DataCopy(x, gml[((u0 + s) * BR + i) * 16], 16);");
    let _ = writeln!(c, "{fq}.EnQue(x);");
    let _ = writeln!(c, "x = {fq}.DeQue<float>();");
    c.line("AscendC::PipeBarrier<PIPE_ALL>();");
    c.line("const float m = x.GetValue(0), l = x.GetValue(8);");
    let _ = writeln!(c, "{fq}.FreeTensor(x);");
    c.line("mr.SetValue((uint32_t)s, m);");
    c.line("lr.SetValue((uint32_t)s, l);");
    c.line("if (l > 0.0f && m > M) { M = m; }");
    c.close();
    c.open("for (int64_t s = 0; s < NS; ++s)");
    c.line("const float l = lr.GetValue((uint32_t)s), w = l > 0.0f ? af_s_exp(sc, mr.GetValue((uint32_t)s) - M) : 0.0f;");
    c.line("L += w * l;");
    c.line("mr.SetValue((uint32_t)s, w); /* the range's weight */");
    c.close();
    c.line("const float inv = L > 0.0f ? 1.0f / L : 0.0f;");
    c.open("for (int64_t c0 = 0; c0 < DV; c0 += CH)");
    c.line("const int32_t cn = (int32_t)af_min(CH, DV - c0);");
    let _ = writeln!(c, "AscendC::Duplicate({ex}, 0.0f, cn);");
    c.open("for (int64_t s = 0; s < NS; ++s)");
    c.line("const float w = mr.GetValue((uint32_t)s);");
    c.line("if (w <= 0.0f) { continue; }");
    let _ = writeln!(c, "AscendC::LocalTensor<float> x = {fq}.AllocTensor<float>();");
    c.line(pad_in("x", "gpo[((u0 + s) * BR + i) * DV + c0]", "float"));
    let _ = writeln!(c, "{fq}.EnQue(x);");
    let _ = writeln!(c, "x = {fq}.DeQue<float>();");
    // Muls then Add: the checker's toolchain stubs have no `vaxpy` for Axpy.
    c.line("AscendC::Muls(x, x, w, cn);");
    let _ = writeln!(c, "AscendC::Add({ex}, {ex}, x, cn);");
    let _ = writeln!(c, "{fq}.FreeTensor(x);");
    c.close();
    let _ = writeln!(c, "AscendC::LocalTensor<{oty}> y = {oq}.AllocTensor<{oty}>();");
    if ub.out_d.is_compute() {
        let _ = writeln!(c, "AscendC::Muls(y, {ex}, inv, cn);");
    } else {
        let _ = writeln!(c, "AscendC::Muls({ex}, {ex}, inv, cn);");
        let _ =
            writeln!(c, "AscendC::Cast<{oty}, float>(y, {ex}, AscendC::RoundMode::CAST_RINT, cn);");
    }
    let dst = format!("{}[{} + c0]", ub.ob, ub.orow);
    enque_store(c, oq, "y", oty, &dst);
    c.close();
    c.close();
}

/// `GlobalTensor<float> <name>` at row `row`, column `col` of operand `op` (its staged copy or
/// its buffer).
pub(crate) fn operand_at(
    c: &mut Code,
    em: &Emitter,
    op: &Operand,
    row: &str,
    col: &str,
    name: &str,
) {
    let tag = op.sp.tag;
    let ld = &op.ld;
    let ty = ascend_type(op.ty);
    if op.staged {
        let _ =
            writeln!(c, "AscendC::GlobalTensor<{ty}> {name} = w{tag}[({row}) * ({ld}) + {col}];");
    } else {
        row_offsets(em, &op.sp, row, c);
        let a = op.sp.accesses[&op.v];
        let gb = format!("g{}", em.buf[&resolve(em.g, op.v).base]);
        let c2 = if op.trans { format!("({col}) * ({ld})") } else { col.to_string() };
        let _ = writeln!(c, "AscendC::GlobalTensor<{ty}> {name} = {gb}[{tag}_row{a} + {c2}];");
    }
}

/// One key block: S = Q K^T on the cube, the softmax update row by row on the AIV, then
/// O += P V on the cube.
pub(crate) fn flash_key_block(c: &mut Code, em: &Emitter, fl: &Flash) {
    let (q, k, v) = (&fl.q, &fl.k, &fl.v);
    operand_at(c, em, q, "bi * SQ + q0", "0", "gq");
    operand_at(c, em, k, "bi * D", "k0", "gk");
    operand_at(c, em, v, "bi * SK + k0", "0", "gv");
    let org = org_shape("SQ", "SK", "D", (q.trans, &q.ld), (k.trans, &k.ld), "BC");
    let _ = writeln!(c, "mqk.SetOrgShape({org});");
    let _ = writeln!(c, "mqk.SetTensorA(gq, {});", q.trans);
    let _ = writeln!(c, "mqk.SetTensorB(gk, {});", k.trans);
    c.line("mqk.SetSingleShape((int)br, (int)bc, (int)D);");
    // The two objects share the cube's L1 / L0C start address: each releases them with End()
    // before the other runs (asc-devkit `docs/zh/api/SIMD-API/高阶API/矩阵计算/Matmul-Kernel侧接口/
    // End.md`; hicann/ops-transformer's flash_attention_score kernels end bmm1 and bmm2 so).
    c.line("mqk.IterateAll(ws);");
    c.line("mqk.End();");
    c.line("AscendC::PipeBarrier<PIPE_ALL>();");
    c.open("for (int64_t i = 0; i < br; ++i)");
    flash_softmax_row(c, em, fl);
    c.close();
    c.line("AscendC::PipeBarrier<PIPE_ALL>(); /* P and the rescaled O are in GM before the cube reads them */");
    let org = org_shape("BR", "DV", "BC", (false, "BC"), (v.trans, &v.ld), "DV");
    let _ = writeln!(c, "mpv.SetOrgShape({org});");
    let p = if fl.ub.fp.is_some() { "wp" } else { "ws" };
    let _ = writeln!(c, "mpv.SetTensorA({p}, false);");
    let _ = writeln!(c, "mpv.SetTensorB(gv, {});", v.trans);
    c.line("mpv.SetSingleShape((int)br, (int)DV, (int)bc);");
    c.line("mpv.IterateAll(wo, k0 > ks0 ? 1 : 0); /* the range's first block writes, later ones add */");
    c.line("mpv.End();");
    c.line("AscendC::PipeBarrier<PIPE_ALL>();");
}

/// Score row `i` of the key block: the chain in place, the block max, P = exp(S - max) with
/// its row sum, the running max and sum updated, and the accumulated output rescaled.
pub(crate) fn flash_softmax_row(c: &mut Code, em: &Emitter, fl: &Flash) {
    let (fo, ex) = (fl.ub.fo.as_str(), &fl.ub.ex);
    if let Some((chain, ops)) = &fl.chain {
        let _ = writeln!(c, "/* the chain on the scores: {ops} */");
        row_offsets(em, &fl.sps, "bi * SQ + q0 + i", c);
        c.append(chain);
        c.line("AscendC::PipeBarrier<PIPE_ALL>(); /* the block max reads what the chain wrote */");
    }
    c.line("float bm = AF_NEG_INF;");
    let mut max_body = Code::at_depth(1);
    max_body.line("AscendC::ReduceMax<float>(rd, x, rt, cn);");
    max_body.line("{ const float v = rd.GetValue(0); bm = v > bm ? v : bm; }");
    fl.ub.stream(c, "ws[i * BC + c0]", "bc", &max_body, None);
    c.line("const float mo = mr.GetValue((uint32_t)i), mx = mo > bm ? mo : bm;");
    c.line("const float mxe = mx == AF_NEG_INF ? 0.0f : mx; /* every key so far masked: P = 0 */");
    c.line("const float corr = mo == AF_NEG_INF ? 0.0f : af_s_exp(sc, mo - mx);");
    c.line("float ps = 0.0f;");
    let mut exp_body = Code::at_depth(1);
    let _ = writeln!(exp_body, "AscendC::Adds({ex}, x, -mxe, cn);");
    match &fl.ub.fp {
        None => {
            let _ =
                writeln!(exp_body, "AscendC::LocalTensor<float> y = {fo}.AllocTensor<float>();");
            let _ = writeln!(exp_body, "AscendC::Exp(y, {ex}, cn);");
            exp_body.line("AscendC::ReduceSum<float>(rd, y, rt, cn);");
            exp_body.line("ps += rd.GetValue(0);");
            let p_row = "ws[i * BC + c0]";
            fl.ub.stream(c, "ws[i * BC + c0]", "bc", &exp_body, Some((fo, "float", p_row)));
        }
        Some(fp) => {
            // The sum is of P in f32; P goes to the cube in V's type.
            let vt = ascend_type(fl.v.ty);
            let _ = writeln!(exp_body, "AscendC::LocalTensor<{vt}> y = {fp}.AllocTensor<{vt}>();");
            let _ = writeln!(exp_body, "AscendC::Exp({ex}, {ex}, cn);");
            let _ = writeln!(exp_body, "AscendC::ReduceSum<float>(rd, {ex}, rt, cn);");
            exp_body.line("ps += rd.GetValue(0);");
            let _ = writeln!(
                exp_body,
                "AscendC::Cast<{vt}, float>(y, {ex}, AscendC::RoundMode::CAST_RINT, cn);"
            );
            fl.ub.stream(c, "ws[i * BC + c0]", "bc", &exp_body, Some((fp, vt, "wp[i * BC + c0]")));
        }
    }
    c.line("lr.SetValue((uint32_t)i, lr.GetValue((uint32_t)i) * corr + ps);");
    c.line("mr.SetValue((uint32_t)i, mx);");
    c.block_noted("if (k0 > ks0)", "rescale what was accumulated under the old max", |c| {
        let mut scale_body = Code::new();
        let _ = writeln!(scale_body, "AscendC::LocalTensor<float> y = {fo}.AllocTensor<float>();");
        scale_body.line("AscendC::Muls(y, x, corr, cn);");
        let o_row = "wo[i * DV + c0]";
        fl.ub.stream(c, o_row, "DV", &scale_body, Some((fo, "float", o_row)));
    });
}

/// The query block's output rows: divided by their softmax sums and stored in the output's
/// dtype.
pub(crate) fn flash_store(c: &mut Code, ub: &FlashUb) {
    let (oq, oty, ex) = (&ub.oq, ascend_type(ub.out_d), &ub.ex);
    c.block_noted("for (int64_t i = 0; i < br; ++i)", "normalise and store", |c| {
        c.line("const float l = lr.GetValue((uint32_t)i), inv = l > 0.0f ? 1.0f / l : 0.0f;");
        let mut fin_body = Code::at_depth(2);
        let _ = writeln!(fin_body, "AscendC::LocalTensor<{oty}> y = {oq}.AllocTensor<{oty}>();");
        if ub.out_d.is_compute() {
            fin_body.line("AscendC::Muls(y, x, inv, cn);");
        } else {
            let _ = writeln!(fin_body, "AscendC::Muls({ex}, x, inv, cn);");
            let _ = writeln!(
                fin_body,
                "AscendC::Cast<{oty}, float>(y, {ex}, AscendC::RoundMode::CAST_RINT, cn);"
            );
        }
        // The final store goes to the output (its own queue and dtype).
        let dst = format!("{}[{} + c0]", ub.ob, ub.orow);
        ub.stream(c, "wo[i * DV + c0]", "DV", &fin_body, Some((oq, oty, &dst)));
    });
}
