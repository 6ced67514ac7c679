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

/// Whether `v` is read by members of `members` only as the cache a cache write writes (its
/// input 0): the kernel then neither reads it nor addresses it in its space.
pub(crate) fn only_written(g: &Graph, members: &BTreeSet<NodeId>, v: NodeId) -> bool {
    let mut readers = members.iter().filter(|m| g.node(**m).inputs.contains(&v)).peekable();
    readers.peek().is_some()
        && readers.all(|m| {
            let n = g.node(*m);
            matches!(n.op, Op::CacheWrite { .. }) && n.inputs[0] == v && n.inputs[1] != v
        })
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
        Write::at(g, grp.nodes[0])
    }
    /// The cache write at node `id`.
    pub(crate) fn at(g: &Graph, id: NodeId) -> Result<Write, String> {
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
    /// The C expression of the cache element where a row of the new values goes: the row's
    /// indices (`x_i<d>`, from the row prologue of a space tagged `x` over the new values)
    /// with the write's axis moved by the start.
    pub(crate) fn cache_row(&self, g: &Graph, dim: &dyn Fn(&DimExpr) -> String) -> String {
        self.cache_row_at(g, dim, &|d| format!("x_i{d}"))
    }
    /// `cache_row` with the index of the new rows' axis `d` named by `index(d)` (an epilogue
    /// walking a permutation of the new rows' space names them after its own axes).
    pub(crate) fn cache_row_at(
        &self,
        g: &Graph,
        dim: &dyn Fn(&DimExpr) -> String,
        index: &dyn Fn(usize) -> String,
    ) -> String {
        let rank = self.space.len();
        let p0 = dim(&self.start);
        let mut terms = Vec::new();
        for d in 0..rank - 1 {
            let shift = if d == self.axis { format!(" + ({p0})") } else { String::new() };
            terms.push(format!("({}{shift}) * ({})", index(d), dim(&self.cache_stride(g, d))));
        }
        if self.axis == rank - 1 {
            terms.push(format!("({p0})"));
        }
        if terms.is_empty() {
            "0".into()
        } else {
            terms.join(" + ")
        }
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
