//! Code generators, one module per target.

pub mod c;
