//! Concat kernels: Ascend C emission.

use crate::abi::Work;
use crate::codegen::ascend::vector::*;
use crate::codegen::emit::Space;
use crate::dim::{numel, DimExpr};
use crate::ir::{NodeId, Op};
use crate::plan::Group;
use std::collections::BTreeMap;
use std::fmt::Write;

pub(crate) fn gen_concat(k: &mut K, grp: &Group) -> Work {
    let g = k.em.g;
    let id = grp.nodes[0];
    let n = g.node(id);
    let Op::Concat { axis } = n.op else { unreachable!() };
    let shape = n.shape.clone();
    let rank = shape.len();
    let mut sp = Space { tag: "x", shape: shape.clone(), accesses: BTreeMap::new() };
    let srcs: Vec<(NodeId, Src)> = n.inputs.iter().map(|i| (*i, k.src(&mut sp, *i, "0"))).collect();
    let ob = k.gm(k.em.buf[&id]);
    let ty = ascend_type(n.dtype);
    let _ = writeln!(
        k.setup,
        "const int64_t R = {}, N = {};",
        k.em.dim(&numel(&shape[..rank - 1])),
        k.em.dim(&shape[rank - 1])
    );
    let q = k.ub.queue("cq".into(), n.dtype, true);
    let c = &mut k.body;
    c.open("for (int64_t r = aiv; r < R; r += naiv)");
    row_offsets(&k.em, &sp, "r", c);
    let mut start = DimExpr::constant(0);
    for (i, s) in &srcs {
        let end = start.add(&g.node(*i).shape[axis]);
        let (st, en) = (k.em.dim(&start), k.em.dim(&end));
        let a = sp.accesses[i];
        // Along the last axis each input fills a column window; along another axis, a row
        // comes from exactly one input. Offsets are corrected by -start along the axis.
        let (cond, c_lo, c_hi) = if axis + 1 == rank {
            ("true".to_string(), st.clone(), en.clone())
        } else {
            (format!("x_i{axis} >= ({st}) && x_i{axis} < ({en})"), "0".into(), "N".into())
        };
        let fix = format!("- ({st}) * ac{a}_s{axis}");
        let head = format!("if ({cond}) for (int64_t c0 = {c_lo}; c0 < {c_hi}; c0 += CH)");
        c.block_noted(&head, &format!("from {}", g.node(*i).name), |c| {
            let _ = writeln!(c, "const int32_t cn = (int32_t)af_min(CH, ({c_hi}) - c0);");
            let _ = writeln!(c, "AscendC::LocalTensor<{ty}> x = {q}.AllocTensor<{ty}>();");
            match s {
                Src::Row { gm, off, .. } => {
                    c.line(pad_in("x", &format!("{gm}[{off} {fix} + c0]"), ty));
                }
                Src::Scalar { gm, off, .. } => {
                    let _ = writeln!(c, "for (int32_t j = 0; j < cn; ++j) x.SetValue(j, {gm}.GetValue({off} {fix}));");
                }
                Src::Gather { gm, off, stride, .. } => {
                    let _ = writeln!(c, "for (int32_t j = 0; j < cn; ++j) x.SetValue(j, {gm}.GetValue({off} {fix} + (c0 + j) * ({stride})));");
                }
            }
            let _ = writeln!(c, "{q}.EnQue(x);");
            let _ = writeln!(c, "x = {q}.DeQue<{ty}>();");
            c.line("AscendC::PipeBarrier<PIPE_ALL>(); /* the copy out reads what MTE2 / the scalar unit wrote */");
            if by_scalar_unit(n.dtype) {
                c.block("for (int32_t j = 0; j < cn; ++j)", |c| {
                    let _ = writeln!(c, "{ob}.SetValue((uint64_t)(r * N + c0 + j), x.GetValue((uint32_t)j));");
                    let _ = writeln!(c, "AscendC::DataCacheCleanAndInvalid<{ty}, AscendC::CacheLine::SINGLE_CACHE_LINE, AscendC::DcciDst::CACHELINE_OUT>({ob}[(uint64_t)(r * N + c0 + j)]);");
                });
            } else {
                c.line(pad_out(&format!("{ob}[r * N + c0]"), "x", ty));
            }
            let _ = writeln!(c, "{q}.FreeTensor(x);");
        });
        start = end;
    }
    c.close();
    Work::Rows { rows: numel(&shape[..rank - 1]), n: shape[rank - 1].clone(), row_buffers: 0 }
}
