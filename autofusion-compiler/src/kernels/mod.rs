//! Kernel kinds, one module each: what a kernel of the kind may hold, its schedule, its price
//! in the cost model, and its emission for each backend (`host.rs`, `ascend.rs`).

pub(crate) mod concat;
pub(crate) mod flash;
pub(crate) mod horizontal;
pub(crate) mod matmul;
pub(crate) mod rows;
