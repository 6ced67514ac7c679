//! Code generators, one module per target.

pub mod ascend;
pub mod c;
