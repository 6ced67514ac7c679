//! Cache-write kernels: the new rows of a KV cache (`Op::CacheWrite`) copied into the state
//! parameter in place, at the call's position. The kernel writes only the S new rows; its
//! result is the cache itself (the runtime places it at the state parameter's memory), which
//! later kernels read through views.

pub(crate) mod ascend;
pub(crate) mod host;

use super::KernelKind;
use crate::abi::Work;
use crate::codegen::ascend::vector::K;
use crate::codegen::ascend::Emitted;
use crate::codegen::emit::{Code, Emitter};
use crate::cost::{Kernel, KernelCost};
use crate::dim::{numel, DimExpr, Shape};
use crate::group::GroupKind;
use crate::ir::{Graph, NodeId, Op};
use crate::plan::Group;
use std::collections::BTreeSet;

/// A write of new rows into a cache kept between calls.
pub(crate) struct CacheWrite;

impl KernelKind for CacheWrite {
    fn group_kind(&self) -> GroupKind {
        GroupKind::CacheWrite
    }
    fn check(
        &self,
        g: &Graph,
        members: &BTreeSet<NodeId>,
        _anchor: Option<NodeId>,
    ) -> Result<(), String> {
        match members.iter().map(|m| &g.node(*m).op).collect::<Vec<_>>()[..] {
            [Op::CacheWrite { .. }] => Ok(()),
            _ => Err("a cache-write kernel holds one cache_write and nothing else".into()),
        }
    }
    fn cost(&self, k: &Kernel) -> Result<KernelCost, String> {
        // Priced as a rows kernel over the new rows: each read once and written once.
        crate::kernels::rows::cost::rows_cost(k)
    }
    fn host(&self, em: &mut Emitter, grp: &Group, body: &mut Code) -> Work {
        host::gen_cache_write(em, grp, body)
    }
    fn ascend(&self, k: &mut K, grp: &Group, _name: &str) -> Result<Emitted, String> {
        Ok(Emitted::vector(ascend::gen_cache_write(k, grp)?))
    }
}

/// What both generators need of a cache write: the write's node, its cache and new rows, the
/// axis and start, and the new rows' shape (the space the kernel walks).
pub(crate) struct Write {
    pub(crate) id: NodeId,
    pub(crate) cache: NodeId,
    pub(crate) new: NodeId,
    pub(crate) axis: usize,
    pub(crate) start: DimExpr,
    pub(crate) space: Shape,
}

impl Write {
    pub(crate) fn of(g: &Graph, grp: &Group) -> Result<Write, String> {
        let id = grp.nodes[0];
        let n = g.node(id);
        let Op::CacheWrite { axis, start } = &n.op else {
            return Err(format!("cache-write kernel of `{}` ({})", n.name, n.op.name()));
        };
        let (cache, new) = (n.inputs[0], n.inputs[1]);
        let space = g.node(new).shape.clone();
        Ok(Write { id, cache, new, axis: *axis, start: start.clone(), space })
    }
    /// The elements of the cache (contiguous) between consecutive indices of axis `d`.
    pub(crate) fn cache_stride(&self, g: &Graph, d: usize) -> DimExpr {
        numel(&g.node(self.cache).shape[d + 1..])
    }
    /// The rows of the new values and their length.
    pub(crate) fn work(&self) -> Work {
        let r = self.space.len();
        Work::Rows {
            rows: numel(&self.space[..r - 1]),
            n: self.space[r - 1].clone(),
            row_buffers: 0,
        }
    }
}
