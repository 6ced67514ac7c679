//! Rows kernels: host C emission.

use super::*;
use crate::abi::Work;
use crate::codegen::emit::{Code, Emitter, Space};
use crate::codegen::host::c::*;
use crate::dim::numel;
use crate::group::space_of;
use crate::ir::{Graph, NodeId, Op, ReduceKind};
use crate::plan::Group;
use std::collections::{BTreeMap, BTreeSet};

/// Partial sums per row reduction. Sixteen, not eight: with the row length known at compile
/// time GCC 12 turns an 8-lane partial loop into scalar adds under AVX-512 (x86-64-v4), 5x
/// slower than the baseline build; 16 lanes vectorise as one zmm (or two ymm) chain on every ISA.
pub(crate) const RED_LANES: usize = 16;

/// An elementwise group being emitted as a row loop.
pub(crate) struct RowLoop<'a> {
    pub(crate) nodes: &'a [NodeId],
    pub(crate) members: BTreeSet<NodeId>,
    pub(crate) outputs: BTreeSet<NodeId>,
    pub(crate) sp: Space,
    pub(crate) s: RowSchedule,
}

/// Whether member `m` is a max reduction.
pub(crate) fn is_max_reduce(g: &Graph, m: NodeId) -> bool {
    matches!(g.node(m).op, Op::Reduce { kind: ReduceKind::Max, .. })
}

/// The row loop of an elementwise group: each block takes a range of rows of its space.
pub(crate) fn gen_rows(em: &mut Emitter, grp: &Group, body: &mut Code) -> Work {
    let g = em.g;
    let space = space_of(g, &grp.nodes).expect("planner checked the space");
    let members: BTreeSet<NodeId> = grp.nodes.iter().copied().collect();
    let s = schedule_rows(g, grp, &space, &members);
    let mut sp = Space { tag: "x", shape: space.clone(), accesses: BTreeMap::new() };
    access_operands(em, &mut sp, grp.nodes.iter().copied(), &members);
    let em: &Emitter = em;
    let outputs = grp.outputs.iter().copied().collect();
    let rl = RowLoop { nodes: &grp.nodes, members, outputs, sp, s };
    let r_expr = em.dim(&numel(&space[..space.len() - 1]));
    let n_expr = em.dim(space.last().unwrap());
    body.line(format!("const int64_t R = {r_expr}, N = {n_expr};"));
    body.line(
        "const int64_t r0 = block * t->rows_per_block, r1 = af_min64(R, r0 + t->rows_per_block);",
    );
    for (m, k) in &rl.s.rowbuf {
        body.line(format!(
            "float *rb{} = scratch + (int64_t){k} * N; /* {} */",
            m.0,
            g.node(*m).name
        ));
    }
    for m in rl.nodes.iter().filter(|m| matches!(g.node(**m).op, Op::CacheWrite { .. })) {
        let cache = em.buf[&g.node(*m).inputs[0]];
        body.line(format!(
            "(void)in{cache}; /* the cache, written in place through out{} */",
            em.buf[m]
        ));
    }
    body.block("for (int64_t r = r0; r < r1; ++r)", |c| {
        em.row_prologue(&rl.sp, "r", c);
        cache_rows(em, &rl, c);
        for p in 0..rl.s.n_loops {
            row_values(em, &rl, p, c);
            column_loop(em, &rl, p, c);
        }
        row_values(em, &rl, rl.s.n_loops, c);
    });
    Work::Rows {
        rows: numel(&space[..space.len() - 1]),
        n: space.last().unwrap().clone(),
        row_buffers: rl.s.rowbuf.len() as u32,
    }
}

/// Where full-width output `m` stores column `c` of row `r`: its own row, or for a cache write
/// the cache row of `cache_rows`.
fn store_at(g: &Graph, m: NodeId) -> String {
    match g.node(m).op {
        Op::CacheWrite { .. } => format!("cw{} + c", m.0),
        _ => "r * N + c".into(),
    }
}

