//! `layout_store`: a copy that materialises a permutation of a kernel's output (the attention
//! output's `merge_heads`: `[B, H, S, dh]` transposed to `[B, S, H, dh]` before the reshape
//! to `[B, S, D]`) is written by that kernel, each output row stored straight at its place in
//! the copy's layout. The permuted value is never stored and the copy kernel disappears.
//!
//! Only permutations that keep the last axis last qualify, so every stored row stays
//! contiguous; only kernels whose generators store through `codegen::emit::RowStore` take it
//! (flash attention today).
//!
//! A cache write is the other copy a kernel can store straight into: the new keys a rows
//! kernel computes (RoPE's rotation) are written at their cache rows, at the call's position,
//! instead of to a buffer the cache-write kernel then copies. A matmul kernel whose epilogue
//! computes in the heads' view of its product (`group::NaturalSplit`) stores them the same
//! way: K after RoPE, or V's product as it is.

use super::{FusionRule, Rule};
use crate::group::{layout_store, GroupKind};
use crate::ir::NodeId;
use crate::plan::planner::Planner;
use crate::plan::Reason;

pub(in crate::plan) struct LayoutStore;

impl FusionRule for LayoutStore {
    fn rule(&self) -> Rule {
        Rule::LayoutStore
    }
    fn claims(&self, p: &Planner, a: usize, b: usize) -> bool {
        let (wa, wb) = (p.w(a), p.w(b));
        let permuted = wa.kind == GroupKind::FlashAttention
            && wb.members.len() == 1
            && wa.anchor.is_some_and(|v| layout_store(p.g, &p.users, v, &wb.members).is_some());
        permuted || cache_store(p, a, b).is_some()
    }
    fn check_pair(
        &self,
        p: &Planner,
        a: usize,
        b: usize,
    ) -> Result<(GroupKind, Option<NodeId>), (Reason, String)> {
        let wa = p.w(a);
        if let Some(new) = cache_store(p, a, b) {
            let only = p.users[new.idx()].len() == 1;
            return if only && !p.is_output[new.idx()] {
                Ok((wa.kind, wa.anchor))
            } else {
                Err((Reason::OtherUsers, format!("{new} is also read elsewhere")))
            };
        }
        match wa.anchor {
            Some(v) if !p.is_output[v.idx()] => Ok((wa.kind, Some(v))),
            _ => Err((Reason::OtherUsers, "the permuted value is also a graph output".into())),
        }
    }
}

/// The new rows `new` when group `b` is one cache write of rows that group `a` computes: an
/// elementwise group's member, or in a matmul kernel's epilogue (RoPE's rotation in the K
/// projection's epilogue, or V's product itself seen as heads: a natural split of it).
fn cache_store(p: &Planner, a: usize, b: usize) -> Option<NodeId> {
    let (wa, wb) = (p.w(a), p.w(b));
    let w = *wb.members.iter().next()?;
    let n = p.g.node(w);
    let new = *n.inputs.get(1)?;
    let in_epilogue = || {
        let base = crate::layout::resolve(p.g, new).base;
        wa.members.contains(&new)
            || wa.members.contains(&base) && crate::group::natural_split(p.g, base, new).is_some()
    };
    let ok = wb.kind == GroupKind::CacheWrite
        && wb.members.len() == 1
        && matches!(n.op, crate::ir::Op::CacheWrite { .. })
        && match wa.kind {
            GroupKind::Elementwise => wa.members.contains(&new),
            GroupKind::MatMul | GroupKind::Horizontal => in_epilogue(),
            _ => false,
        };
    ok.then_some(new)
}
