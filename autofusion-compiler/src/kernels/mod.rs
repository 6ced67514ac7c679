//! Kernel kinds, one module each. A kind says what a kernel of it may hold (`check`, asked by
//! the planner before it prices a group, so that every group a plan can contain is one the
//! generators emit), its price (`cost`), and its emission for each backend (`host`, `ascend`).
//! Each folder holds the kind's `mod.rs` (the `KernelKind` implementation, legality and
//! whatever schedule its emitters and price share), `cost.rs`, `host.rs` and `ascend.rs`.
//!
//! Adding a kind: a `GroupKind` variant (`group.rs`), a folder here with its implementation,
//! and its line in `KINDS`; its `Work` description (`autofusion-ir/src/abi.rs`) and its
//! DynamicTiling (`autofusion-runtime/src/tiling/`) if it splits work differently from the
//! kinds there. ARCHITECTURE.md lists the files.

pub(crate) mod cache_write;
pub(crate) mod concat;
pub(crate) mod flash;
pub(crate) mod horizontal;
pub(crate) mod matmul;
pub(crate) mod rows;

use crate::abi::Work;
use crate::codegen::ascend::vector::K;
use crate::codegen::ascend::Emitted;
use crate::codegen::emit::{Code, Emitter};
use crate::cost::{Kernel, KernelCost};
use crate::group::GroupKind;
use crate::ir::{Graph, NodeId};
use crate::plan::Group;
use std::collections::BTreeSet;

/// Everything the compiler knows about one kind of kernel.
pub(crate) trait KernelKind: Sync {
    /// The group kind plans record for it.
    fn group_kind(&self) -> GroupKind;
    /// Whether a kernel of this kind holding `members` (around `anchor`, for the kinds that
    /// have one) is one the generators can emit; if not, why.
    fn check(
        &self,
        g: &Graph,
        members: &BTreeSet<NodeId>,
        anchor: Option<NodeId>,
    ) -> Result<(), String>;
    /// Its price at its best feasible tiling on the kernel's target.
    fn cost(&self, k: &Kernel) -> Result<KernelCost, String>;
    /// Host C: writes the kernel function's body; returns the work DynamicTiling splits.
    fn host(&self, em: &mut Emitter, grp: &Group, body: &mut Code) -> Work;
    /// Ascend C: writes the kernel's setup and body into `k`.
    fn ascend(&self, k: &mut K, grp: &Group, name: &str) -> Result<Emitted, String>;
}

/// The registered kinds: one line each.
const KINDS: &[&dyn KernelKind] = &[
    &rows::Rows,
    &matmul::MatMul,
    &concat::Concat,
    &flash::Flash,
    &horizontal::Horizontal,
    &cache_write::CacheWrite,
];

/// Matmul and attention kernels hold their prologues and epilogues in f32 registers next to
/// the products: every member, and every value a member reads, is a float, and no member is a
/// running sum (a rows kernel computes those).
pub(crate) fn in_float_registers(g: &Graph, members: &BTreeSet<NodeId>) -> Result<(), String> {
    for m in members {
        let n = g.node(*m);
        let reads = n.inputs.iter().map(|i| g.node(*i));
        if let Some(v) = std::iter::once(n).chain(reads).find(|v| !v.dtype.is_float()) {
            return Err(format!(
                "`{}` ({}) in a kernel that computes in f32 registers: `{}` is {}",
                n.name,
                n.op.name(),
                v.name,
                v.dtype
            ));
        }
        if matches!(n.op, crate::ir::Op::CumSum { .. }) {
            return Err(format!("cumsum `{}` runs in a rows kernel only", n.name));
        }
    }
    Ok(())
}

/// The kind of kernel a group of `kind` is.
pub(crate) fn of(kind: GroupKind) -> &'static dyn KernelKind {
    *KINDS
        .iter()
        .find(|k| k.group_kind() == kind)
        .expect("every GroupKind is registered in KINDS (tested)")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A matmul kernel's epilogue is elementwise: a reduction after the matmul (the softmax of
    /// attention scores) is not a matmul kernel, whatever rule proposes it.
    #[test]
    fn a_matmul_epilogue_holds_no_reduction() {
        use crate::builder::GraphBuilder;
        use crate::dim::DimExpr;
        use crate::ir::{DType, Op, ReduceKind, UnaryOp};
        let mut b = GraphBuilder::new("g");
        let (s, d) = (DimExpr::sym("S"), DimExpr::constant(8));
        let x = b.param("x", DType::F32, vec![s.clone(), d.clone()]);
        let w = b.param("w", DType::F32, vec![d.clone(), d]);
        let mm = b.op(Op::MatMul, &[x, w], "mm").unwrap();
        let e = b.unary(UnaryOp::Exp, mm, "e").unwrap();
        let m = b.op(Op::Reduce { kind: ReduceKind::Max, axis: 1 }, &[mm], "m").unwrap();
        b.output(e);
        b.output(m);
        let g = b.finish().unwrap();
        let kind = of(GroupKind::MatMul);
        assert!(kind.check(&g, &[mm, e].into_iter().collect(), Some(mm)).is_ok());
        let err = kind.check(&g, &[mm, m].into_iter().collect(), Some(mm)).unwrap_err();
        assert!(err.contains("epilogue"), "{err}");
        assert!(kind.check(&g, &[mm, e].into_iter().collect(), None).is_err(), "no anchor");
    }

    #[test]
    fn every_group_kind_is_registered_once() {
        for kind in GroupKind::ALL {
            let n = KINDS.iter().filter(|k| k.group_kind() == kind).count();
            assert_eq!(n, 1, "{kind:?} registered {n} times");
        }
        assert_eq!(KINDS.len(), GroupKind::ALL.len());
    }
}
