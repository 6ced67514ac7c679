//! Flash attention kernels: host C emission.

use crate::abi::Work;
use crate::codegen::emit::{Code, Emitter, RowStore, Space};
use crate::codegen::host::c::*;
use crate::dim::{numel, DimExpr, Shape};
use crate::group::FlashParts;
use crate::ir::{NodeId, Op};
use crate::layout::resolve;
use crate::plan::Group;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// An attention group as the flash kernel computes it: the pattern, its operands and sizes,
/// and the spaces of Q, K^T, V and the scores.
pub(crate) struct Flash {
    pub(crate) f: FlashParts,
    pub(crate) members: BTreeSet<NodeId>,
    pub(crate) q: NodeId,
    pub(crate) kt: NodeId,
    pub(crate) v: NodeId,
    pub(crate) batch: Shape,
    pub(crate) sq: DimExpr,
    pub(crate) sk: DimExpr,
    pub(crate) d: DimExpr,
    pub(crate) dv: DimExpr,
    pub(crate) spq: Space,
    pub(crate) spk: Space,
    pub(crate) spv: Space,
    pub(crate) sps: Space,
    /// The score chain holds a causal mask.
    pub(crate) causal: bool,
}

/// Finds the attention pattern of a flash group and declares the accesses of its spaces.
pub(crate) fn flash_group(em: &mut Emitter, grp: &Group) -> Flash {
    let g = em.g;
    let members: BTreeSet<NodeId> = grp.nodes.iter().copied().collect();
    let f = crate::group::flash_parts(g, &members).expect("planner formed a flash group");
    let (q, kt, v) = (g.node(f.qk).inputs[0], g.node(f.qk).inputs[1], g.node(f.pv).inputs[1]);
    let ss = g.node(f.scores).shape.clone();
    let r = ss.len();
    let batch: Shape = ss[..r - 2].to_vec();
    let (sq, sk) = (ss[r - 2].clone(), ss[r - 1].clone());
    let d = g.node(q).shape.last().unwrap().clone();
    let dv = g.node(f.pv).shape.last().unwrap().clone();
    let with = |last2: [DimExpr; 2]| {
        let mut s = batch.clone();
        s.extend(last2);
        s
    };
    let mut spq =
        Space { tag: "q", shape: with([sq.clone(), d.clone()]), accesses: BTreeMap::new() };
    let mut spk =
        Space { tag: "k", shape: with([d.clone(), sk.clone()]), accesses: BTreeMap::new() };
    let mut spv =
        Space { tag: "v", shape: with([sk.clone(), dv.clone()]), accesses: BTreeMap::new() };
    let mut sps = Space { tag: "s", shape: ss, accesses: BTreeMap::new() };
    em.access(&mut spq, q);
    em.access(&mut spk, kt);
    em.access(&mut spv, v);
    access_operands(em, &mut sps, f.chain.iter().copied(), &members);
    let causal = f.chain.iter().any(|m| g.node(*m).op == Op::CausalMask);
    Flash { f, members, q, kt, v, batch, sq, sk, d, dv, spq, spk, spv, sps, causal }
}

/// Online-softmax attention: for each block of queries, loop over blocks of keys keeping the
/// running row max, row sum and output accumulator; the S x S scores never reach memory.
pub(crate) fn gen_flash(em: &mut Emitter, grp: &Group, body: &mut Code) -> Work {
    let fl = flash_group(em, grp);
    let em: &Emitter = em;
    let group = super::kv_group(em.g, fl.kt, fl.v, &fl.batch);
    // The shared workspace of a split launch comes after the buffers (a flash kernel packs
    // no operand).
    let workspace = em.buf.len() + em.packs.len();
    flash_setup(em, &fl, body);
    // The runtime takes the few-queries path (`t->splits > 0`) for at most MR_MAX / 2
    // queries (a decode step): MR x NR tiles would be mostly empty rows there.
    body.line("if (t->splits > 0) {");
    few_queries(em, &fl, &group, workspace, body);
    body.line("} else {");
    body.block("for (int64_t u = u0; u < u1; ++u)", |c| {
        c.line("const int64_t bi = u / ug, qb0 = (u % ug) * QPU, qb1 = af_min64(qt, qb0 + QPU);");
        key_range(em, &fl, c);
        pack_kt(em, &fl, c);
        pack_v(em, &fl, c);
        query_blocks(em, &fl, c);
    });
    body.line("}");
    let Flash { batch, sq, sk, d, dv, .. } = fl;
    Work::Flash { batch: numel(&batch), sq, sk, d, dv, group }
}

