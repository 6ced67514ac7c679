//! Cache-write kernels: host C emission.

use super::Write;
use crate::abi::Work;
use crate::codegen::emit::{Code, Emitter, Space};
use crate::codegen::host::c::*;
use crate::layout::resolve;
use crate::plan::Group;
use std::collections::BTreeMap;

/// The row loop over the new values: row `r` of them goes to the cache row with the same
/// indices, shifted by the start along the write's axis.
pub(crate) fn gen_cache_write(em: &mut Emitter, grp: &Group, body: &mut Code) -> Work {
    let g = em.g;
    let w = match Write::of(g, grp) {
        Ok(w) => w,
        Err(e) => {
            // `CacheWrite::check` admits no other group: say so in the C if it ever did.
            body.line(format!("#error \"{e}\""));
            return Work::Rows { rows: 1.into(), n: 1.into(), row_buffers: 0 };
        }
    };
    let rank = w.space.len();
    let mut sp = Space { tag: "x", shape: w.space.clone(), accesses: BTreeMap::new() };
    let a = em.access(&mut sp, w.new);
    let em: &Emitter = em;
    let (ob, cache_in) = (em.buf[&w.id], em.buf[&w.cache]);
    body.line(format!("(void)in{cache_in}; /* the cache, written in place through out{ob} */"));
    body.line(format!(
        "const int64_t R = {}, N = {};",
        em.dim(&crate::dim::numel(&w.space[..rank - 1])),
        em.dim(&w.space[rank - 1]),
    ));
    body.line(
        "const int64_t r0 = block * t->rows_per_block, r1 = af_min64(R, r0 + t->rows_per_block);",
    );
    body.block("for (int64_t r = r0; r < r1; ++r)", |c| {
        em.row_prologue(&sp, "r", c);
        // The cache row: the same indices, the write's axis moved by the start.
        c.line(format!("const int64_t orow = {};", w.cache_row(g, &|d| em.dim(d))));
        let src = format!("in{}", em.buf[&resolve(g, w.new).base]);
        let v = load(g.node(w.new).dtype, &src, &format!("ac{a}_row + c * ac{a}_s{}", rank - 1));
        c.block("for (int64_t c = 0; c < N; ++c)", |c| {
            c.line(store(g.node(w.id).dtype, &format!("out{ob}"), "orow + c", &v));
        });
    });
    w.work()
}
