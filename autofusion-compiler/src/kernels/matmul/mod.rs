//! Matmul kernels: one matmul with an elementwise prologue on its A operand (applied while A is packed) and an elementwise epilogue (applied while C is stored).

pub(crate) mod ascend;
pub(crate) mod cost;
pub(crate) mod host;
