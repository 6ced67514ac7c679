//! Concat kernels: copies of the inputs into their slices of the output.

pub(crate) mod ascend;
pub(crate) mod host;