/// The sizes, tiling, micro-kernel, scratch layout and work units of a flash kernel.
pub(crate) fn flash_setup(em: &Emitter, fl: &Flash, c: &mut Code) {
    c.line(format!(
        "const int64_t BATCH = {}, SQ = {}, SK = {}, D = {}, DV = {};",
        em.dim(&numel(&fl.batch)),
        em.dim(&fl.sq),
        em.dim(&fl.sk),
        em.dim(&fl.d),
        em.dim(&fl.dv)
    ));
    c.line(
        "/* units: QPU query blocks of BR rows of one head; K and V are packed once per unit */",
    );
    c.line("const int64_t BR = t->mc, BC = t->nc, QPU = t->kc, qt = (SQ + BR - 1) / BR, ug = (qt + QPU - 1) / QPU, units = BATCH * ug;");
    c.line("const af_isa_info isa = af_isa();");
    c.line("const int64_t MR = isa.mr, NR = isa.nr, SKP = (SK + AF_NR_MAX - 1) / AF_NR_MAX * AF_NR_MAX, DVP = (DV + NR - 1) / NR * NR;");
    c.line("/* K^T of the head (slivers of NR keys x D), V of the head (slivers of NR columns x SK keys),");
    c.line(" * the packed query block, scores / probabilities, output accumulator, row max and row sum,");
    c.line(" * a key block's new row max and rescale factor */");
    c.line("float *Kp = scratch, *Vp = Kp + D * SKP, *Qp = Vp + (DV + AF_NR_MAX) * SK, *St = Qp + (BR + AF_MR_MAX) * D;");
    c.line("float *Ot = St + BR * BC, *Mr = Ot + BR * DV, *Lr = Mr + BR, *Mn = Lr + BR, *Cr = Mn + BR;");
    c.line("const int64_t u0 = block * t->rows_per_block, u1 = af_min64(units, u0 + t->rows_per_block);");
}

/// The keys the unit's queries see (`kend`), and that rounded up to whole slivers (`kendp`).
pub(crate) fn key_range(em: &Emitter, fl: &Flash, c: &mut Code) {
    if fl.causal {
        let shift = fl.sk.sub(&fl.sq);
        c.line("/* keys any query of the unit sees, rounded up to whole key blocks (later ones are masked) */");
        c.line(format!("const int64_t need = af_min64(SQ, qb1 * BR) + {};", em.dim(&shift)));
        c.line("const int64_t kend = af_min64(SK, (need + BC - 1) / BC * BC);");
    } else {
        c.line("const int64_t kend = SK;");
    }
    c.line("const int64_t kendp = (kend + NR - 1) / NR * NR;");
}

/// Packs K^T of the unit's keys in slivers of NR keys (keys past `kend` zero).
pub(crate) fn pack_kt(em: &Emitter, fl: &Flash, c: &mut Code) {
    if em.strided_cols(&fl.spk, fl.kt) {
        // K^T is a transposed view of K. Each sliver row (one head-dim index, NR keys) is
        // written whole, the keys read along their stride: walking the keys outside instead
        // put every store NR floats from the last (7.5% of the attention kernel's own perf
        // samples on bert_embed's 256-token sentences).
        c.block_noted("", "pack K^T in slivers of NR keys, row by row", |c| {
            em.row_prologue(&fl.spk, "bi * D", c);
            c.block("for (int64_t js = 0; js < kendp; js += NR)", |c| {
                c.line("const int64_t nj = af_min64(NR, kend - js);");
                c.block("for (int64_t c = 0; c < D; ++c)", |c| {
                    c.line("float *kp = Kp + js * D + c * NR;");
                    c.line(format!(
                        "for (int64_t j = 0; j < nj; ++j) kp[j] = {};",
                        em.read_inner(&fl.spk, fl.kt, "c", "js + j")
                    ));
                    c.line("for (int64_t j = nj; j < NR; ++j) kp[j] = 0.0f;");
                });
            });
        });
    } else {
        let note = "pack K^T in slivers of NR keys";
        c.block_noted("for (int64_t c = 0; c < D; ++c)", note, |c| {
            em.row_prologue(&fl.spk, "bi * D + c", c);
            c.block("for (int64_t js = 0; js < kendp; js += NR)", |c| {
                c.line("float *kp = Kp + js * D + c * NR;");
                c.line("const int64_t nj = af_min64(NR, kend - js);");
                c.line(format!(
                    "for (int64_t j = 0; j < nj; ++j) kp[j] = {};",
                    em.read(&fl.spk, fl.kt, "js + j")
                ));
                c.line("for (int64_t j = nj; j < NR; ++j) kp[j] = 0.0f;");
            });
        });
    }
}

