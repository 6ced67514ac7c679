//! Runtime errors: every message names the graph, the parameter and the shapes involved.

use std::fmt;

#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// A call with the wrong number of inputs.
    Arity { graph: String, expected: usize, got: usize },
    /// An input of the wrong dtype.
    DType { graph: String, param: String, expected: String, got: String },
    /// An input whose shape does not match its declaration.
    Shape { graph: String, param: String, expected: String, got: Vec<usize> },
    /// Two inputs binding one dynamic dim to different values.
    DimConflict {
        graph: String,
        dim: String,
        first: i64,
        first_param: String,
        second: i64,
        second_param: String,
    },
    /// Dims that cannot be bound or evaluated.
    Dims { graph: String, msg: String },
    /// Tensor data of the wrong length.
    DataLen { shape: Vec<usize>, expected: usize, got: usize },
    /// A tensor operation that cannot apply.
    Tensor { op: String, dtype: String, msg: String },
    /// A device that cannot run the call.
    Device { device: String, msg: String },
    /// A generated module that cannot be loaded or run.
    Module { symbol: String, msg: String },
    /// A call that would need more memory than the limit (`bytes` is `None` when the size
    /// overflows): checked before anything is allocated.
    Memory { graph: String, dims: String, bytes: Option<usize>, largest: String, limit: usize },
    /// An allocation the allocator refused.
    Alloc { graph: String, what: String, bytes: usize },
    /// A weight that cannot be read from its model file, or differs from what was built.
    Weights { file: String, weight: String, msg: String },
    /// An index (a token id) outside the table it indexes: found before anything is read.
    Index { graph: String, param: String, at: usize, index: i64, table: String, size: i64 },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Arity { graph, expected, got } => {
                write!(f, "`{graph}` takes {expected} inputs, got {got}")
            }
            Error::DType { graph, param, expected, got } => {
                write!(f, "`{graph}`: parameter `{param}` has dtype {got}, expected {expected}")
            }
            Error::Shape { graph, param, expected, got } => {
                write!(f, "`{graph}`: parameter `{param}` has shape {got:?}, expected {expected}")
            }
            Error::DimConflict { graph, dim, first, first_param, second, second_param } => write!(
                f,
                "`{graph}`: dim `{dim}` is {first} from parameter `{first_param}` but {second} \
                 from parameter `{second_param}`"
            ),
            Error::Dims { graph, msg } => write!(f, "`{graph}`: {msg}"),
            Error::Weights { file, weight, msg } => write!(f, "{file}: weight `{weight}`: {msg}"),
            Error::Index { graph, param, at, index, table, size } => write!(
                f,
                "`{graph}`: `{param}` holds {index} at element {at}, outside `{table}`, which has \
                 {size} rows (valid: {} ..= {})",
                -size,
                size - 1
            ),
            Error::DataLen { shape, expected, got } => {
                write!(f, "tensor of shape {shape:?} needs {expected} elements, got {got}")
            }
            Error::Tensor { op, dtype, msg } => write!(f, "cannot {op} a {dtype} tensor: {msg}"),
            Error::Device { device, msg } => write!(f, "device {device}: {msg}"),
            Error::Module { symbol, msg } => write!(f, "kernel module `{symbol}`: {msg}"),
            Error::Memory { graph, dims, bytes, largest, limit } => {
                let need = bytes.map_or("more than 2^64 bytes".into(), crate::memory::human);
                write!(
                    f,
                    "`{graph}` with {dims}: the call needs {need} ({largest}), over the memory \
                     limit of {} (AUTOFUSION_MEMORY_LIMIT or Module::set_memory_limit)",
                    crate::memory::human(*limit)
                )
            }
            Error::Alloc { graph, what, bytes } => write!(
                f,
                "`{graph}`: allocating {} for the {what} failed",
                crate::memory::human(*bytes)
            ),
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;
