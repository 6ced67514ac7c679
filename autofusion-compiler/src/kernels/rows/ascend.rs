//! Rows kernels: Ascend C emission.

use crate::abi::Work;
use crate::codegen::ascend::vector::*;
use crate::codegen::emit::Space;
use crate::dim::{numel, Shape};
use crate::group::space_of;
use crate::ir::{Graph, NodeId, Op};
use crate::layout::resolve;
use crate::plan::Group;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

pub(crate) fn gen_rows(k: &mut K, grp: &Group) -> Work {
    let g = k.em.g;
    let space = space_of(g, &grp.nodes).expect("planner checked the space");
    let members: BTreeSet<NodeId> = grp.nodes.iter().copied().collect();
    let mut sp = Space { tag: "x", shape: space.clone(), accesses: BTreeMap::new() };
    let mut srcs = BTreeMap::new();
    let gathers = gathered(k, &grp.nodes);
    for i in ext_inputs(g, &grp.nodes, &members) {
        if crate::kernels::cache_write::only_written(g, &members, i) {
            continue; // written in place through the cache write's output
        }
        // What only gathers read is addressed through their indices, and what only rotations
        // read is read at their partner columns (`rotated_sources`): neither is streamed.
        let streamed = g.users()[i.idx()].iter().any(|u| {
            members.contains(u) && !gathers.contains_key(u) && g.node(*u).op != Op::RotateHalf
        });
        if streamed {
            let s = k.src(&mut sp, i, "0");
            srcs.insert(i, s);
        }
    }
    rotated_sources(k, &mut sp, &grp.nodes, "(N / 2)", &mut srcs);
    let r = space.len();
    let outs = grp
        .outputs
        .iter()
        .map(|o| {
            let at = match crate::kernels::cache_write::Write::at(g, *o) {
                // A cache write stores the row at its cache row (the axis moved by the start).
                Ok(w) => w.cache_row(g, &|d| k.em.dim(d)),
                Err(_) if space_is_row(g, *o, &space) => "r".to_string(),
                Err(_) => "r * N".to_string(),
            };
            (*o, k.gm(k.em.buf[o]), at, g.node(*o).dtype)
        })
        .collect();
    let row_i = if r >= 2 { format!("x_i{}", r - 2) } else { "0".into() };
    let job = Job {
        g,
        gathers,
        space: space.clone(),
        nodes: grp.nodes.clone(),
        srcs,
        outs,
        row_i,
        causal_shift: causal_shift(&k.em, &grp.nodes),
        col0: "0".into(),
        ncols: "N".into(),
        tag: "x".into(),
    };
    let _ = writeln!(
        k.setup,
        "const int64_t R = {}, N = {};",
        k.em.dim(&numel(&space[..r - 1])),
        k.em.dim(&space[r - 1])
    );
    k.body.open("for (int64_t r = aiv; r < R; r += naiv)");
    row_offsets(&k.em, &sp, "r", &mut k.body);
    job.emit(&mut k.ub, &mut k.body);
    k.body.close();
    Work::Rows { rows: numel(&space[..r - 1]), n: space[r - 1].clone(), row_buffers: 0 }
}

/// The gather members of `nodes`, their addressing declared (`Emitter::gather_decls`), with the
/// GM tensors of their table and indices.
fn gathered(k: &mut K, nodes: &[NodeId]) -> BTreeMap<NodeId, Gathered> {
    let g = k.em.g;
    let mut out = BTreeMap::new();
    for &m in nodes {
        if let Op::Gather { .. } = g.node(m).op {
            k.em.gather_decls(m);
            let n = g.node(m);
            let gm = |v: NodeId| k.gm(k.em.buf[&resolve(g, v).base]);
            let (dv, iv) = (n.inputs[0], n.inputs[1]);
            let table = (gm(dv), g.node(dv).dtype);
            out.insert(m, Gathered { table, index: (gm(iv), g.node(iv).dtype) });
        }
    }
    out
}

/// Whether output `o` is a per-row value (its last extent is 1 while the space's is not).
pub(crate) fn space_is_row(g: &Graph, o: NodeId, space: &Shape) -> bool {
    let s = &g.node(o).shape;
    s.last().and_then(|d| d.as_const()) == Some(1)
        && space.last().and_then(|d| d.as_const()) != Some(1)
}