/// Packs V of the unit's keys in slivers of NR columns (columns past DV zero).
pub(crate) fn pack_v(em: &Emitter, fl: &Flash, c: &mut Code) {
    let note = "pack V in slivers of NR columns";
    c.block_noted("for (int64_t j = 0; j < kend; ++j)", note, |c| {
        em.row_prologue(&fl.spv, "bi * SK + j", c);
        c.block("for (int64_t cs = 0; cs < DVP; cs += NR)", |c| {
            c.line("float *vp = Vp + cs * SK + j * NR;");
            c.line("const int64_t nc = af_min64(NR, DV - cs);");
            c.line(format!(
                "for (int64_t c = 0; c < nc; ++c) vp[c] = {};",
                em.read(&fl.spv, fl.v, "cs + c")
            ));
            c.line("for (int64_t c = nc; c < NR; ++c) vp[c] = 0.0f;");
        });
    });
}

/// The loop over the unit's query blocks: the block of Q, the key blocks, the normalised store.
pub(crate) fn query_blocks(em: &Emitter, fl: &Flash, c: &mut Code) {
    // The loop's body is not indented in the output, so its braces are plain lines.
    c.line("for (int64_t qb = qb0; qb < qb1; ++qb) {");
    c.line("const int64_t q0 = qb * BR, br = af_min64(BR, SQ - q0);");
    let q_direct = query_block(em, fl, c);
    key_blocks(em, fl, q_direct, c);
    store_rows(em, fl, c);
    c.line("} /* query blocks */");
}

/// The rows of a query block normalised by their softmax sums and stored.
fn store_rows(em: &Emitter, fl: &Flash, c: &mut Code) {
    let g = em.g;
    let rs = RowStore::new(em, fl.f.pv, &fl.members);
    let ob = em.buf[&rs.buf];
    let note = if rs.buf == fl.f.pv {
        "normalise and store".to_string()
    } else {
        format!(
            "normalise and store, each row at its place in {} (layout_store)",
            g.node(rs.buf).name
        )
    };
    c.block_noted("for (int64_t i = 0; i < br; ++i)", &note, |c| {
        c.line("const float inv = 1.0f / Lr[i];");
        let _ = writeln!(c, "const int64_t orow = {};", rs.offset("bi * SQ + q0 + i", "DV"));
        let val = round_to(g.node(fl.f.pv).dtype, "Ot[i * DV + c] * inv".into());
        c.line(format!(
            "for (int64_t c = 0; c < DV; ++c) {{ const float o = {val}; {} }}",
            store(g.node(fl.f.pv).dtype, &format!("out{ob}"), "orow + c", "o")
        ));
    });
}

