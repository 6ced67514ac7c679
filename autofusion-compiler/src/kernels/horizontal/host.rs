//! Horizontal matmul kernels: host C emission.

use crate::abi::Work;
use crate::codegen::emit::{Code, Emitter};
use crate::ir::NodeId;
use crate::kernels::matmul::host::*;
use crate::plan::Group;
use std::collections::BTreeSet;

/// Several matmuls sharing their A operand in one launch (`qkv_horizontal`): the blocks walk
/// the concatenation of the parts' work units.
pub(crate) fn gen_horizontal(em: &mut Emitter, grp: &Group, body: &mut Code) -> Work {
    let outputs: BTreeSet<NodeId> = grp.outputs.iter().copied().collect();
    body.line("int64_t hoff = 0;");
    let mut parts = Vec::new();
    let mut steps = Vec::new();
    for (anchor, members) in crate::group::horizontal_parts(em.g, &grp.nodes) {
        // The braces scope the part's constants; its code is not indented inside them.
        body.line(format!("{{ /* part: {} */", em.g.node(anchor).name));
        // A horizontal part is one product (`Horizontal::check`).
        let p = gen_matmul_part(em, anchor, &members, &outputs, body);
        steps.push(p.nc_step);
        parts.push((p.batch, p.m, p.n, p.k));
        body.line("hoff += units;");
        body.line("}");
    }
    Work::Horizontal { parts, nc_step: crate::kernels::matmul::common_step(steps) }
}
