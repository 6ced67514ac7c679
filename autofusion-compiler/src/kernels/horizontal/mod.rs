//! Horizontal matmul kernels: sibling matmuls reading one A operand, launched as one kernel (`qkv_horizontal`).

pub(crate) mod ascend;
pub(crate) mod cost;
pub(crate) mod host;

use super::KernelKind;
use crate::abi::Work;
use crate::codegen::ascend::vector::K;
use crate::codegen::ascend::Emitted;
use crate::codegen::emit::{Code, Emitter};
use crate::cost::{Kernel, KernelCost};
use crate::group::GroupKind;
use crate::ir::{Graph, NodeId};
use crate::plan::Group;
use std::collections::BTreeSet;

/// Sibling matmuls reading one A operand, each with its prologue and epilogue, in one launch.
pub(crate) struct Horizontal;

impl KernelKind for Horizontal {
    fn group_kind(&self) -> GroupKind {
        GroupKind::Horizontal
    }
    fn check(
        &self,
        g: &Graph,
        members: &BTreeSet<NodeId>,
        _anchor: Option<NodeId>,
    ) -> Result<(), String> {
        let nodes: Vec<NodeId> = members.iter().copied().collect();
        let parts = crate::group::horizontal_parts(g, &nodes);
        if parts.len() < 2 {
            return Err("a horizontal kernel holds at least two matmuls".into());
        }
        // Each part is one product with its own epilogue: an epilogue member reading two
        // parts' products (SwiGLU's mul) is a sibling product's, not a horizontal kernel's.
        let mut epilogues = BTreeSet::new();
        for (anchor, part) in &parts {
            let pro = crate::group::prologue_of(g, *anchor, |m| part.contains(m));
            for m in part.iter().filter(|m| **m != *anchor && !pro.contains(m)) {
                if !epilogues.insert(*m) {
                    return Err(format!(
                        "`{}` is in the epilogue of two matmuls of a horizontal kernel",
                        g.node(*m).name
                    ));
                }
            }
            crate::kernels::matmul::check_part(g, *anchor, part)?;
        }
        let in_parts: BTreeSet<NodeId> =
            parts.iter().flat_map(|(_, p)| p.iter().copied()).collect();
        if let Some(m) = members.iter().find(|m| !in_parts.contains(m)) {
            return Err(format!(
                "`{}` belongs to no matmul of the horizontal kernel",
                g.node(*m).name
            ));
        }
        Ok(())
    }
    fn cost(&self, k: &Kernel) -> Result<KernelCost, String> {
        cost::horizontal_cost(k)
    }
    fn host(&self, em: &mut Emitter, grp: &Group, body: &mut Code) -> Work {
        host::gen_horizontal(em, grp, body)
    }
    fn ascend(&self, k: &mut K, grp: &Group, name: &str) -> Result<Emitted, String> {
        ascend::gen_horizontal(k, grp, name)
    }
}
