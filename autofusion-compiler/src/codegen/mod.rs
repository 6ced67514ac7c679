//! Code generators, one module per target.

pub mod c;
pub mod ascend;