/// Attention for a few queries (a decode step), flash-decoding style. A unit is one KV group
/// (`kv_group`: the query heads K and V are broadcast over, so each key and value row is
/// read once for all of them) and one of `t->splits` ranges of its keys. Per key block, the
/// keys' and values' rows are read in place where they are f32 rows along memory (a KV cache),
/// else copied row-major into `Kp` and `Vp`; each score is a dot product of a query row and a
/// key row, and the block's probabilities weight its value rows into the output; the score
/// chain and the online softmax are the tiled path's, run per head with `bi` and the row state (`Qp`, `St`, `Ot`, `Mr`, `Lr`) shadowed to
/// that head's. With one range the rows are stored at once; with more, each range leaves its
/// rows' max, sum and unnormalised output in the workspace (`bufs[workspace]`, laid out as
/// `tiling::flash::workspace_floats` says) and the last range of the group to finish (a
/// counter per group) merges them and stores.
pub(crate) fn few_queries(
    em: &Emitter,
    fl: &Flash,
    group: &DimExpr,
    workspace: usize,
    c: &mut Code,
) {
    c.line(format!(
        "const int64_t GB = {}, NS = t->splits, groups = BATCH / GB, fu1 = af_min64(groups * NS, u0 + t->rows_per_block);",
        em.dim(group)
    ));
    c.line("/* keys per range: whole key blocks */");
    c.line("const int64_t span = ((SK + NS - 1) / NS + BC - 1) / BC * BC;");
    c.line("float *const Kp = scratch, *const Vp = Kp + BC * D, *const Q0 = Vp + BC * DV, *const S0 = Q0 + GB * BR * D;");
    c.line("float *const O0 = S0 + GB * BR * BC, *const M0 = O0 + GB * BR * DV, *const L0 = M0 + GB * BR;");
    c.block("for (int64_t u = u0; u < fu1; ++u)", |c| {
        c.line("const int64_t gi = u / NS, sp = u % NS, bi0 = gi * GB, bi = bi0, q0 = 0, br = SQ;");
        c.line("const int64_t ks = sp * span, ke = af_min64(SK, ks + span);");
        c.line("(void)bi;");
        per_head(c, &|c| {
            c.block_noted("for (int64_t i = 0; i < br; ++i)", "the query rows, row-major", |c| {
                em.row_prologue(&fl.spq, "bi * SQ + q0 + i", c);
                c.line(format!(
                    "for (int64_t c = 0; c < D; ++c) Qp[i * D + c] = {};",
                    em.read(&fl.spq, fl.q, "c")
                ));
                c.line("Mr[i] = -INFINITY; Lr[i] = 0.0f;");
                c.line("for (int64_t c = 0; c < DV; ++c) Ot[i * DV + c] = 0.0f;");
            });
        });
        c.block("for (int64_t k0 = ks; k0 < ke; k0 += BC)", |c| {
            if fl.causal {
                let shift = fl.sk.sub(&fl.sq);
                c.line(format!(
                    "if (k0 > q0 + br - 1 + {}) break; /* every later key is masked */",
                    em.dim(&shift)
                ));
            }
            c.line("const int64_t bc = af_min64(BC, ke - k0);");
            key_value_rows(em, fl, c);
            per_head(c, &|c| {
                c.block("for (int64_t i = 0; i < br; ++i)", |c| {
                    c.line("for (int64_t j = 0; j < bc; ++j) St[i * BC + j] = af_vdot(Qp + i * D, Kb + j * ldk, D);");
                    score_chain(em, fl, c);
                    c.line("/* online softmax; a range may hold only masked keys for a row */");
                    c.line("const float mx = af_vmax(srow, bc, Mr[i]);");
                    c.line("if (mx == -INFINITY) continue;");
                    c.line("const float corr = af_expf(Mr[i] - mx);");
                    c.line("for (int64_t c = 0; c < DV; ++c) Ot[i * DV + c] *= corr;");
                    c.line("Lr[i] = Lr[i] * corr + af_vexp_sum(srow, bc, mx);");
                    c.line("Mr[i] = mx;");
                    c.line("af_vaxpy_rows(Ot + i * DV, srow, Vb, ldv, bc, DV);");
                });
            });
        });
        c.block("if (NS == 1)", |c| per_head(c, &|c| store_rows(em, fl, c)));
        c.block("else", |c| merge_ranges(em, fl, workspace, c));
    });
}