/// The cache row (`cw<m>`) each cache-write member stores row `r` at: the row's indices with
/// the write's axis moved by the call's position.
fn cache_rows(em: &Emitter, rl: &RowLoop, c: &mut Code) {
    let g = em.g;
    for &m in rl.nodes {
        if let Ok(w) = crate::kernels::cache_write::Write::at(g, m) {
            c.line(format!("const int64_t cw{} = {};", m.0, w.cache_row(g, &|d| em.dim(d))));
        }
    }
}

/// The row values ready at `lvl` (reduction results and what is computed from them), stored
/// when they are outputs.
pub(crate) fn row_values(em: &Emitter, rl: &RowLoop, lvl: usize, c: &mut Code) {
    let g = em.g;
    for &m in rl.nodes {
        if rl.s.level.get(&m) != Some(&lvl) {
            continue;
        }
        let n = g.node(m);
        if let Op::Reduce { .. } = n.op {
            c.line(reduce_result(em, m, "N"));
        } else {
            c.line(member_def(em, &rl.sp, &rl.members, &|x| Some(em.var(x)), m, "0"));
        }
        if rl.outputs.contains(&m) {
            c.line(store_out(em, m, "r"));
        }
    }
}

/// The value of reduction member `m` once its partials are joined (`acc<m>`) over `cols`
/// columns.
pub(crate) fn reduce_result(em: &Emitter, m: NodeId, cols: &str) -> String {
    let n = em.g.node(m);
    let e = match n.op {
        Op::Reduce { kind: ReduceKind::Mean, .. } => format!("acc{} / (float){cols}", m.0),
        _ => format!("acc{}", m.0),
    };
    format!("const float {} = {}; /* {} */", em.var(m), round_to(n.dtype, e), n.name)
}

/// Column loop `p` of a row: the lane partials of its reductions, the loop over the columns,
/// and the joined reduction results.
pub(crate) fn column_loop(em: &Emitter, rl: &RowLoop, p: usize, c: &mut Code) {
    let g = em.g;
    let reds: Vec<NodeId> =
        rl.s.reduce_loop.iter().filter(|(_, lp)| **lp == p).map(|(m, _)| *m).collect();
    lane_partials(g, &reds, c);
    for (&m, _) in rl.s.phase.iter().filter(|(_, lp)| **lp == p) {
        if let Some(init) = cumsum_init(g, m) {
            c.line(init);
        }
    }
    let (lb, lt) = column_bodies(em, rl, p);
    if reds.is_empty() {
        c.block("for (int64_t c = 0; c < N; ++c)", |c| {
            c.line("const int64_t l = 0; (void)l;");
            // The body sits one level deeper than this loop needs, as deep as in the lane
            // loops (the generated code has always been indented so).
            c.indented(|c| {
                c.append(&lt);
            });
        });
    } else {
        lane_loops(g, (p, "N"), &reds, &lb, &lt, c);
        for &m in &reds {
            c.line(format!("const float acc{} = {};", m.0, lane_tree(m, is_max_reduce(g, m))));
        }
    }
}

/// The body of column loop `p` for column `c`, as the lane loop runs it and as the tail runs it.
pub(crate) fn column_bodies(em: &Emitter, rl: &RowLoop, p: usize) -> (Code, Code) {
    let g = em.g;
    // The loop body for column `c`; reductions accumulate into lane `l` of RED_LANES
    // partials, so the sums run as independent chains the compiler can vectorise.
    let (mut lb, mut lt) = (Code::new(), Code::new()); // main loop body, tail body
    for &m in rl.nodes {
        let n = g.node(m);
        let local = |x: NodeId| -> Option<String> {
            if let Some(k) = rl.s.phase.get(&x) {
                if *k < p {
                    return Some(format!("rb{}[c]", x.0));
                }
            }
            Some(em.var(x))
        };
        if rl.s.reduce_loop.get(&m) == Some(&p) {
            let x = operand(em, &rl.sp, &rl.members, &local, n.inputs[0], "c");
            accumulate(g, m, &x, &mut lb, &mut lt);
        } else if rl.s.phase.get(&m) == Some(&p) {
            let mut op = Code::new();
            op.line(member_def(em, &rl.sp, &rl.members, &local, m, "c"));
            if rl.s.rowbuf.contains_key(&m) {
                op.line(format!("rb{}[c] = {};", m.0, em.var(m)));
            }
            if rl.outputs.contains(&m) {
                op.line(store_out(em, m, &store_at(g, m)));
            }
            lb.append(&op);
            lt.append(&op);
        }
    }
    (lb, lt)
}

