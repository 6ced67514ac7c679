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
            copy_chunk(c, &q, n.dtype, s, &fix, (&ob, "r * N"), &c_hi);
        });
        start = end;
    }
    c.close();
    Work::Rows { rows: numel(&shape[..rank - 1]), n: shape[rank - 1].clone(), row_buffers: 0 }
}