/// Runs `body` once per head of the unit's KV group, with `bi` and the row state shadowed to
/// that head's.
fn per_head(c: &mut Code, body: &dyn Fn(&mut Code)) {
    c.block("for (int64_t gq = 0; gq < GB; ++gq)", |c| {
        c.line("const int64_t bi = bi0 + gq;");
        c.line("float *const Qp = Q0 + gq * BR * D, *const St = S0 + gq * BR * BC, *const Ot = O0 + gq * BR * DV;");
        c.line("float *const Mr = M0 + gq * BR, *const Lr = L0 + gq * BR;");
        c.line("(void)bi; (void)Qp; (void)St; (void)Ot; (void)Mr; (void)Lr;");
        body(c);
    });
}

/// The key and value rows of the block `k0 .. k0 + bc` as `Kb`, `Vb` with row strides `ldk`,
/// `ldv`. f32 rows along memory are read in place: a decode step's keys and values are a KV
/// cache's rows, and copying them cost about as much as the attention itself (perf: half of
/// the kernel's samples on the copy at 2048 cached tokens). Other layouts and 16-bit values
/// are copied row-major into `Kp` and `Vp`.
fn key_value_rows(em: &Emitter, fl: &Flash, c: &mut Code) {
    let rank = fl.spk.shape.len();
    let (ak, av) = (fl.spk.accesses[&fl.kt], fl.spv.accesses[&fl.v]);
    let f32_rows = |v: NodeId| em.g.node(v).dtype.is_compute();
    // K^T's rows (the head dim) are K's columns: in place when that stride is 1 at run time.
    let k_direct = f32_rows(fl.kt) && em.strided_cols(&fl.spk, fl.kt);
    let v_direct = f32_rows(fl.v) && !em.strided_cols(&fl.spv, fl.v);
    c.line("const float *Kb = Kp, *Vb = Vp;");
    c.line("int64_t ldk = D, ldv = DV;");
    let copy_k = |c: &mut Code| copy_key_rows(em, fl, c);
    if k_direct {
        let kb = em.buf[&resolve(em.g, fl.kt).base];
        c.if_else(
            &format!("ac{ak}_s{} == 1", rank - 2),
            "the block's key rows, in place",
            |c| {
                em.row_prologue(&fl.spk, "bi0 * D", c);
                c.line(format!("ldk = ac{ak}_s{};", rank - 1));
                c.line(format!("Kb = in{kb} + ac{ak}_row + k0 * ldk;"));
            },
            copy_k,
        );
    } else {
        copy_k(c);
    }
    if v_direct {
        let vb = em.buf[&resolve(em.g, fl.v).base];
        c.block_noted("", "the block's value rows, in place", |c| {
            em.row_prologue(&fl.spv, "bi0 * SK + k0", c);
            c.line(format!("ldv = ac{av}_s{};", rank - 2));
            c.line(format!("Vb = in{vb} + ac{av}_row;"));
        });
    } else {
        copy_value_rows(em, fl, c);
    }
}

/// The key rows of the block, row-major, into `Kp`.
fn copy_key_rows(em: &Emitter, fl: &Flash, c: &mut Code) {
    if em.strided_cols(&fl.spk, fl.kt) {
        c.block_noted("", "the block's key rows, row-major", |c| {
            em.row_prologue(&fl.spk, "bi * D", c);
            c.line(format!(
                "for (int64_t j = 0; j < bc; ++j) for (int64_t c = 0; c < D; ++c) Kp[j * D + c] = {};",
                em.read_inner(&fl.spk, fl.kt, "c", "k0 + j")
            ));
        });
    } else {
        let note = "the block's key rows, row-major (K^T read along its rows)";
        c.block_noted("for (int64_t c = 0; c < D; ++c)", note, |c| {
            em.row_prologue(&fl.spk, "bi * D + c", c);
            c.line(format!(
                "for (int64_t j = 0; j < bc; ++j) Kp[j * D + c] = {};",
                em.read(&fl.spk, fl.kt, "k0 + j")
            ));
        });
    }
}

/// The value rows of the block, row-major, into `Vp`.
fn copy_value_rows(em: &Emitter, fl: &Flash, c: &mut Code) {
    c.block_noted("for (int64_t j = 0; j < bc; ++j)", "the block's value rows", |c| {
        em.row_prologue(&fl.spv, "bi * SK + k0 + j", c);
        c.line(format!(
            "for (int64_t c = 0; c < DV; ++c) Vp[j * DV + c] = {};",
            em.read(&fl.spv, fl.v, "c")
        ));
    });
}

