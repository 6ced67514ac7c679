//! Flash attention kernels: QK^T, the score chain, an online softmax and PV, with no S x S tensor.

pub(crate) mod ascend;
pub(crate) mod cost;
pub(crate) mod host;
