//! Concat kernels: host C emission.

use crate::abi::Work;
use crate::codegen::emit::{Code, Emitter, Space};
use crate::codegen::host::c::*;
use crate::dim::{numel, DimExpr};
use crate::ir::Op;
use crate::layout::resolve;
use crate::plan::Group;
use std::collections::BTreeMap;

/// The row loop of a concatenation: each column is read from the input covering it.
pub(crate) fn gen_concat(em: &mut Emitter, grp: &Group, body: &mut Code) -> Work {
    let g = em.g;
    let id = grp.nodes[0];
    let n = g.node(id);
    let Op::Concat { axis } = n.op else { unreachable!() };
    let shape = n.shape.clone();
    let rank = shape.len();
    let mut sp = Space { tag: "x", shape: shape.clone(), accesses: BTreeMap::new() };
    for &i in &n.inputs {
        em.access(&mut sp, i);
    }
    let em: &Emitter = em;
    let r_expr = em.dim(&numel(&shape[..rank - 1]));
    body.line(format!("const int64_t R = {r_expr}, N = {};", em.dim(&shape[rank - 1])));
    body.line(
        "const int64_t r0 = block * t->rows_per_block, r1 = af_min64(R, r0 + t->rows_per_block);",
    );
    body.block("for (int64_t r = r0; r < r1; ++r)", |c| {
        em.row_prologue(&sp, "r", c);
        let ob = em.buf[&id];
        // Each input covers [start, start + extent) of the concatenated axis; its own index along
        // the axis is shifted back by start (so its access offset is corrected by -start*stride).
        let mut start = DimExpr::constant(0);
        let pos = if axis + 1 == rank { "c".to_string() } else { format!("x_i{axis}") };
        c.block("for (int64_t c = 0; c < N; ++c)", |c| {
            for (j, &i) in n.inputs.iter().enumerate() {
                let ext = g.node(i).shape[axis].clone();
                let end = start.add(&ext);
                let a = sp.accesses[&i];
                let s = em.dim(&start);
                let idx = format!("ac{a}_row + c * ac{a}_s{} - ({s}) * ac{a}_s{axis}", rank - 1);
                let v = load(g.node(i).dtype, &format!("in{}", em.buf[&resolve(g, i).base]), &idx);
                c.line(format!(
                    "{}if ({pos} < {}) {{ {} }}",
                    if j == 0 { "" } else { "else " },
                    em.dim(&end),
                    store(n.dtype, &format!("out{ob}"), "r * N + c", &v)
                ));
                start = end;
            }
        });
    });
    Work::Rows { rows: numel(&shape[..rank - 1]), n: shape[rank - 1].clone(), row_buffers: 0 }
}
