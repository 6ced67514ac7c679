//! Horizontal matmul kernels: sibling matmuls reading one A operand, launched as one kernel (`qkv_horizontal`).

pub(crate) mod cost;
pub(crate) mod host;
