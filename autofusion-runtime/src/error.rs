//! Runtime errors: every message names the graph, the parameter and the shapes involved.

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum Error {
    #[error("`{graph}` takes {expected} inputs, got {got}")]
    Arity { graph: String, expected: usize, got: usize },
    #[error("`{graph}`: parameter `{param}` has dtype {got}, expected {expected}")]
    DType { graph: String, param: String, expected: String, got: String },
    #[error("`{graph}`: parameter `{param}` has shape {got:?}, expected {expected}")]
    Shape { graph: String, param: String, expected: String, got: Vec<usize> },
    #[error("`{graph}`: dim `{dim}` is {first} from parameter `{first_param}` but {second} from parameter `{second_param}`")]
    DimConflict {
        graph: String,
        dim: String,
        first: i64,
        first_param: String,
        second: i64,
        second_param: String,
    },
    #[error("`{graph}`: {msg}")]
    Dims { graph: String, msg: String },
    #[error("tensor of shape {shape:?} needs {expected} elements, got {got}")]
    DataLen { shape: Vec<usize>, expected: usize, got: usize },
    #[error("cannot {op} a {dtype} tensor: {msg}")]
    Tensor { op: String, dtype: String, msg: String },
    #[error("device {device}: {msg}")]
    Device { device: String, msg: String },
    #[error("kernel module `{symbol}`: {msg}")]
    Module { symbol: String, msg: String },
}

pub type Result<T> = std::result::Result<T, Error>;
