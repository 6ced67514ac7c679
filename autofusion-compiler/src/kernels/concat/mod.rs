//! Concat kernels: copies of the inputs into their slices of the output.

pub(crate) mod ascend;
pub(crate) mod host;

use super::KernelKind;
use crate::abi::Work;
use crate::codegen::ascend::vector::K;
use crate::codegen::ascend::Emitted;
use crate::codegen::emit::{Code, Emitter};
use crate::cost::{Kernel, KernelCost};
use crate::group::GroupKind;
use crate::ir::{Graph, NodeId, Op};
use crate::plan::Group;
use std::collections::BTreeSet;

/// A concatenation: each input copied into its slice of the output.
pub(crate) struct Concat;

impl KernelKind for Concat {
    fn group_kind(&self) -> GroupKind {
        GroupKind::Concat
    }
    fn check(
        &self,
        g: &Graph,
        members: &BTreeSet<NodeId>,
        _anchor: Option<NodeId>,
    ) -> Result<(), String> {
        match members.iter().map(|m| &g.node(*m).op).collect::<Vec<_>>()[..] {
            [Op::Concat { .. }] => Ok(()),
            _ => Err("a concat kernel holds one concat and nothing else".into()),
        }
    }
    fn cost(&self, k: &Kernel) -> Result<KernelCost, String> {
        // Priced as a rows kernel over the output: each row read and written once.
        crate::kernels::rows::cost::rows_cost(k)
    }
    fn host(&self, em: &mut Emitter, grp: &Group, body: &mut Code) -> Work {
        host::gen_concat(em, grp, body)
    }
    fn ascend(&self, k: &mut K, grp: &Group, _name: &str) -> Result<Emitted, String> {
        Ok(Emitted::vector(ascend::gen_concat(k, grp)))
    }
}