/// Reduction member `m` taking `x` at column `c` into lane `l` of its partials: the line of
/// the lane loop's body (`lb`) and of the tail's (`lt`).
pub(crate) fn accumulate(g: &Graph, m: NodeId, x: &str, lb: &mut Code, lt: &mut Code) {
    let name = &g.node(m).name;
    if is_max_reduce(g, m) {
        // Maxima go through a lane buffer and a separate max loop: GCC 12 does not
        // vectorise a conditional update of scalarised partials (~3x slower).
        lb.line(format!("tv{}[l] = {x}; /* {name} */", m.0));
        lt.line(format!("{{ const float xv = {x}; accv{0}[l] = xv > accv{0}[l] ? xv : accv{0}[l]; }} /* {name} */", m.0));
    } else {
        lb.line(format!("accv{}[l] += {x}; /* {name} */", m.0));
        lt.line(format!("accv{}[l] += {x}; /* {name} */", m.0));
    }
}

/// The lane partials of reductions `reds`, before their loop.
pub(crate) fn lane_partials(g: &Graph, reds: &[NodeId], c: &mut Code) {
    for &m in reds {
        let init = if is_max_reduce(g, m) { "(-INFINITY)" } else { "0.0f" };
        c.line(format!(
            "float accv{0}[{RED_LANES}] = {{{1}}};",
            m.0,
            vec![init; RED_LANES].join(", ")
        ));
    }
}

/// The lane loop over whole groups of RED_LANES of the `cols` columns (body `lb`), then the
/// remaining columns one by one (body `lt`).
pub(crate) fn lane_loops(
    g: &Graph,
    (p, cols): (usize, &str),
    reds: &[NodeId],
    lb: &Code,
    lt: &Code,
    c: &mut Code,
) {
    c.line(format!("int64_t cb{p} = 0;"));
    let maxes: Vec<NodeId> = reds.iter().copied().filter(|m| is_max_reduce(g, *m)).collect();
    c.block(format!("for (; cb{p} + {RED_LANES} <= {cols}; cb{p} += {RED_LANES})"), |c| {
        for m in &maxes {
            c.line(format!("float tv{}[{RED_LANES}];", m.0));
        }
        c.block(format!("for (int64_t l = 0; l < {RED_LANES}; ++l)"), |c| {
            c.line(format!("const int64_t c = cb{p} + l;"));
            c.append(lb);
        });
        for m in &maxes {
            c.line(format!("for (int64_t l = 0; l < {RED_LANES}; ++l) accv{0}[l] = tv{0}[l] > accv{0}[l] ? tv{0}[l] : accv{0}[l];", m.0));
        }
    });
    c.block_noted(&format!("for (int64_t l = 0; cb{p} + l < {cols}; ++l)"), "tail", |c| {
        c.block("", |c| {
            c.line(format!("const int64_t c = cb{p} + l;"));
            c.append(lt);
        });
    });
}

/// The expression joining the RED_LANES partials of reduction `m`.
pub(crate) fn lane_tree(m: NodeId, max: bool) -> String {
    let v = |k: usize| format!("accv{}[{k}]", m.0);
    // Partial maxima are never NaN (they start at -inf and skip NaN), so a plain max joins them.
    let comb = |x: String, y: String| {
        if max {
            format!("(({x}) > ({y}) ? ({x}) : ({y}))")
        } else {
            format!("({x} + {y})")
        }
    };
    // Pairwise tree over the partials (fixed order: the result does not depend on the ISA).
    let mut level: Vec<String> = (0..RED_LANES).map(v).collect();
    while level.len() > 1 {
        level = level.chunks(2).map(|p| comb(p[0].clone(), p[1].clone())).collect();
    }
    level.pop().unwrap()
}
