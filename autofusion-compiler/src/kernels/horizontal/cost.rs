//! Horizontal matmul kernels: the cost model's price.

use crate::cost::*;
use crate::group::GroupKind;

/// Sibling matmuls in one launch: each part at its own best tiling, one launch.
pub(crate) fn horizontal_cost(k: &Kernel) -> Result<KernelCost, String> {
    let g = k.g;
    let users = k.users;
    let members = k.members;
    let target = k.target;
    let est = k.est;
    // One launch running every part's tiles; each part keeps its own best tiling.
    let parts = crate::group::horizontal_parts(g, &members.iter().copied().collect::<Vec<_>>());
    let mut total: Option<KernelCost> = None;
    for (anchor, part) in parts {
        let c = kernel_cost(g, users, &part, GroupKind::MatMul, Some(anchor), target, est)?;
        total = Some(match total {
            None => c,
            Some(t) => KernelCost {
                time_us: t.time_us + c.time_us - c.launch_us,
                mem_us: t.mem_us + c.mem_us,
                compute_us: t.compute_us + c.compute_us,
                wave_efficiency: t.wave_efficiency.min(c.wave_efficiency),
                bytes: t.bytes + c.bytes,
                llc_bytes: t.llc_bytes + c.llc_bytes,
                flops: t.flops + c.flops,
                onchip: t
                    .onchip
                    .iter()
                    .zip(&c.onchip)
                    .map(|(x, y)| (x.0.clone(), x.1.max(y.1)))
                    .collect(),
                unconstrained_exec_us: t.unconstrained_exec_us + c.unconstrained_exec_us,
                ..t
            },
        });
    }
    total.ok_or_else(|| "a horizontal group without matmuls".to_string())
}