/// A split unit's end: its rows' state into the workspace; the group's last range to finish
/// merges every range (weights `exp(m_s - M)`, a range that saw no key weighing 0) and stores.
fn merge_ranges(em: &Emitter, fl: &Flash, workspace: usize, c: &mut Code) {
    c.line(format!(
        "float *const ws = (float *)bufs[{workspace}]; /* shared by the launch, zeroed */"
    ));
    c.line("float *const part = ws + 2 * groups; /* per (group, range, head, row): max, sum, DV outputs */");
    per_head(c, &|c| {
        c.block("for (int64_t i = 0; i < br; ++i)", |c| {
            c.line("float *const rec = part + (((gi * NS + sp) * GB + gq) * SQ + i) * (DV + 2);");
            c.line("rec[0] = Mr[i]; rec[1] = Lr[i];");
            c.line("for (int64_t c = 0; c < DV; ++c) rec[2 + c] = Ot[i * DV + c];");
        });
    });
    c.line("/* the last range to arrive sees every other range's rows (acquire-release) */");
    c.block("if (__atomic_add_fetch((int64_t *)ws + gi, 1, __ATOMIC_ACQ_REL) == NS)", |c| {
        per_head(c, &|c| {
            c.block("for (int64_t i = 0; i < br; ++i)", |c| {
                c.line("const float *const rec0 = part + ((gi * NS * GB + gq) * SQ + i) * (DV + 2);");
                c.line("const int64_t rstride = GB * SQ * (DV + 2);");
                c.line("float m = -INFINITY, l = 0.0f;");
                c.line("for (int64_t r = 0; r < NS; ++r) m = rec0[r * rstride] > m ? rec0[r * rstride] : m;");
                c.line("for (int64_t c = 0; c < DV; ++c) Ot[i * DV + c] = 0.0f;");
                c.block("for (int64_t r = 0; r < NS; ++r)", |c| {
                    c.line("const float *const rec = rec0 + r * rstride;");
                    c.line("if (rec[0] == -INFINITY) continue;");
                    c.line("const float w = af_expf(rec[0] - m);");
                    c.line("l += w * rec[1];");
                    c.line("for (int64_t c = 0; c < DV; ++c) Ot[i * DV + c] += w * rec[2 + c];");
                });
                c.line("Lr[i] = l;");
            });
            store_rows(em, fl, c);
        });
    });
}

/// The query block, read in place or packed as MR-row slivers, and the reset of its rows'
/// softmax state. Returns whether Q is read in place.
pub(crate) fn query_block(em: &Emitter, fl: &Flash, c: &mut Code) -> bool {
    let reset = |c: &mut Code| {
        c.line("Mr[i] = -INFINITY; Lr[i] = 0.0f;");
        c.line("for (int64_t c = 0; c < DV; ++c) Ot[i * DV + c] = 0.0f;");
    };
    // Q of f32 with contiguous rows is read in place by the micro-kernel, else packed.
    let q_direct = em.g.node(fl.q).dtype.is_compute() && !em.strided_cols(&fl.spq, fl.q);
    if q_direct {
        let a = fl.spq.accesses[&fl.q];
        c.line("/* the query block, read in place (f32, contiguous rows) */");
        em.row_prologue(&fl.spq, "bi * SQ + q0", c);
        c.line(format!("const float *Qb = in{} + ac{a}_row;", em.buf[&resolve(em.g, fl.q).base]));
        c.line(format!("const int64_t ldq = ac{a}_s{};", fl.batch.len()));
        c.line("(void)Qp;");
        c.block("for (int64_t i = 0; i < br; ++i)", reset);
    } else {
        let note = "pack the query block as MR-row slivers";
        c.block_noted("for (int64_t i = 0; i < br; ++i)", note, |c| {
            c.line("float *qp = Qp + (i / MR) * MR * D + i % MR;");
            em.row_prologue(&fl.spq, "bi * SQ + q0 + i", c);
            c.line(format!(
                "for (int64_t c = 0; c < D; ++c) qp[c * MR] = {};",
                em.read(&fl.spq, fl.q, "c")
            ));
            reset(c);
        });
    }
    q_direct
}

