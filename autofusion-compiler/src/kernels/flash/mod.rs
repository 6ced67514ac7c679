//! Flash attention kernels: QK^T, the score chain, an online softmax and PV, with no S x S tensor.

pub(crate) mod ascend;
pub(crate) mod cost;
pub(crate) mod host;

use super::KernelKind;
use crate::abi::Work;
use crate::codegen::ascend::vector::K;
use crate::codegen::ascend::Emitted;
use crate::codegen::emit::{Code, Emitter};
use crate::cost::{Kernel, KernelCost};
use crate::dim::DimExpr;
use crate::group::GroupKind;
use crate::ir::{Graph, NodeId};
use crate::layout::{resolve, space_strides};
use crate::plan::Group;
use std::collections::BTreeSet;

/// QK^T, the score chain, an online softmax and PV in one kernel.
pub(crate) struct Flash;

impl KernelKind for Flash {
    fn group_kind(&self) -> GroupKind {
        GroupKind::FlashAttention
    }
    fn check(
        &self,
        g: &Graph,
        members: &BTreeSet<NodeId>,
        _anchor: Option<NodeId>,
    ) -> Result<(), String> {
        crate::kernels::in_float_registers(g, members)?;
        crate::group::flash_parts(g, members)
            .map(|_| ())
            .ok_or_else(|| "the members are not one attention pattern".into())
    }
    fn cost(&self, k: &Kernel) -> Result<KernelCost, String> {
        cost::flash_cost(k)
    }
    fn host(&self, em: &mut Emitter, grp: &Group, body: &mut Code) -> Work {
        host::gen_flash(em, grp, body)
    }
    fn ascend(&self, k: &mut K, grp: &Group, _name: &str) -> Result<Emitted, String> {
        let (work, stage_a, stage_b, qk, pv) = ascend::gen_flash(k, grp);
        let cube_bytes = vec![qk.size() as u32, pv.size() as u32];
        Ok(Emitted { work, mix: true, cube: 2, stage_a, stage_b, cube_bytes })
    }
}

/// The extent of the trailing batch axes over which K^T (`kt`) and V are both broadcast: the
/// query heads sharing one KV head in grouped-query attention (1 when there are none). The
/// host kernel's few-queries path computes them in one unit, reading K and V once.
pub(crate) fn kv_group(g: &Graph, kt: NodeId, v: NodeId, batch: &[DimExpr]) -> DimExpr {
    let rank = batch.len() + 2;
    let strides = |x: NodeId| space_strides(&resolve(g, x), &g.node(x).shape, rank);
    let (sk, sv) = (strides(kt), strides(v));
    let mut group = DimExpr::constant(1);
    for a in (0..batch.len()).rev() {
        if sk[a].as_const() != Some(0) || sv[a].as_const() != Some(0) {
            break;
        }
        group = group.mul(&batch[a]);
    }
    group
}
