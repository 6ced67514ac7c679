//! `layout_store`: a copy that materialises a permutation of a kernel's output (the attention
//! output's `merge_heads`: `[B, H, S, dh]` transposed to `[B, S, H, dh]` before the reshape
//! to `[B, S, D]`) is written by that kernel, each output row stored straight at its place in
//! the copy's layout. The permuted value is never stored and the copy kernel disappears.
//!
//! Only permutations that keep the last axis last qualify, so every stored row stays
//! contiguous; only kernels whose generators store through `codegen::emit::RowStore` take it
//! (flash attention today).

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
        wa.kind == GroupKind::FlashAttention
            && wb.members.len() == 1
            && wa.anchor.is_some_and(|v| layout_store(p.g, &p.users, v, &wb.members).is_some())
    }
    fn check_pair(
        &self,
        p: &Planner,
        a: usize,
        _b: usize,
    ) -> Result<(GroupKind, Option<NodeId>), (Reason, String)> {
        let wa = p.w(a);
        match wa.anchor {
            Some(v) if !p.is_output[v.idx()] => Ok((wa.kind, Some(v))),
            _ => Err((Reason::OtherUsers, "the permuted value is also a graph output".into())),
        }
    }
}