/// The loop over key blocks: S = Q K^T, each score row through the chain and the online
/// softmax, then O += P V.
pub(crate) fn key_blocks(em: &Emitter, fl: &Flash, q_direct: bool, c: &mut Code) {
    c.block("for (int64_t k0 = 0; k0 < kend; k0 += BC)", |c| {
        if fl.causal {
            let shift = fl.sk.sub(&fl.sq);
            c.line(format!("if (k0 > q0 + br - 1 + {}) break; /* every later key is masked for this block */", em.dim(&shift)));
        }
        c.line("const int64_t bc = af_min64(BC, SK - k0);");
        c.line("/* S = Q K^T on the micro-kernel (BC is a multiple of NR_MAX, so k0 + jr starts a sliver) */");
        let qsrc = if q_direct { "Qb + ir * ldq, ldq, 1" } else { "Qp + ir * D, 1, MR" };
        nested_loops(
            c,
            &["for (int64_t jr = 0; jr < bc; jr += NR)", "for (int64_t ir = 0; ir < br; ir += MR)"],
            &format!("isa.uk(D, {qsrc}, Kp + (k0 + jr) * D, St + ir * BC + jr, BC, af_min64(MR, br - ir), af_min64(NR, bc - jr), 0);"),
        );
        score_rows(em, fl, c);
        c.line("/* O += P V on the micro-kernel, P read in place from the score rows */");
        nested_loops(
            c,
            &["for (int64_t jr = 0; jr < DV; jr += NR)", "for (int64_t ir = 0; ir < br; ir += MR)"],
            "isa.uk(bc, St + ir * BC, BC, 1, Vp + jr * SK + k0 * NR, Ot + ir * DV + jr, DV, af_min64(MR, br - ir), af_min64(NR, DV - jr), 1);",
        );
    });
}

/// The score rows of a key block: the chain applied in place, then the online softmax update.
/// Each phase runs over every row before the next starts: a row's update is a chain of
/// dependent steps (its max, the rescale factor, the exponentials), and independent rows
/// side by side let the core overlap them; the rescale factors are one vectorised loop.
pub(crate) fn score_rows(em: &Emitter, fl: &Flash, c: &mut Code) {
    c.block("for (int64_t i = 0; i < br; ++i)", |c| {
        score_chain(em, fl, c);
        c.line("Mn[i] = af_vmax(srow, bc, Mr[i]);");
    });
    c.line("/* online softmax: what was accumulated under the old max is rescaled (not at all when it stays) */");
    c.line("for (int64_t i = 0; i < br; ++i) Cr[i] = af_expf(Mr[i] - Mn[i]);");
    c.block("for (int64_t i = 0; i < br; ++i)", |c| {
        c.line("const float corr = Cr[i];");
        c.line("if (corr != 1.0f) for (int64_t c = 0; c < DV; ++c) Ot[i * DV + c] *= corr;");
        c.line("Lr[i] = Lr[i] * corr + af_vexp_sum(St + i * BC, bc, Mn[i]);");
        c.line("Mr[i] = Mn[i];");
    });
}

/// The score chain over row `i` of a key block, in place (`srow`).
fn score_chain(em: &Emitter, fl: &Flash, c: &mut Code) {
    let g = em.g;
    em.row_prologue(&fl.sps, "bi * SQ + q0 + i", c);
    c.line("float *restrict srow = St + i * BC;");
    c.block("for (int64_t j = 0; j < bc; ++j)", |c| {
        let qk = fl.f.qk;
        let s = round_to(g.node(qk).dtype, "srow[j]".into());
        c.line(format!("const float {} = {s}; /* {} */", em.var(qk), g.node(qk).name));
        for &m in &fl.f.chain {
            c.line(member_def(em, &fl.sps, &fl.members, &|x| Some(em.var(x)), m, "k0 + j"));
        }
        c.line(format!("srow[j] = {};", em.var(fl.f.scores)));
    });
}
