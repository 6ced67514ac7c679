//! Cache-write kernels: Ascend C emission. Each vector core takes rows of the new values
//! and copies them in chunks of `CH` columns through UB into the cache at the call's
//! position (`DataCopyPad` both ways, as Huawei's reshape_and_cache does: destinations are
//! distinct rows, so no atomics and no cross-core sync; attention is a later kernel).

use super::Write;
use crate::abi::Work;
use crate::codegen::ascend::vector::*;
use crate::codegen::emit::Space;
use crate::plan::Group;
use std::collections::BTreeMap;
use std::fmt::Write as _;

pub(crate) fn gen_cache_write(k: &mut K, grp: &Group) -> Result<Work, String> {
    let g = k.em.g;
    let w = Write::of(g, grp)?;
    let rank = w.space.len();
    let mut sp = Space { tag: "x", shape: w.space.clone(), accesses: BTreeMap::new() };
    let src = k.src(&mut sp, w.new, "0");
    let ob = k.gm(k.em.buf[&w.id]);
    let dtype = g.node(w.id).dtype;
    let _ = writeln!(
        k.setup,
        "const int64_t R = {}, N = {};",
        k.em.dim(&crate::dim::numel(&w.space[..rank - 1])),
        k.em.dim(&w.space[rank - 1]),
    );
    let orow = w.cache_row(g, &|d| k.em.dim(d));
    let q = k.ub.queue("wq".into(), dtype, true);
    let c = &mut k.body;
    c.open("for (int64_t r = aiv; r < R; r += naiv)");
    row_offsets(&k.em, &sp, "r", c);
    let _ = writeln!(
        c,
        "const int64_t orow = {orow}; /* the cache row: the axis moved by the start */"
    );
    c.block_noted("for (int64_t c0 = 0; c0 < N; c0 += CH)", "one chunk of the row", |c| {
        copy_chunk(c, &q, dtype, &src, "", (&ob, "orow"), "N");
    });
    c.close();
    Ok(w.work())
}
